// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/labelvalue"
)

// Parser reads the used metric families of one engine from Prometheus text
// pages. It is not safe for concurrent use: each scraper owns one.
//
// Its fast path keeps only the lines that can belong to a used family
// (decided from each line's metric-name token, read exactly as expfmt reads
// it) and hands those to expfmt's parser: a real page's hundreds of histogram
// lines are skipped without being parsed. A line whose name is quoted (the
// UTF-8 name syntax) sends the whole page to expfmt instead. The fuzz test
// holds the fast path equal to expfmt on the whole page.
type Parser struct {
	names MetricNames
	// byLength holds, by length, the metric names whose lines can change a
	// used family.
	byLength [][]string
	// plainNames are the used families' names that have no suffix.
	plainNames []string
	text       expfmt.TextParser
	kept       []byte
	// keptLines are the page's line numbers (1-based) of the kept lines.
	keptLines []int
	reader    bytes.Reader
	fullParse bool

	// The families plainParse returns, made of objects reused from one
	// page to the next, and the strings they hold.
	fams       map[string]*dto.MetricFamily
	strs       map[string]string
	types      [5]dto.MetricType
	famArena   []*dto.MetricFamily
	metArena   []*dto.Metric
	holders    []*valueHolder
	labelArena []*dto.LabelPair
	nFam, nMet int
	nLabel     int
	// series holds the hashes of the page's series seen by plainParse;
	// order is its scratch list of a series' labels, sorted.
	series map[uint64]struct{}
	seed   maphash.Seed
	order  []*dto.LabelPair
}

// NewParser returns a parser of the named families.
func NewParser(names MetricNames) *Parser {
	p := &Parser{names: names, text: expfmt.NewTextParser(model.UTF8Validation)}
	for i := range p.types {
		p.types[i] = dto.MetricType(i)
	}
	relevant := map[string]bool{}
	for _, n := range names.families() {
		if baseName(n) == n {
			p.plainNames = append(p.plainNames, n)
		}
		// expfmt files a sample named X_sum, X_count or X_bucket under family
		// X when X is a summary or histogram, and decides that from the lines
		// naming X, whose own family depends on X's base name in turn. So a
		// used family's lines are those of its name, its suffixed names and
		// the chain of its base names.
		for _, suffix := range []string{"", "_sum", "_count", "_bucket"} {
			relevant[n+suffix] = true
		}
		for base := baseName(n); base != n; n, base = base, baseName(base) {
			relevant[base] = true
		}
	}
	for n := range relevant {
		for len(p.byLength) <= len(n) {
			p.byLength = append(p.byLength, nil)
		}
		p.byLength[len(n)] = append(p.byLength[len(n)], n)
	}
	return p
}

func baseName(n string) string {
	for _, suffix := range []string{"_count", "_sum", "_bucket"} {
		if len(n) > len(suffix) && strings.HasSuffix(n, suffix) {
			return n[:len(n)-len(suffix)]
		}
	}
	return n
}

// Parse reads one page. The result's ScrapedAt is zero.
func (p *Parser) Parse(page []byte) (datastore.Metrics, error) {
	if p.fullParse {
		return p.parseFull(page)
	}
	if !p.filter(page) {
		return p.parseFull(page)
	}
	if fams, ok := p.plainParse(); ok {
		return extract(fams, &p.names)
	}
	if err := tooManyLabels(p.kept, p.keptLines); err != nil {
		return datastore.Metrics{}, err
	}
	p.reader.Reset(p.kept)
	fams, err := p.text.TextToMetricFamilies(&p.reader)
	if err != nil {
		var pe expfmt.ParseError
		if errors.As(err, &pe) && pe.Line >= 1 && pe.Line <= len(p.keptLines) {
			// Report the line of the page, not of the kept lines.
			pe.Line = p.keptLines[pe.Line-1]
			err = pe
		}
		return datastore.Metrics{}, fmt.Errorf("malformed metrics page: %w", err)
	}
	return extract(fams, &p.names)
}

// parseFull parses the whole page with expfmt; the slow reference path.
func (p *Parser) parseFull(page []byte) (datastore.Metrics, error) {
	if err := tooManyLabels(page, nil); err != nil {
		return datastore.Metrics{}, err
	}
	p.reader.Reset(page)
	fams, err := p.text.TextToMetricFamilies(&p.reader)
	if err != nil {
		return datastore.Metrics{}, fmt.Errorf("malformed metrics page: %w", err)
	}
	return extract(fams, &p.names)
}

// maxLabelsPerLine bounds the labels of a line handed to expfmt, whose
// check for a repeated label name costs the square of a line's labels.
// Real pages carry a handful per series; a line may hold this many
// label-value starts (="), a label's own or inside a value.
const maxLabelsPerLine = 64

var labelStart = []byte(`="`)

// tooManyLabels refuses text in which a line holds more than
// maxLabelsPerLine labels, naming the line of the page: lines[i] is the
// page's line number of text's line i+1 (nil: text is the page).
func tooManyLabels(text []byte, lines []int) error {
	if bytes.Count(text, labelStart) <= maxLabelsPerLine {
		return nil
	}
	for n := 1; len(text) > 0; n++ {
		end := bytes.IndexByte(text, '\n')
		if end < 0 {
			end = len(text) - 1
		}
		if bytes.Count(text[:end+1], labelStart) > maxLabelsPerLine {
			if lines != nil {
				n = lines[n-1]
			}
			return fmt.Errorf("malformed metrics page: line %d has more than %d labels", n, maxLabelsPerLine)
		}
		text = text[end+1:]
	}
	return nil
}

// filter copies the relevant lines of page into p.kept; false means a line's
// name is quoted and the page needs the full parser.
func (p *Parser) filter(page []byte) bool {
	p.kept = p.kept[:0]
	p.keptLines = p.keptLines[:0]
	line := 0
	// Most lines name the same family as the line before (a histogram's
	// buckets): a line that starts with the previous name, not followed by
	// more of a name, names it too, and a memory compare tells so.
	var prev []byte
	prevRelevant := false
	for len(page) > 0 {
		line++
		end := bytes.IndexByte(page, '\n')
		next := end + 1
		if end < 0 {
			end, next = len(page), len(page)
		}
		text := page[:end]
		relevant := false
		if n := len(prev); n > 0 && bytes.HasPrefix(text, prev) && (len(text) == n || (nameChar[text[n]]&continuation == 0 && text[n] != '"')) {
			relevant = prevRelevant
		} else {
			name, quoted, help := lineName(text)
			if quoted {
				return false
			}
			relevant = p.isRelevant(name)
			if help {
				// A HELP line changes nothing expfmt reports of a family
				// whose name has no _sum, _count or _bucket suffix (it only
				// creates the family early, which its samples or TYPE
				// would do); its text is long, so skip it.
				relevant = relevant && !p.plain(name)
			} else if len(name) > 0 {
				prev, prevRelevant = name, relevant
			}
		}
		if relevant {
			p.kept = append(p.kept, page[:next]...)
			p.keptLines = append(p.keptLines, line)
		}
		page = page[next:]
	}
	return true
}

// isRelevant looks the name up by length first: a page's names are long and
// hashing each costs more than comparing the few of equal length.
func (p *Parser) isRelevant(name []byte) bool {
	if len(name) >= len(p.byLength) {
		return false
	}
	for _, r := range p.byLength[len(name)] {
		if string(name) == r {
			return true
		}
	}
	return false
}

// lineName returns the metric name a text-format line is about, read as
// expfmt reads it: a sample's name, or the name in a HELP or TYPE comment
// (help tells a HELP line). Other lines give no name. quoted reports a name
// in the quoted UTF-8 form, which this reader leaves to expfmt.
func lineName(line []byte) (name []byte, quoted, help bool) {
	i := skipBlankTab(line, 0)
	if i == len(line) {
		return nil, false, false
	}
	switch line[i] {
	case '{', '"':
		return nil, true, false
	case '#':
		i = skipBlankTab(line, i+1)
		start := i
		for i < len(line) && line[i] != ' ' && line[i] != '\t' {
			i++
		}
		keyword := line[start:i]
		help = string(keyword) == "HELP"
		if i == len(line) || (!help && string(keyword) != "TYPE") {
			return nil, false, false
		}
		i = skipBlankTab(line, i)
		if i < len(line) && line[i] == '"' {
			return nil, true, false
		}
	}
	start := i
	if i < len(line) && nameChar[line[i]]&nameStart != 0 {
		for i++; i < len(line) && nameChar[line[i]]&continuation != 0; i++ {
		}
	}
	if i < len(line) && line[i] == '"' {
		// expfmt reads on into a quoted part: foo"bar" names foobar.
		return nil, true, false
	}
	return line[start:i], false, help
}

// plain reports a used family's own name (not a suffixed or base name)
// without a _sum, _count or _bucket suffix.
func (p *Parser) plain(name []byte) bool {
	for _, n := range p.plainNames {
		if string(name) == n {
			return true
		}
	}
	return false
}

func skipBlankTab(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	return i
}

// nameChar classifies bytes of unquoted metric names as expfmt does.
var nameChar = func() (t [256]uint8) {
	for b := 0; b < 256; b++ {
		if (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_' || b == ':' {
			t[b] = nameStart | continuation
		} else if b >= '0' && b <= '9' {
			t[b] = continuation
		}
	}
	return t
}()

const (
	nameStart    = 1
	continuation = 2
)

// maxCount bounds queue and running counts; a larger value is not a real
// server's and would overflow int conversions.
const maxCount = 1 << 30

func extract(fams map[string]*dto.MetricFamily, n *MetricNames) (datastore.Metrics, error) {
	var m datastore.Metrics
	var err error
	if m.WaitingRequests, err = countFamily(fams, &n.Waiting); err != nil {
		return m, err
	}
	if m.RunningRequests, err = countFamily(fams, &n.Running); err != nil {
		return m, err
	}
	kv := &n.KVCacheUsage
	if _, ok := fams[kv.Name]; !ok && n.KVCacheUsageLegacy.Name != "" {
		if _, ok := fams[n.KVCacheUsageLegacy.Name]; ok {
			kv = &n.KVCacheUsageLegacy
		}
	}
	if m.KVCacheUsage, err = kvFamily(fams, kv); err != nil {
		return m, err
	}
	if n.LoRAInfo.Name != "" {
		if err := loraFamily(fams[n.LoRAInfo.Name], n, &m); err != nil {
			return m, err
		}
	}
	if n.CacheInfo.Name != "" {
		if err := cacheFamily(fams[n.CacheInfo.Name], n, &m); err != nil {
			return m, err
		}
	}
	// Two calls, not a loop over pointers to m's fields, which would move m
	// to the heap.
	if n.BlockSize.Name != "" {
		if m.BlockSize, err = geometryGauge(fams[n.BlockSize.Name], &n.BlockSize, m.BlockSize); err != nil {
			return m, err
		}
	}
	if n.NumBlocks.Name != "" {
		if m.NumBlocks, err = geometryGauge(fams[n.NumBlocks.Name], &n.NumBlocks, m.NumBlocks); err != nil {
			return m, err
		}
	}
	if n.PrefixCacheQueries.Name != "" && n.PrefixCacheHits.Name != "" {
		if m.PrefixCacheQueries, err = optionalSum(fams, &n.PrefixCacheQueries); err != nil {
			return m, err
		}
		if m.PrefixCacheHits, err = optionalSum(fams, &n.PrefixCacheHits); err != nil {
			return m, err
		}
		if m.PrefixCacheHits > m.PrefixCacheQueries {
			return m, fmt.Errorf("metric %q is %v, more than %q's %v", n.PrefixCacheHits.String(), m.PrefixCacheHits, n.PrefixCacheQueries.String(), m.PrefixCacheQueries)
		}
	}
	return m, nil
}

// optionalSum sums the selected series of an optional counter; a family
// absent from the page is 0, as a server that does not count reads.
func optionalSum(fams map[string]*dto.MetricFamily, sel *Metric) (float64, error) {
	if _, ok := fams[sel.Name]; !ok {
		return 0, nil
	}
	sum := 0.0
	err := values(fams, sel, func(v float64) error {
		if math.IsInf(v, 0) {
			return fmt.Errorf("metric %q has invalid value %v", sel.String(), v)
		}
		sum += v
		return nil
	})
	return sum, err
}

// values calls each with the sample values of a required scalar metric's
// selected series; a family absent from the page, or with no series the
// selector's labels pick, is an error.
func values(fams map[string]*dto.MetricFamily, sel *Metric, each func(float64) error) error {
	f, ok := fams[sel.Name]
	if !ok {
		return fmt.Errorf("metric %q missing from page", sel.String())
	}
	selected := 0
	for _, s := range f.Metric {
		if !sel.selects(s) {
			continue
		}
		selected++
		v, err := scalar(f, s)
		if err != nil {
			return err
		}
		if math.IsNaN(v) || v < 0 {
			return fmt.Errorf("metric %q has invalid value %v", sel.String(), v)
		}
		if err := each(v); err != nil {
			return err
		}
	}
	if selected == 0 && len(sel.Match) > 0 {
		return fmt.Errorf("metric %q missing from page (family %s has no such series)", sel.String(), sel.Name)
	}
	return nil
}

func scalar(f *dto.MetricFamily, s *dto.Metric) (float64, error) {
	switch f.GetType() {
	case dto.MetricType_GAUGE:
		return s.GetGauge().GetValue(), nil
	case dto.MetricType_UNTYPED:
		return s.GetUntyped().GetValue(), nil
	case dto.MetricType_COUNTER:
		return s.GetCounter().GetValue(), nil
	}
	return 0, fmt.Errorf("metric %q is a %s, want a gauge", f.GetName(), strings.ToLower(f.GetType().String()))
}

// countFamily sums the selected series: a data-parallel server reports one
// series per engine.
func countFamily(fams map[string]*dto.MetricFamily, sel *Metric) (int, error) {
	sum := 0.0
	err := values(fams, sel, func(v float64) error {
		sum += v
		if sum > maxCount {
			return fmt.Errorf("metric %q has implausible value %v", sel.String(), sum)
		}
		return nil
	})
	return int(math.Round(sum)), err
}

// kvFamily takes the fullest series: the picker must not overload the most
// loaded engine of a data-parallel server.
func kvFamily(fams map[string]*dto.MetricFamily, sel *Metric) (float64, error) {
	usage := 0.0
	err := values(fams, sel, func(v float64) error {
		if v > 1 {
			return fmt.Errorf("metric %q has value %v outside 0..1", sel.String(), v)
		}
		usage = max(usage, v)
		return nil
	})
	return usage, err
}

// loraFamily reads the newest selected series (by value, a Unix time); ties
// go to the greatest label values so the answer does not depend on series
// order.
func loraFamily(f *dto.MetricFamily, n *MetricNames, m *datastore.Metrics) error {
	if f == nil {
		return nil
	}
	var best *dto.Metric
	var bestValue float64
	var bestKey [3]string
	for _, s := range f.Metric {
		if !n.LoRAInfo.selects(s) {
			continue
		}
		v, err := scalar(f, s)
		if err != nil {
			return err
		}
		if math.IsNaN(v) {
			return fmt.Errorf("metric %q has invalid value NaN", f.GetName())
		}
		key := [3]string{labelValue(s, n.RunningAdaptersLabel), labelValue(s, n.WaitingAdaptersLabel), labelValue(s, n.MaxAdaptersLabel)}
		if best == nil || v > bestValue || (v == bestValue && lessKey(bestKey, key)) {
			best, bestValue, bestKey = s, v, key
		}
	}
	if best == nil {
		return nil
	}
	m.RunningAdapters = adapterList(bestKey[0])
	m.WaitingAdapters = adapterList(bestKey[1])
	if bestKey[2] != "" {
		c, err := strconv.Atoi(strings.TrimSpace(bestKey[2]))
		if err != nil || c < 0 {
			return fmt.Errorf("metric %q has %s %q, want a count", f.GetName(), n.MaxAdaptersLabel, bestKey[2])
		}
		m.MaxAdapters = c
	}
	return nil
}
func lessKey(a, b [3]string) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// maxAdapters bounds an adapter list read from a page: servers hold a few
// dozen adapters at most (vLLM's max_loras), and the list is scanned for
// every pick that names an adapter.
const maxAdapters = 256

// adapterList reads a comma-separated adapter list. A name that fails
// labelvalue.Check (not UTF-8, a control character, over 256 bytes) is
// dropped: a request naming it is refused before it is scheduled, so it can
// match none, and the page does not decide what the picker keeps.
func adapterList(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" && labelvalue.Valid(a, 0) {
			out = append(out, a)
			if len(out) == maxAdapters {
				break
			}
		}
	}
	return out
}

// cacheFamily reads the cache geometry from the first selected series.
func cacheFamily(f *dto.MetricFamily, n *MetricNames, m *datastore.Metrics) error {
	if f == nil {
		return nil
	}
	for _, s := range f.Metric {
		if !n.CacheInfo.selects(s) {
			continue
		}
		var err error
		if m.BlockSize, err = countLabel(f, s, n.BlockSizeLabel, m.BlockSize); err != nil {
			return err
		}
		m.NumBlocks, err = countLabel(f, s, n.NumBlocksLabel, m.NumBlocks)
		return err
	}
	return nil
}

// countLabel reads a count from label name of s; without it (or with no
// name) it returns prev.
func countLabel(f *dto.MetricFamily, s *dto.Metric, name string, prev int) (int, error) {
	if name == "" {
		return prev, nil
	}
	v := labelValue(s, name)
	if v == "" {
		return prev, nil
	}
	// vLLM prints some counts as floats ("512.0").
	x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !isCount(x) {
		return prev, fmt.Errorf("metric %q has %s %q, want a count", f.GetName(), name, v)
	}
	return int(x), nil
}

// geometryGauge reads a cache-geometry count from the first selected series
// of an optional gauge; without one it returns prev.
func geometryGauge(f *dto.MetricFamily, sel *Metric, prev int) (int, error) {
	if f == nil {
		return prev, nil
	}
	for _, s := range f.Metric {
		if !sel.selects(s) {
			continue
		}
		v, err := scalar(f, s)
		if err != nil {
			return prev, err
		}
		if !isCount(v) {
			return prev, fmt.Errorf("metric %q has value %v, want a count", sel.String(), v)
		}
		return int(v), nil
	}
	return prev, nil
}

func isCount(x float64) bool { return x >= 0 && x <= maxCount && x == math.Trunc(x) }

func labelValue(s *dto.Metric, name string) string {
	for _, l := range s.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
