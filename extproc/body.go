package extproc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// pathKind says what a request path's body holds for the picker.
type pathKind int

const (
	// pathUnknown: a path the picker has no schema for; the model is read
	// when the body is JSON and carries one, nothing is required.
	pathUnknown pathKind = iota
	// pathNone: no path seen (NGINX Gateway Fabric's shim sends no
	// pseudo-headers); the body is taken to be an OpenAI request.
	pathNone
	pathCompletions
	pathChat
	// pathModelOnly: /v1/responses, /v1/embeddings: only the model matters.
	pathModelOnly
)

func classifyPath(path string) pathKind {
	if path == "" {
		return pathNone
	}
	for i := 0; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			path = path[:i]
			break
		}
	}
	for len(path) > 1 && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	switch path {
	case "/v1/completions":
		return pathCompletions
	case "/v1/chat/completions":
		return pathChat
	case "/v1/responses", "/v1/embeddings":
		return pathModelOnly
	}
	return pathUnknown
}

// strict reports whether a body on this path must be a JSON object with a model.
func (k pathKind) strict() bool { return k != pathUnknown }

// hasPrompt reports whether the picker reads a prompt for this path.
func (k pathKind) hasPrompt() bool {
	return k == pathCompletions || k == pathChat || k == pathNone
}

// reads reports whether the picker reads the top-level member key on this
// path (the others are skimmed once the prompt is full).
func (k pathKind) reads(key string) bool {
	switch key {
	case "model", "stream":
		return true
	case "prompt":
		return k == pathCompletions || k == pathNone
	case "messages":
		return k == pathChat || k == pathNone
	}
	return false
}

// requestBody is what the picker reads from an OpenAI request body.
type requestBody struct {
	Model string
	// modelStart and modelEnd delimit the model value (quotes included) in
	// the body, so a rewrite touches nothing else.
	modelStart, modelEnd int
	hasModel             bool
	// Prompt is the raw JSON of the chat messages array (from its '[') or of
	// the completion prompt value (a string with its quotes, or an array),
	// cut at the prompt limit. It is a slice of the body, not a copy: the
	// body must not change while it is in use.
	Prompt []byte
	Stream bool
	// skimmed are the byte ranges that were only skimmed, not validated: a
	// defect inside one goes unnoticed (the fuzz test holds the parser to
	// that, and nothing else).
	skimmed []span
}

// span is a byte range [start, end) of the body.
type span struct{ start, end int }

// bodyError is a request body the picker cannot read; it maps to a 400.
type bodyError struct {
	msg string
	// truncated: the defect is that the body ends here; more of it may
	// still come (bodyScanner).
	truncated bool
	// want, for a body that ends early, is what was to come; the message
	// is made only when asked for, as a body read as it arrives runs out
	// a few times per request and the error is then dropped.
	want string
}

func isTruncation(err error) bool {
	be, ok := err.(*bodyError)
	return ok && be.truncated
}

func (e *bodyError) Error() string {
	if e.want != "" {
		return "invalid JSON: unexpected end of body, want " + e.want
	}
	return e.msg
}

func badBody(format string, args ...any) error { return &bodyError{msg: fmt.Sprintf(format, args...)} }

// maxJSONDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxJSONDepth = 512

// parseRequestBody extracts model, prompt (completions) or messages (chat),
// and stream in one pass. The prompt is the value's JSON encoding as the
// client sent it, up to promptLimit bytes (the scheduler reads no more),
// sliced from body without copying or unescaping: the prefix-cache scorer
// only hashes it, and what prefix caching needs is that requests sharing a
// conversation prefix share prompt bytes, which holds for clients that
// serialize the same messages the same way. Different serializations of
// the same text (key order, escapes, spacing) hash differently, so they do
// not share cache entries; rendering the text would cost a copy of every
// prompt to catch that rare case.
//
// Everything the picker reads is validated: the top-level object and all
// its keys (model or stream may come after a huge messages array), model,
// stream, and the prompt up to the limit; so are the other values until the
// prompt is full. Once it is (at once for paths that carry no prompt, or a
// limit of 0), the rest of the prompt and any other value are only skimmed:
// strings end at the next quote preceded by an even number of backslashes,
// arrays and objects at the bracket that closes them. That is the point of
// the limit: a 64 KiB prompt costs what its used 16 KiB cost, not a full
// validation. The trade-off: a body whose only defect lies in skimmed bytes
// (a bad escape, a control byte, a bad number inside a skimmed array) is
// forwarded unchanged and the model server rejects it. A body that is not a
// JSON object, ends inside a value (truncated), or has no string model is
// still a 400. For pathUnknown a non-JSON body is not an error: the result
// is simply empty.
func parseRequestBody(body []byte, kind pathKind, promptLimit int) (*requestBody, error) {
	sc := newBodyScanner(kind, promptLimit)
	sc.feed(body, true)
	return sc.result(body)
}

// bodyScanner is parseRequestBody for a body that arrives in pieces: feed
// it the body so far after each piece (each call's bytes extend the last
// call's) and it resumes where the previous call ran out, so the work of
// reading the body is done while it arrives and, when the last piece
// comes, only that piece is left to read. It reads the same bytes in the
// same order as a single call on the whole body, so its result and errors
// are the same; a defect is found as soon as its bytes are in.
type bodyScanner struct {
	kind  pathKind
	limit int
	out   requestBody
	// promptStart and promptEnd delimit the prompt (already cut at limit)
	// in the body, when hasPrompt; offsets, because the buffer holding the
	// body may move as it grows.
	promptStart, promptEnd int
	hasPrompt              bool
	// promptDone: everything the picker wants from values other than model
	// and stream has been read, so those can be skimmed.
	promptDone bool

	step scanStep
	// i is where step resumes.
	i int
	// During stepSkim: where the skim is, and where it began.
	skim      skimState
	skimStart int
	keyBuf    []byte // unescaped keys
	// err is the first defect found; the scanner stops there.
	err error
	// closed: the top-level object is complete, and only whitespace has
	// followed so far.
	closed bool
}

// scanStep is where the scanner is in the top-level object.
type scanStep int

const (
	// stepOpen: before the top-level '{' (and the first key, or '}').
	stepOpen scanStep = iota
	// stepMember: at a member's key; the member is read whole or, when the
	// body runs out inside it, read again from its key once it has grown.
	stepMember
	// stepSkim: inside a skimmed value (or a prompt's skimmed tail), which
	// resumes where it ran out: values skimmed are the long ones.
	stepSkim
	// stepAfterValue: after a member's value, at its ',' or '}'.
	stepAfterValue
	// stepClosed: after the top-level object; only whitespace may follow.
	stepClosed
)

func newBodyScanner(kind pathKind, promptLimit int) *bodyScanner {
	promptLimit = max(promptLimit, 0)
	return &bodyScanner{kind: kind, limit: promptLimit, promptDone: promptLimit == 0 || !kind.hasPrompt()}
}

// feed reads on in b, the body so far; final says no more bytes will come.
// It reports the first defect (always a *bodyError), which is final: feed
// does nothing after it.
func (sc *bodyScanner) feed(b []byte, final bool) error {
	if sc.err != nil {
		return sc.err
	}
	for {
		ranOut, err := sc.advance(b, final)
		if err != nil {
			if final || !isTruncation(err) {
				sc.err = err
				return err
			}
			return nil // the rest of the member is not in yet
		}
		if ranOut {
			return nil
		}
	}
}

// result is what the scanner read once the whole body b was fed with final
// set; an error is the body's defect (a 400). For pathUnknown a body that
// is not a JSON object is no error: the result is empty.
func (sc *bodyScanner) result(b []byte) (*requestBody, error) {
	if sc.err == nil && !sc.closed {
		sc.err = syntaxErr(b, len(b), "more of the body") // fed without final
	}
	if sc.err != nil {
		if !sc.kind.strict() {
			return &requestBody{}, nil
		}
		return nil, sc.err
	}
	if !sc.out.hasModel && sc.kind.strict() {
		return nil, badBody(`request body has no "model" field`)
	}
	out := sc.out
	if sc.hasPrompt {
		// Capped so that no append can write into the body.
		out.Prompt = b[sc.promptStart:sc.promptEnd:sc.promptEnd]
	}
	return &out, nil
}

// advance takes one step; ranOut means it needs more of the body (or, with
// final, that the body is done). A truncation error when not final means
// the step is to be taken again, from where it began, once b has grown.
func (sc *bodyScanner) advance(b []byte, final bool) (ranOut bool, err error) {
	switch sc.step {
	case stepOpen:
		i := skipWS(b, 0)
		if i >= len(b) {
			if final {
				return true, badBody("request body is empty, want a JSON object")
			}
			return true, nil
		}
		if b[i] != '{' {
			return true, badBody("request body is not a JSON object (starts with %q at offset %d)", b[i], i)
		}
		i = skipWS(b, i+1)
		switch {
		case i >= len(b):
			return true, syntaxErr(b, i, "object key")
		case b[i] == '}':
			sc.step, sc.i, sc.closed = stepClosed, i+1, true
		default:
			sc.step, sc.i = stepMember, i
		}
		return false, nil
	case stepMember:
		return false, sc.member(b, final)
	case stepSkim:
		end, done := sc.skim.run(b, sc.i)
		if !done {
			sc.i = end
			if final {
				return true, sc.skim.err(b)
			}
			return true, nil
		}
		sc.out.skimmed = append(sc.out.skimmed, span{sc.skimStart, end})
		sc.step, sc.i = stepAfterValue, end
		return false, nil
	case stepAfterValue:
		next, more, err := nextMember(b, sc.i, '}')
		if err != nil {
			return true, err
		}
		if more {
			sc.step, sc.i = stepMember, next
		} else {
			sc.step, sc.i, sc.closed = stepClosed, next, true
		}
		return false, nil
	}
	// stepClosed
	i := skipWS(b, sc.i)
	if i != len(b) {
		sc.closed = false
		return true, badBody("invalid JSON: data after the top-level object at offset %d", i)
	}
	sc.i = i
	return true, nil
}

// member reads the member at sc.i: its key, then its value, which is read
// as the prompt, skimmed, or validated (and recorded when the picker reads
// it).
func (sc *bodyScanner) member(b []byte, final bool) error {
	// Whitespace before the key may have come after the step was set.
	i := skipWS(b, sc.i)
	if i >= len(b) || b[i] != '"' {
		return syntaxErr(b, i, "object key")
	}
	ks := i
	end, escaped, err := scanString(b, i)
	if err != nil {
		return err
	}
	key := b[ks+1 : end-1]
	if escaped {
		// Into a buffer of its own: appending to a slice of b would write
		// over the body, which is forwarded.
		sc.keyBuf, err = appendUnescaped(sc.keyBuf[:0], key)
		if err != nil {
			return err
		}
		key = sc.keyBuf
	}
	i = skipWS(b, end)
	if i >= len(b) || b[i] != ':' {
		return syntaxErr(b, i, "':' after object key")
	}
	vs := skipWS(b, i+1)
	if vs >= len(b) {
		return syntaxErr(b, vs, "a value")
	}
	kind := sc.kind
	k := string(key)
	switch {
	case k == "messages" && (kind == pathChat || kind == pathNone) && b[vs] != '[':
		// Said before the value is read: it may be long, and no more of it
		// can mend this.
		return badBody(`"messages" must be an array`)
	case k == "model" && b[vs] != '"':
		return badBody(`"model" must be a string`)
	case k == "messages" && (kind == pathChat || kind == pathNone),
		k == "prompt" && (kind == pathCompletions || kind == pathNone):
		return sc.prompt(b, vs, k == "messages", final)
	case sc.promptDone && !kind.reads(k) && (b[vs] == '"' || b[vs] == '[' || b[vs] == '{'):
		if b[vs] == '"' {
			sc.skim = skimState{inString: true}
		} else {
			sc.skim = skimState{depth: 1}
		}
		sc.step, sc.i, sc.skimStart = stepSkim, vs+1, vs+1
		return nil
	}
	ve, err := skipValue(b, vs, 1)
	if err != nil {
		return err
	}
	if ve == len(b) && !final {
		// A number may go on in the next piece.
		return syntaxErr(b, ve, "more of the value")
	}
	if err := sc.out.field(k, b[vs:ve], vs, kind); err != nil {
		return err
	}
	sc.step, sc.i = stepAfterValue, ve
	return nil
}

// prompt reads the prompt value at b[vs] (messages: an array of objects):
// validated like skipValue up to the first point at or past vs+limit where
// skimming can take over (before an element or key, or inside a string
// outside an escape), then skimmed to its end. It is cut at limit bytes.
// Until the body holds limit bytes of it (or all of it), reading waits, so
// that the cut is where it would be in the whole body.
func (sc *bodyScanner) prompt(b []byte, vs int, messages, final bool) error {
	c := promptCutter{b: b, stop: vs + sc.limit, messages: messages}
	if sc.limit > len(b)-vs {
		if !final {
			return syntaxErr(b, len(b), "more of the prompt")
		}
		c.stop = len(b) + 1 // never
	}
	end, err := c.value(vs, 1)
	switch {
	case err == errPromptFull:
		sc.promptStart, sc.promptEnd, sc.hasPrompt, sc.promptDone = vs, vs+sc.limit, true, true
		sc.skim = skimState{depth: c.open, inString: c.inString}
		sc.step, sc.i, sc.skimStart = stepSkim, end, end
		return nil
	case err != nil:
		return err
	case end == len(b) && !final:
		return syntaxErr(b, end, "more of the value")
	}
	cut := end
	if end-vs > sc.limit {
		cut = vs + sc.limit
	}
	sc.promptStart, sc.promptEnd, sc.hasPrompt = vs, cut, true
	sc.promptDone = cut-vs >= sc.limit
	sc.step, sc.i = stepAfterValue, end
	return nil
}

// field records one top-level member; later duplicates win, as in encoding/json.
func (r *requestBody) field(key string, raw []byte, offset int, kind pathKind) error {
	switch key {
	case "model":
		if len(raw) == 0 || raw[0] != '"' {
			return badBody(`"model" must be a string`)
		}
		m, err := unquote(raw)
		if err != nil {
			return err
		}
		if !utf8.ValidString(m) {
			// encoding/json would silently turn it into U+FFFD and model
			// servers reject it; a model name must be text.
			return badBody(`"model" is not valid UTF-8`)
		}
		if m == "" && kind.strict() {
			return badBody(`"model" is empty`)
		}
		r.Model, r.hasModel = m, true
		r.modelStart, r.modelEnd = offset, offset+len(raw)
	case "stream":
		r.Stream = string(raw) == "true"
	}
	return nil
}

// promptCutter is skipValue that stops at an offset (stop) with
// errPromptFull, saying how many arrays and objects are open there and
// whether it stopped inside a string, so skim can find the value's end.
type promptCutter struct {
	b        []byte
	stop     int
	messages bool // the value is chat messages: an array of objects
	open     int
	inString bool
}

func (c *promptCutter) full(i, open int, inString bool) (int, error) {
	c.open, c.inString = open, inString
	return i, errPromptFull
}

// value validates the value at b[i], depth deep (the prompt value is 1).
func (c *promptCutter) value(i, depth int) (int, error) {
	b := c.b
	if i >= len(b) {
		return i, syntaxErr(b, i, "a value")
	}
	switch b[i] {
	case '"':
		return c.str(i, depth-1)
	case '[':
		if depth > maxJSONDepth {
			return i, badBody("invalid JSON: nesting deeper than %d", maxJSONDepth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			if i >= c.stop {
				return c.full(i, depth, false)
			}
			if c.messages && depth == 1 && (i >= len(b) || b[i] != '{') {
				if i >= len(b) {
					return i, syntaxErr(b, i, "a value")
				}
				return i, badBody(`each of "messages" must be an object`)
			}
			var err error
			if i, err = c.value(i, depth+1); err != nil {
				return i, err
			}
			var more bool
			if i, more, err = nextMember(b, i, ']'); err != nil || !more {
				return i, err
			}
		}
	case '{':
		if depth > maxJSONDepth {
			return i, badBody("invalid JSON: nesting deeper than %d", maxJSONDepth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= c.stop {
				return c.full(i, depth, false)
			}
			if i >= len(b) || b[i] != '"' {
				return i, syntaxErr(b, i, "object key")
			}
			var err error
			if i, err = c.str(i, depth); err != nil {
				return i, err
			}
			i = skipWS(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, syntaxErr(b, i, "':' after object key")
			}
			i = skipWS(b, i+1)
			if i >= c.stop {
				return c.full(i, depth, false)
			}
			if i, err = c.value(i, depth+1); err != nil {
				return i, err
			}
			var more bool
			if i, more, err = nextMember(b, i, '}'); err != nil || !more {
				return i, err
			}
		}
	}
	return skipValue(b, i, depth)
}

// str validates the string at b[i] (a quote), inside open arrays and objects.
func (c *promptCutter) str(i, open int) (int, error) {
	b := c.b
	// Bytes from stop on are skimmed, not validated: look no further.
	lim := min(len(b), c.stop)
	i++
	for {
		j := validRun(b, i, lim)
		if j >= lim && lim == c.stop {
			// j, at or past stop, is not inside an escape.
			return c.full(j, open, true)
		}
		if j >= len(b) {
			return j, syntaxErr(b, j, "closing '\"'")
		}
		switch b[j] {
		case '"':
			return j + 1, nil
		case '\\':
			n, err := escapeLen(b, j)
			if err != nil {
				return j, err
			}
			i = j + n
		default: // below 0x20
			return j, badBody("invalid JSON at offset %d: control character in string", j)
		}
	}
}

// validRun returns the offset of the first byte at or after b[i], and
// below lim (at most len(b)), that ends a run of plain bytes and two-byte
// escapes: a '"', a byte below 0x20, or a backslash starting any other
// escape (\u, a bad one, or one cut by the end of b). With none, it returns
// where the run's last escape ends, at or past lim. Prompts are plain bytes
// with an escape every few words (\n, \"), so it tests eight bytes at a
// time and reads the escapes it meets without leaving the word.
func validRun(b []byte, i, lim int) int {
	for i+8 <= lim {
		m := exactSpecialMask(binary.LittleEndian.Uint64(b[i:]))
		next := i + 8
		for m != 0 {
			k := i + bits.TrailingZeros64(m)>>3
			m &= m - 1
			if b[k] != '\\' || k+1 >= len(b) || !shortEscape[b[k+1]] {
				return k
			}
			if k+1 < i+8 {
				m &^= 0x80 << (8 * uint(k+1-i)) // the escaped byte is no special
			} else {
				next = k + 2
			}
		}
		i = next
	}
	for i < lim {
		switch c := b[i]; {
		case c == '"' || c < 0x20:
			return i
		case c == '\\':
			if i+1 >= len(b) || !shortEscape[b[i+1]] {
				return i
			}
			i += 2
		default:
			i++
		}
	}
	return i
}

// exactSpecialMask sets the high bit of every byte of w that is '"', '\\'
// or below 0x20, and no other bit (SWAR without borrows between bytes).
func exactSpecialMask(w uint64) uint64 {
	// Per byte, with l its low seven bits: (l ^ '"') + 0x7f, (l ^ '\\') +
	// 0x7f and l + 0x60 each reach bit 7 unless the byte is '"', '\\' or
	// below 0x20 respectively (none carries out of the byte); a byte with
	// bit 7 set is none of them. So the bytes whose bit 7 stays clear in
	// the AND of the three, ORed with w, are the special ones.
	l := w & low7
	plain := ((l ^ (lsb * '"')) + low7) & ((l ^ (lsb * '\\')) + low7) & (l + lsb*0x60)
	return ^(plain | w) & msb
}

// zeroByteBits sets bit 7 of every zero byte of x and clears it in the
// others; the low seven bits of each byte are left to masking with msb,
// once, by the caller.
func zeroByteBits(x uint64) uint64 {
	return ^(((x & low7) + low7) | x)
}

// shortEscape marks the bytes that make a valid two-byte escape after a
// backslash; prompts are full of them (\n, \"), so they are read inline.
var shortEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// errPromptFull stops validating once the prompt is full; the offset
// returned with it is where skimming takes over. It never leaves the parser.
var errPromptFull = &bodyError{msg: "prompt full"}

// skimState is where a skim is: how many arrays and objects are open and
// whether it is inside a string (innermost). A skim does not validate: it
// only finds where strings and brackets end, which is enough to locate the
// next top-level key.
type skimState struct {
	depth    int
	inString bool
}

// run skims b from i, which must not be in the middle of an escape. done:
// end is just past the skimmed value. Otherwise the body ran out and end
// is where to resume once it has grown.
func (s *skimState) run(b []byte, i int) (end int, done bool) {
	if s.inString {
		j, closed := skimString(b, i)
		if !closed {
			return j, false
		}
		i, s.inString = j, false
		if s.depth == 0 {
			return i, true
		}
	}
	for i < len(b) {
		switch b[i] {
		case '"':
			j, closed := skimString(b, i+1)
			if !closed {
				s.inString = true
				return j, false
			}
			i = j
			continue
		case '[', '{':
			s.depth++
		case ']', '}':
			s.depth--
			if s.depth == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return i, false
}

// err is the defect of a body that ends during the skim: it is truncated.
func (s *skimState) err(b []byte) error {
	if s.inString {
		return syntaxErr(b, len(b), "closing '\"'")
	}
	return badBody("invalid JSON: unexpected end of body, want ']' or '}' (%d left open)", s.depth)
}

// skimString returns the offset past the closing quote of the string that
// b[i] is inside of, with closed set; b[i] must not be in the middle of an
// escape. A quote is the closing one when an even number of backslashes
// precede it (each pair is an escaped backslash). When b ends first, the
// offset is where to resume: before the backslashes b ends with, so that
// they are counted with the quote that may follow.
func skimString(b []byte, i int) (int, bool) {
	from := i
	// Quotes come in clusters (escaped quotes in code and dialogue), where
	// bytes.IndexByte's setup outweighs its speed: words of eight bytes are
	// tested in place until a stretch of them holds no quote, then
	// IndexByte takes the long hop.
	quiet := 0
	for {
		var q int
		if quiet < quietWords && i+8 <= len(b) {
			m := exactQuoteMask(binary.LittleEndian.Uint64(b[i:]))
			if m == 0 {
				i += 8
				quiet++
				continue
			}
			quiet = 0
			for {
				q = i + bits.TrailingZeros64(m)>>3
				if closingQuote(b, from, q) {
					return q + 1, true
				}
				if m &= m - 1; m == 0 {
					break
				}
			}
			i += 8
			continue
		}
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			r := len(b)
			for r > from && b[r-1] == '\\' {
				r--
			}
			return r, false
		}
		q = i + k
		if closingQuote(b, from, q) {
			return q + 1, true
		}
		i, quiet = q+1, 0
	}
}

// quietWords is how many quote-free words skimString tests before handing
// the rest of the hop to bytes.IndexByte.
const quietWords = 8

// closingQuote reports whether the quote at b[q] ends the string that began
// at from: an even number of backslashes precede it (each pair is an
// escaped backslash).
func closingQuote(b []byte, from, q int) bool {
	// One backslash or none, as in \" and ", is nearly every case.
	if q == from || b[q-1] != '\\' {
		return true
	}
	if q-1 == from || b[q-2] != '\\' {
		return false
	}
	p := q - 2
	for p > from && b[p-1] == '\\' {
		p--
	}
	return (q-p)%2 == 0
}

// exactQuoteMask sets the high bit of every '"' byte of w and no other bit.
func exactQuoteMask(w uint64) uint64 { return zeroByteBits(w^(lsb*'"')) & msb }

func checkTrailing(b []byte, i int) error {
	i = skipWS(b, i)
	if i != len(b) {
		return badBody("invalid JSON: data after the top-level object at offset %d", i)
	}
	return nil
}

func syntaxErr(b []byte, i int, want string) error {
	if i >= len(b) {
		return &bodyError{want: want, truncated: true}
	}
	return badBody("invalid JSON at offset %d: unexpected %q, want %s", i, b[i], want)
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// nextMember moves past what follows a member of an array or object closed
// by close: a ',' (more members follow, at next) or close itself (next is
// just past it).
func nextMember(b []byte, i int, close byte) (next int, more bool, err error) {
	i = skipWS(b, i)
	if i < len(b) {
		switch b[i] {
		case ',':
			return skipWS(b, i+1), true, nil
		case close:
			return i + 1, false, nil
		}
	}
	return i, false, syntaxErr(b, i, "',' or '"+string(close)+"'")
}

// skipValue validates the JSON value starting at b[i] and returns the offset
// just past it.
func skipValue(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, syntaxErr(b, i, "a value")
	}
	switch c := b[i]; {
	case c == '"':
		end, _, err := scanString(b, i)
		return end, err
	case c == '{':
		if depth > maxJSONDepth {
			return i, badBody("invalid JSON: nesting deeper than %d", maxJSONDepth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return i, syntaxErr(b, i, "object key")
			}
			end, _, err := scanString(b, i)
			if err != nil {
				return end, err
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return i, syntaxErr(b, i, "':' after object key")
			}
			if i, err = skipValue(b, skipWS(b, i+1), depth+1); err != nil {
				return i, err
			}
			var more bool
			if i, more, err = nextMember(b, i, '}'); err != nil || !more {
				return i, err
			}
		}
	case c == '[':
		if depth > maxJSONDepth {
			return i, badBody("invalid JSON: nesting deeper than %d", maxJSONDepth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = skipValue(b, i, depth+1); err != nil {
				return i, err
			}
			var more bool
			if i, more, err = nextMember(b, i, ']'); err != nil || !more {
				return i, err
			}
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	}
	return i, syntaxErr(b, i, "a value")
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), nil
	}
	err := syntaxErr(b, i, lit).(*bodyError)
	err.truncated = len(b)-i < len(lit) && string(b[i:]) == lit[:len(b)-i]
	return i, err
}

func scanNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return i, syntaxErr(b, i, "a digit")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return i, syntaxErr(b, i, "a digit")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, syntaxErr(b, i, "a digit")
		}
	}
	return i, nil
}

// scanString returns the offset past the string starting at b[i] (a quote)
// and whether it holds escapes.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	return scanStringFrom(b, i+1, false)
}

// scanStringFrom continues scanString at b[i], inside the string.
func scanStringFrom(b []byte, i int, escaped bool) (end int, _ bool, err error) {
	for {
		i = plainPrefix(b, i)
		if i >= len(b) {
			return i, escaped, syntaxErr(b, i, "closing '\"'")
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped, nil
		case c == '\\':
			escaped = true
			n, err := escapeLen(b, i)
			if err != nil {
				return i, escaped, err
			}
			i += n
		default: // below 0x20
			return i, escaped, badBody("invalid JSON at offset %d: control character in string", i)
		}
	}
}

// escapeLen validates the escape at b[i] (a backslash) and returns its length.
func escapeLen(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return 0, syntaxErr(b, len(b), "escape")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if i+6 > len(b) {
			err := badBody("invalid JSON at offset %d: bad \\u escape", i).(*bodyError)
			err.truncated = isHex4(b[i+2:]) // hex so far: the rest may follow
			return 0, err
		}
		if !isHex4(b[i+2 : i+6]) {
			return 0, badBody("invalid JSON at offset %d: bad \\u escape", i)
		}
		return 6, nil
	}
	return 0, badBody("invalid JSON at offset %d: bad escape \\%c", i, b[i+1])
}

// plainPrefix returns the offset of the first byte at or after b[i] that is
// '"', '\\' or below 0x20, or len(b). Prompts are almost all plain bytes,
// so this is where the parser spends its time: it tests sixteen bytes per
// step and jumps straight to the special one.
func plainPrefix(b []byte, i int) int {
	for ; i+16 <= len(b); i += 16 {
		if m := exactSpecialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		if m := exactSpecialMask(binary.LittleEndian.Uint64(b[i+8:])); m != 0 {
			return i + 8 + bits.TrailingZeros64(m)>>3
		}
	}
	if i+8 <= len(b) {
		if m := exactSpecialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

const (
	lsb  = 0x0101010101010101
	msb  = 0x8080808080808080
	low7 = 0x7f7f7f7f7f7f7f7f
)

func isHex4(h []byte) bool {
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func unquote(raw []byte) (string, error) {
	s := raw[1 : len(raw)-1]
	for _, c := range s {
		if c == '\\' {
			u, err := appendUnescaped(nil, s)
			return string(u), err
		}
	}
	return string(s), nil
}

// appendUnescaped appends the text of a validated JSON string body (no
// quotes) to dst.
func appendUnescaped(dst, s []byte) ([]byte, error) {
	return appendUnescapedMax(dst, s, math.MaxInt)
}

// appendUnescapedMax is appendUnescaped that stops once dst holds limit
// bytes (it may pass the limit by one escape).
func appendUnescapedMax(dst, s []byte, limit int) ([]byte, error) {
	for i := 0; i < len(s) && len(dst) < limit; {
		c := s[i]
		if c != '\\' {
			j := len(s)
			if k := bytes.IndexByte(s[i+1:], '\\'); k >= 0 {
				j = i + 1 + k
			}
			if room := limit - len(dst); j-i > room {
				j = i + room
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		if i+1 >= len(s) {
			return dst, badBody("invalid JSON: truncated escape")
		}
		switch s[i+1] {
		case '"', '\\', '/':
			dst = append(dst, s[i+1])
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			if i+6 > len(s) {
				return dst, badBody("invalid JSON: truncated \\u escape")
			}
			r1, err := strconv.ParseUint(string(s[i+2:i+6]), 16, 32)
			if err != nil {
				return dst, badBody("invalid JSON: bad \\u escape")
			}
			r := rune(r1)
			i += 6
			if utf16.IsSurrogate(r) && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if r2, err := strconv.ParseUint(string(s[i+2:i+6]), 16, 32); err == nil {
					if d := utf16.DecodeRune(r, rune(r2)); d != utf8.RuneError {
						r = d
						i += 6
					}
				}
			}
			if utf16.IsSurrogate(r) {
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			return dst, badBody("invalid JSON: bad escape")
		}
		i += 2
	}
	return dst, nil
}

// rewriteModel returns a copy of body with only the model value replaced.
func rewriteModel(body []byte, rb *requestBody, target string) []byte {
	q, _ := json.Marshal(target) // a string always marshals
	out := make([]byte, 0, len(body)-(rb.modelEnd-rb.modelStart)+len(q))
	out = append(out, body[:rb.modelStart]...)
	out = append(out, q...)
	return append(out, body[rb.modelEnd:]...)
}
