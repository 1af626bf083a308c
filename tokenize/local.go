// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package tokenize

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/text/unicode/norm"
)

// MaxTokenizerFileBytes bounds a tokenizer.json read by LoadLocal.
const MaxTokenizerFileBytes = 64 << 20

// Local tokenizes text in process with a model's tokenizer.json, the Hugging
// Face tokenizers format, for its BPE model as the Llama 3, Qwen and GPT-2
// families use it: added (special) tokens matched first, then the
// normalizer (NFC, NFKC, Lowercase, Prepend, Replace of a string),
// the pre-tokenizers (Split by a regex, ByteLevel, a Sequence of them), the
// BPE merges by rank (with ignore_merges and byte_fallback), and the post
// processor's special tokens (TemplateProcessing). A part it does not know
// is refused when the file is loaded, so that it never tokenizes wrongly in
// silence. Safe for concurrent use.
type Local struct {
	vocab  map[string]uint32
	merges map[[2]uint32]merge
	unk    uint32
	hasUnk bool
	// byteFallback: a character not in the vocabulary is its UTF-8 bytes'
	// <0xXX> tokens.
	byteFallback bool
	ignoreMerges bool

	added      *regexp.Regexp // nil: no added tokens
	addedIDs   map[string]uint32
	normalize  []func(string) string
	preSplit   []func(pieces []string) ([]string, error)
	byteLevel  bool
	prefix     []uint32 // the post processor's tokens before the text
	suffix     []uint32 // and after it
	byteTokens [256]string
	// words caches the ids of short words: text repeats its words.
	words *lru.Cache[string, []uint32]
}

// Bounds of Local's word cache.
const (
	wordCacheEntries  = 1 << 16
	maxCachedWordSize = 64
)

type merge struct {
	rank int
	id   uint32
}

// LoadLocal reads the tokenizer.json at path.
func LoadLocal(path string) (*Local, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTokenizerFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	if len(b) > MaxTokenizerFileBytes {
		return nil, fmt.Errorf("tokenize: %s is more than %d bytes", path, MaxTokenizerFileBytes)
	}
	l, err := ParseLocal(b)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %s: %w", path, err)
	}
	return l, nil
}

// tokenizerFile is the part of tokenizer.json Local reads.
type tokenizerFile struct {
	AddedTokens []struct {
		ID      uint32 `json:"id"`
		Content string `json:"content"`
	} `json:"added_tokens"`
	Normalizer    *component      `json:"normalizer"`
	PreTokenizer  *component      `json:"pre_tokenizer"`
	PostProcessor *component      `json:"post_processor"`
	Model         json.RawMessage `json:"model"`
}

// component is a normalizer, pre-tokenizer or post processor: its type and
// the fields of the types Local knows.
type component struct {
	Type          string      `json:"type"`
	Normalizers   []component `json:"normalizers"`
	Pretokenizers []component `json:"pretokenizers"`
	Processors    []component `json:"processors"`
	Prepend       string      `json:"prepend"`
	Content       string      `json:"content"`
	Pattern       *struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       bool   `json:"use_regex"`
	Single         []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
}

// gpt2Split is the pre-tokenizer regex of ByteLevel with use_regex.
const gpt2Split = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// ParseLocal reads a tokenizer.json's content.
func ParseLocal(b []byte) (*Local, error) {
	var f tokenizerFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	var m struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  json.RawMessage   `json:"merges"`
		UnkToken                *string           `json:"unk_token"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		Dropout                 *float64          `json:"dropout"`
	}
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if m.Type != "BPE" {
		return nil, fmt.Errorf("model type %q: only BPE is supported", m.Type)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") || (m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, errors.New("model: a continuing subword prefix or end-of-word suffix is not supported")
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return nil, errors.New("model: BPE dropout is not deterministic")
	}
	if len(m.Vocab) == 0 {
		return nil, errors.New("model: an empty vocabulary")
	}
	words, err := lru.New[string, []uint32](wordCacheEntries)
	if err != nil {
		return nil, err
	}
	l := &Local{vocab: m.Vocab, merges: map[[2]uint32]merge{}, byteFallback: m.ByteFallback, ignoreMerges: m.IgnoreMerges,
		addedIDs: map[string]uint32{}, words: words}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model: the unknown token %q is not in the vocabulary", *m.UnkToken)
		}
		l.unk, l.hasUnk = id, true
	}
	if err := l.readMerges(m.Merges); err != nil {
		return nil, err
	}
	for i := range 256 {
		l.byteTokens[i] = fmt.Sprintf("<0x%02X>", i)
	}
	var alts []string
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			continue
		}
		l.addedIDs[a.Content] = a.ID
		alts = append(alts, a.Content)
	}
	if len(alts) > 0 {
		// The longest first: Go's alternation prefers the leftmost
		// alternative.
		slices.SortFunc(alts, func(a, b string) int { return len(b) - len(a) })
		for i, a := range alts {
			alts[i] = regexp.QuoteMeta(a)
		}
		l.added = regexp.MustCompile(strings.Join(alts, "|"))
	}
	if f.Normalizer != nil {
		if err := l.readNormalizer(*f.Normalizer); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
	}
	if f.PreTokenizer != nil {
		if err := l.readPreTokenizer(*f.PreTokenizer); err != nil {
			return nil, fmt.Errorf("pre_tokenizer: %w", err)
		}
	}
	if f.PostProcessor != nil {
		if err := l.readPostProcessor(*f.PostProcessor); err != nil {
			return nil, fmt.Errorf("post_processor: %w", err)
		}
	}
	return l, nil
}

func (l *Local) readMerges(raw json.RawMessage) error {
	var pairs [][2]string
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		for _, s := range asStrings {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return fmt.Errorf("model: merge %q is not two tokens", s)
			}
			pairs = append(pairs, [2]string{a, b})
		}
	} else if err := json.Unmarshal(raw, &pairs); err != nil {
		return fmt.Errorf("model: merges: %w", err)
	}
	for rank, p := range pairs {
		a, okA := l.vocab[p[0]]
		b, okB := l.vocab[p[1]]
		id, ok := l.vocab[p[0]+p[1]]
		if !okA || !okB || !ok {
			return fmt.Errorf("model: merge %q %q: a token not in the vocabulary", p[0], p[1])
		}
		if _, dup := l.merges[[2]uint32{a, b}]; !dup {
			l.merges[[2]uint32{a, b}] = merge{rank: rank, id: id}
		}
	}
	return nil
}

func (l *Local) readNormalizer(c component) error {
	switch c.Type {
	case "Sequence":
		for _, n := range c.Normalizers {
			if err := l.readNormalizer(n); err != nil {
				return err
			}
		}
	case "NFC":
		l.normalize = append(l.normalize, norm.NFC.String)
	case "NFKC":
		l.normalize = append(l.normalize, norm.NFKC.String)
	case "Lowercase":
		l.normalize = append(l.normalize, strings.ToLower)
	case "Prepend":
		p := c.Prepend
		l.normalize = append(l.normalize, func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		})
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil {
			return errors.New("type Replace: only a string pattern is supported")
		}
		from, to := *c.Pattern.String, c.Content
		l.normalize = append(l.normalize, func(s string) string { return strings.ReplaceAll(s, from, to) })
	default:
		return fmt.Errorf("type %q is not supported", c.Type)
	}
	return nil
}

func (l *Local) readPreTokenizer(c component) error {
	switch c.Type {
	case "Sequence":
		for _, p := range c.Pretokenizers {
			if err := l.readPreTokenizer(p); err != nil {
				return err
			}
		}
	case "Split":
		if c.Pattern == nil {
			return errors.New("type Split: no pattern")
		}
		if c.Behavior != "Isolated" || c.Invert {
			return fmt.Errorf("type Split: behavior %q (invert %v): only Isolated is supported", c.Behavior, c.Invert)
		}
		pattern := ""
		switch {
		case c.Pattern.Regex != nil:
			pattern = *c.Pattern.Regex
		case c.Pattern.String != nil:
			pattern = regexp2.Escape(*c.Pattern.String)
		}
		re, err := regexp2.Compile(pattern, regexp2.None)
		if err != nil {
			return fmt.Errorf("type Split: %w", err)
		}
		l.preSplit = append(l.preSplit, isolate(re))
	case "ByteLevel":
		if l.byteLevel {
			return errors.New("type ByteLevel twice")
		}
		l.byteLevel = true
		if c.AddPrefixSpace {
			l.preSplit = append(l.preSplit, func(pieces []string) ([]string, error) {
				for i, p := range pieces {
					if !strings.HasPrefix(p, " ") {
						pieces[i] = " " + p
					}
				}
				return pieces, nil
			})
		}
		if c.UseRegex {
			re := regexp2.MustCompile(gpt2Split, regexp2.None)
			l.preSplit = append(l.preSplit, isolate(re))
		}
	default:
		return fmt.Errorf("type %q is not supported", c.Type)
	}
	return nil
}

func (l *Local) readPostProcessor(c component) error {
	switch c.Type {
	case "Sequence":
		for _, p := range c.Processors {
			if err := l.readPostProcessor(p); err != nil {
				return err
			}
		}
	case "ByteLevel":
		// Offsets only: no tokens.
	case "TemplateProcessing":
		seen := false
		for _, piece := range c.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return errors.New("type TemplateProcessing: the text twice")
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := c.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("type TemplateProcessing: special token %q not defined", piece.SpecialToken.ID)
				}
				if seen {
					l.suffix = append(l.suffix, st.IDs...)
				} else {
					l.prefix = append(l.prefix, st.IDs...)
				}
			}
		}
	default:
		return fmt.Errorf("type %q is not supported", c.Type)
	}
	return nil
}

// isolate splits each piece into the regex's matches and the text between
// them (Split with behavior Isolated).
func isolate(re *regexp2.Regexp) func([]string) ([]string, error) {
	return func(pieces []string) ([]string, error) {
		out := make([]string, 0, len(pieces))
		for _, p := range pieces {
			runes := []rune(p)
			last := 0
			err := re.FindRunesMatches(runes, 0, func(m regexp2.MatchView) bool {
				i, n, ok := m.GroupRange(0)
				if !ok || n == 0 {
					return true
				}
				if i > last {
					out = append(out, string(runes[last:i]))
				}
				out = append(out, string(runes[i:i+n]))
				last = i + n
				return true
			})
			if err != nil {
				return nil, fmt.Errorf("tokenize: pre-tokenizer: %w", err)
			}
			if last < len(runes) {
				out = append(out, string(runes[last:]))
			}
		}
		return out, nil
	}
}

// Encode returns text's token ids, the post processor's special tokens
// around them, as a model server tokenizes a completion's prompt.
func (l *Local) Encode(text string) ([]uint32, error) {
	return l.EncodeContext(context.Background(), text)
}

// EncodeContext is Encode that gives up when ctx ends, between words.
func (l *Local) EncodeContext(ctx context.Context, text string) ([]uint32, error) {
	ids := append([]uint32(nil), l.prefix...)
	rest := text
	for rest != "" {
		seg, special := rest, ""
		if l.added != nil {
			if loc := l.added.FindStringIndex(rest); loc != nil {
				seg, special = rest[:loc[0]], rest[loc[0]:loc[1]]
				rest = rest[loc[1]:]
			} else {
				rest = ""
			}
		} else {
			rest = ""
		}
		var err error
		if ids, err = l.encodeSegment(ctx, ids, seg); err != nil {
			return nil, err
		}
		if special != "" {
			ids = append(ids, l.addedIDs[special])
		}
	}
	return append(ids, l.suffix...), nil
}

// encodeSegment appends the ids of text between added tokens.
func (l *Local) encodeSegment(ctx context.Context, ids []uint32, seg string) ([]uint32, error) {
	if seg == "" {
		return ids, nil
	}
	for _, n := range l.normalize {
		seg = n(seg)
	}
	pieces := []string{seg}
	for _, split := range l.preSplit {
		var err error
		if pieces, err = split(pieces); err != nil {
			return nil, err
		}
	}
	for i, p := range pieces {
		if i%256 == 255 && ctx.Err() != nil {
			return nil, fmt.Errorf("tokenize: %w", ctx.Err())
		}
		if l.byteLevel {
			p = byteLevel(p)
		}
		if len(p) > maxCachedWordSize {
			ids = l.bpe(ids, p)
			continue
		}
		w, ok := l.words.Get(p)
		if !ok {
			w = l.bpe(nil, p)
			l.words.Add(p, w)
		}
		ids = append(ids, w...)
	}
	return ids, nil
}

// bytesToRunes is GPT-2's map of bytes to printable characters, which
// byte-level vocabularies are written in.
var bytesToRunes = func() (t [256]rune) {
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}()

func byteLevel(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(bytesToRunes[s[i]])
	}
	return b.String()
}

// bpe appends the ids of one pre-tokenized word: its characters merged,
// lowest rank first, as the model's merges say.
func (l *Local) bpe(ids []uint32, word string) []uint32 {
	if word == "" {
		return ids
	}
	if id, ok := l.vocab[word]; ok && (l.ignoreMerges || utf8.RuneCountInString(word) == 1) {
		return append(ids, id)
	}
	syms := make([]symbol, 0, len(word))
	for _, r := range word {
		s := string(r)
		if id, ok := l.vocab[s]; ok {
			syms = append(syms, symbol{id: id})
			continue
		}
		switch {
		case l.byteFallback:
			for i := 0; i < len(s); i++ {
				if id, ok := l.vocab[l.byteTokens[s[i]]]; ok {
					syms = append(syms, symbol{id: id})
				} else if l.hasUnk {
					syms = append(syms, symbol{id: l.unk})
				}
			}
		case l.hasUnk:
			syms = append(syms, symbol{id: l.unk})
		}
	}
	for i := range syms {
		syms[i].prev, syms[i].next = i-1, i+1
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	var q pairQueue
	push := func(i int) {
		j := syms[i].next
		if j < 0 {
			return
		}
		if m, ok := l.merges[[2]uint32{syms[i].id, syms[j].id}]; ok {
			heap.Push(&q, pair{rank: m.rank, left: i, leftID: syms[i].id, rightID: syms[j].id, id: m.id})
		}
	}
	for i := range syms {
		push(i)
	}
	for q.Len() > 0 {
		p := heap.Pop(&q).(pair)
		left := &syms[p.left]
		if left.dead || left.id != p.leftID || left.next < 0 {
			continue
		}
		right := &syms[left.next]
		if right.dead || right.id != p.rightID {
			continue
		}
		left.id = p.id
		right.dead = true
		left.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = p.left
		}
		if left.prev >= 0 {
			push(left.prev)
		}
		push(p.left)
	}
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	return ids
}

type symbol struct {
	id         uint32
	prev, next int
	dead       bool
}

// pair is a candidate merge of the symbol at left with the next; stale once
// either changed.
type pair struct {
	rank, left          int
	leftID, rightID, id uint32
}

// pairQueue orders candidate merges by rank, then position: the leftmost of
// the lowest rank first, as the tokenizers library merges.
type pairQueue []pair

func (q pairQueue) Len() int { return len(q) }
func (q pairQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].left < q[j].left
}
func (q pairQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *pairQueue) Push(x any)   { *q = append(*q, x.(pair)) }
func (q *pairQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// DefaultTokenizerFileName is the file Discover looks for, llm-d's default.
const DefaultTokenizerFileName = "tokenizer.json"

// maxDiscovered bounds the tokenizers Discover returns.
const maxDiscovered = 256

// Discover finds the tokenizer files named fileName under dir and returns
// them by model name, as llm-d's local tokenizer discovery names them: the
// directory's path below dir ("Qwen/Qwen3/tokenizer.json" is
// "Qwen/Qwen3"), or, in a Hugging Face cache
// ("models--Qwen--Qwen3-0.6B/snapshots/<revision>/tokenizer.json"),
// "Qwen/Qwen3-0.6B". A dir that does not exist holds none.
func Discover(dir, fileName string) (map[string]string, error) {
	if fileName == "" {
		fileName = DefaultTokenizerFileName
	}
	found := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() || d.Name() != fileName {
			return nil
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil || rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		parts := strings.Split(name, "/")
		for i, p := range parts {
			if repo, ok := strings.CutPrefix(p, "models--"); ok && i+2 < len(parts) && parts[i+1] == "snapshots" {
				name = strings.ReplaceAll(repo, "--", "/")
				break
			}
		}
		if len(found) >= maxDiscovered {
			return fmt.Errorf("tokenize: more than %d tokenizers under %s", maxDiscovered, dir)
		}
		found[name] = path
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tokenize: discovering tokenizers: %w", err)
	}
	return found, nil
}
