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
type bodyError struct{ msg string }

func (e *bodyError) Error() string { return e.msg }

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
	out := &requestBody{}
	err := scanTopLevel(body, kind, out, max(promptLimit, 0))
	if err != nil {
		if !kind.strict() {
			return &requestBody{}, nil
		}
		return nil, err
	}
	if !out.hasModel && kind.strict() {
		return nil, badBody(`request body has no "model" field`)
	}
	return out, nil
}

func scanTopLevel(b []byte, kind pathKind, out *requestBody, promptLimit int) error {
	i := skipWS(b, 0)
	if i >= len(b) {
		return badBody("request body is empty, want a JSON object")
	}
	if b[i] != '{' {
		return badBody("request body is not a JSON object (starts with %q at offset %d)", b[i], i)
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return checkTrailing(b, i+1)
	}
	var key []byte
	// promptDone: everything the picker wants from values other than model
	// and stream has been read, so those can be skimmed.
	promptDone := promptLimit == 0 || !kind.hasPrompt()
	for {
		if i >= len(b) || b[i] != '"' {
			return syntaxErr(b, i, "object key")
		}
		ks := i
		end, escaped, err := scanString(b, i)
		if err != nil {
			return err
		}
		if escaped {
			key, err = appendUnescaped(key[:0], b[ks+1:end-1])
			if err != nil {
				return err
			}
		} else {
			key = b[ks+1 : end-1]
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return syntaxErr(b, i, "':' after object key")
		}
		i = skipWS(b, i+1)
		vs := i
		var ve int
		k := string(key)
		switch {
		case k == "messages" && (kind == pathChat || kind == pathNone) && i < len(b) && b[i] == '[',
			k == "prompt" && (kind == pathCompletions || kind == pathNone) && i < len(b):
			// Validated up to the limit in one pass, skimmed after; the
			// prompt is the raw value, not a copy.
			out.Prompt, ve, err = promptAt(b, i, promptLimit, k == "messages", &out.skimmed)
			if err != nil {
				return err
			}
			promptDone = len(out.Prompt) >= promptLimit
		case promptDone && !kind.reads(k) && i < len(b) && (b[i] == '"' || b[i] == '[' || b[i] == '{'):
			if b[i] == '"' {
				ve, err = skim(b, i+1, 0, true, &out.skimmed)
			} else {
				ve, err = skim(b, i+1, 1, false, &out.skimmed)
			}
			if err != nil {
				return err
			}
		default:
			if ve, err = skipValue(b, i, 1); err != nil {
				return err
			}
			if err := out.field(k, b[vs:ve], vs, kind); err != nil {
				return err
			}
		}
		var more bool
		if i, more, err = nextMember(b, ve, '}'); err != nil {
			return err
		}
		if !more {
			return checkTrailing(b, i)
		}
	}
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
	case "messages":
		if kind == pathChat || kind == pathNone {
			// An array is read by promptAt; anything else lands here.
			return badBody(`"messages" must be an array`)
		}
	}
	return nil
}

// promptAt validates the prompt value at b[i] (messages: an array of
// objects) like skipValue and returns it as a slice of b cut at limit bytes,
// with the offset past the value. Validation stops at the first point at or
// past i+limit where skimming can take over (before an element or key, or
// inside a string outside an escape); the rest of the value is skimmed.
func promptAt(b []byte, i, limit int, messages bool, skimmed *[]span) ([]byte, int, error) {
	c := promptCutter{b: b, stop: i + limit, messages: messages}
	if limit > len(b)-i {
		c.stop = len(b) + 1 // never
	}
	end, err := c.value(i, 1)
	if err == errPromptFull {
		end, err = skim(b, end, c.open, c.inString, skimmed)
	}
	if err != nil {
		return nil, end, err
	}
	cut := end
	if end-i > limit {
		cut = i + limit
	}
	// Capped so that no append can write into the body.
	return b[i:cut:cut], end, nil
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
	i++
	for {
		j := plainPrefix(b, i)
		if j > c.stop {
			// b[max(i, stop)] is a plain byte, not inside an escape.
			return c.full(max(i, c.stop), open, true)
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

// errPromptFull stops validating once the prompt is full; the offset
// returned with it is where skimming takes over. It never leaves the parser.
var errPromptFull = &bodyError{msg: "prompt full"}

// skim returns the offset just past the value that b[i] is inside of,
// depth arrays or objects deep and, if inString, inside a string that is
// innermost. It does not validate: it only finds where strings and
// brackets end, which is enough to locate the next top-level key. The
// range is appended to skimmed, if not nil. A body that ends first is
// truncated, and that is an error.
func skim(b []byte, i, depth int, inString bool, skimmed *[]span) (int, error) {
	start := i
	if skimmed != nil {
		defer func() { *skimmed = append(*skimmed, span{start, i}) }()
	}
	if inString {
		var err error
		if i, err = skimString(b, i); err != nil || depth == 0 {
			return i, err
		}
	}
	for i < len(b) {
		switch b[i] {
		case '"':
			var err error
			if i, err = skimString(b, i+1); err != nil {
				return i, err
			}
			continue
		case '[', '{':
			depth++
		case ']', '}':
			depth--
			if depth == 0 {
				i++
				return i, nil
			}
		}
		i++
	}
	return i, badBody("invalid JSON: unexpected end of body, want ']' or '}' (%d left open)", depth)
}

// skimString returns the offset past the closing quote of the string that
// b[i] is inside of; b[i] must not be in the middle of an escape. A quote
// is the closing one when an even number of backslashes precede it (each
// pair is an escaped backslash).
func skimString(b []byte, i int) (int, error) {
	from := i
	for {
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			return len(b), syntaxErr(b, len(b), "closing '\"'")
		}
		q := i + k
		p := q
		for p > from && b[p-1] == '\\' {
			p--
		}
		if (q-p)%2 == 0 {
			return q + 1, nil
		}
		i = q + 1
	}
}

func checkTrailing(b []byte, i int) error {
	i = skipWS(b, i)
	if i != len(b) {
		return badBody("invalid JSON: data after the top-level object at offset %d", i)
	}
	return nil
}

func syntaxErr(b []byte, i int, want string) error {
	if i >= len(b) {
		return badBody("invalid JSON: unexpected end of body, want %s", want)
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
	return i, syntaxErr(b, i, lit)
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
		if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
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
		if m := specialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		if m := specialMask(binary.LittleEndian.Uint64(b[i+8:])); m != 0 {
			return i + 8 + bits.TrailingZeros64(m)>>3
		}
	}
	if i+8 <= len(b) {
		if m := specialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
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
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// specialMask sets the high bit of the lowest byte of w that is '"',
// '\\' or below 0x20 (SWAR); bits above it may be set spuriously by a
// borrow, so only the lowest set bit is exact.
func specialMask(w uint64) uint64 {
	hasZero := func(x uint64) uint64 { return (x - lsb) & ^x & msb }
	return hasZero(w^(lsb*'"')) | hasZero(w^(lsb*'\\')) | ((w - lsb*0x20) &^ w & msb)
}

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
