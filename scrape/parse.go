package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/poolpicker/poolpicker/datastore"
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
	// relevant are the metric names whose lines can change a used family.
	relevant map[string]struct{}
	text     expfmt.TextParser
	kept     []byte
	// keptLines are the page's line numbers (1-based) of the kept lines.
	keptLines []int
	reader    bytes.Reader
	fullParse bool
}

// NewParser returns a parser of the named families.
func NewParser(names MetricNames) *Parser {
	p := &Parser{names: names, relevant: map[string]struct{}{}, text: expfmt.NewTextParser(model.UTF8Validation)}
	for _, n := range []string{names.Waiting, names.Running, names.KVCacheUsage, names.KVCacheUsageLegacy, names.LoRAInfo, names.CacheInfo} {
		if n == "" {
			continue
		}
		// expfmt files a sample named X_sum, X_count or X_bucket under family
		// X when X is a summary or histogram, and decides that from the lines
		// naming X, whose own family depends on X's base name in turn. So a
		// used family's lines are those of its name, its suffixed names and
		// the chain of its base names.
		for _, suffix := range []string{"", "_sum", "_count", "_bucket"} {
			p.relevant[n+suffix] = struct{}{}
		}
		for base := baseName(n); base != n; n, base = base, baseName(base) {
			p.relevant[base] = struct{}{}
		}
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
	p.reader.Reset(page)
	fams, err := p.text.TextToMetricFamilies(&p.reader)
	if err != nil {
		return datastore.Metrics{}, fmt.Errorf("malformed metrics page: %w", err)
	}
	return extract(fams, &p.names)
}

// filter copies the relevant lines of page into p.kept; false means a line's
// name is quoted and the page needs the full parser.
func (p *Parser) filter(page []byte) bool {
	p.kept = p.kept[:0]
	p.keptLines = p.keptLines[:0]
	line := 0
	for len(page) > 0 {
		line++
		end := bytes.IndexByte(page, '\n')
		next := end + 1
		if end < 0 {
			end, next = len(page), len(page)
		}
		name, quoted := lineName(page[:end])
		if quoted {
			return false
		}
		if len(name) > 0 {
			if _, ok := p.relevant[string(name)]; ok {
				p.kept = append(p.kept, page[:next]...)
				p.keptLines = append(p.keptLines, line)
			}
		}
		page = page[next:]
	}
	return true
}

// lineName returns the metric name a text-format line is about, read as
// expfmt reads it: a sample's name, or the name in a HELP or TYPE comment.
// Other lines give no name. quoted reports a name in the quoted UTF-8 form,
// which this reader leaves to expfmt.
func lineName(line []byte) (name []byte, quoted bool) {
	i := skipBlankTab(line, 0)
	if i == len(line) {
		return nil, false
	}
	switch line[i] {
	case '{', '"':
		return nil, true
	case '#':
		i = skipBlankTab(line, i+1)
		start := i
		for i < len(line) && line[i] != ' ' && line[i] != '\t' {
			i++
		}
		keyword := line[start:i]
		if i == len(line) || (string(keyword) != "HELP" && string(keyword) != "TYPE") {
			return nil, false
		}
		i = skipBlankTab(line, i)
		if i < len(line) && line[i] == '"' {
			return nil, true
		}
	}
	start := i
	if i < len(line) && isNameStart(line[i]) {
		for i++; i < len(line) && isNameContinuation(line[i]); i++ {
		}
	}
	if i < len(line) && line[i] == '"' {
		// expfmt reads on into a quoted part: foo"bar" names foobar.
		return nil, true
	}
	return line[start:i], false
}

func skipBlankTab(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	return i
}

func isNameStart(b byte) bool {
	return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_' || b == ':'
}

func isNameContinuation(b byte) bool {
	return isNameStart(b) || (b >= '0' && b <= '9')
}

// maxCount bounds queue and running counts; a larger value is not a real
// server's and would overflow int conversions.
const maxCount = 1 << 30

func extract(fams map[string]*dto.MetricFamily, n *MetricNames) (datastore.Metrics, error) {
	var m datastore.Metrics
	var err error
	if m.WaitingRequests, err = countFamily(fams, n.Waiting); err != nil {
		return m, err
	}
	if m.RunningRequests, err = countFamily(fams, n.Running); err != nil {
		return m, err
	}
	kvName := n.KVCacheUsage
	if _, ok := fams[kvName]; !ok && n.KVCacheUsageLegacy != "" {
		if _, ok := fams[n.KVCacheUsageLegacy]; ok {
			kvName = n.KVCacheUsageLegacy
		}
	}
	if m.KVCacheUsage, err = kvFamily(fams, kvName); err != nil {
		return m, err
	}
	if n.LoRAInfo != "" {
		if err := loraFamily(fams[n.LoRAInfo], &m); err != nil {
			return m, err
		}
	}
	if n.CacheInfo != "" {
		if err := cacheFamily(fams[n.CacheInfo], n, &m); err != nil {
			return m, err
		}
	}
	return m, nil
}

// values returns the sample values of a required scalar family.
func values(fams map[string]*dto.MetricFamily, name string, each func(float64) error) error {
	f, ok := fams[name]
	if !ok {
		return fmt.Errorf("metric %q missing from page", name)
	}
	for _, s := range f.Metric {
		v, err := scalar(f, s)
		if err != nil {
			return err
		}
		if math.IsNaN(v) || v < 0 {
			return fmt.Errorf("metric %q has invalid value %v", name, v)
		}
		if err := each(v); err != nil {
			return err
		}
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

// countFamily sums the family's series: a data-parallel server reports one
// series per engine.
func countFamily(fams map[string]*dto.MetricFamily, name string) (int, error) {
	sum := 0.0
	err := values(fams, name, func(v float64) error {
		sum += v
		if sum > maxCount {
			return fmt.Errorf("metric %q has implausible value %v", name, sum)
		}
		return nil
	})
	return int(math.Round(sum)), err
}

// kvFamily takes the fullest series: the picker must not overload the most
// loaded engine of a data-parallel server.
func kvFamily(fams map[string]*dto.MetricFamily, name string) (float64, error) {
	usage := 0.0
	err := values(fams, name, func(v float64) error {
		if v > 1 {
			return fmt.Errorf("metric %q has value %v outside 0..1", name, v)
		}
		usage = max(usage, v)
		return nil
	})
	return usage, err
}

// loraFamily reads the newest series (by value, a Unix time); ties go to the
// greatest label values so the answer does not depend on series order.
func loraFamily(f *dto.MetricFamily, m *datastore.Metrics) error {
	if f == nil {
		return nil
	}
	var best *dto.Metric
	var bestValue float64
	var bestKey [3]string
	for _, s := range f.Metric {
		v, err := scalar(f, s)
		if err != nil {
			return err
		}
		if math.IsNaN(v) {
			return fmt.Errorf("metric %q has invalid value NaN", f.GetName())
		}
		key := [3]string{labelValue(s, "running_lora_adapters"), labelValue(s, "waiting_lora_adapters"), labelValue(s, "max_lora")}
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
		n, err := strconv.Atoi(strings.TrimSpace(bestKey[2]))
		if err != nil || n < 0 {
			return fmt.Errorf("metric %q has max_lora %q, want a count", f.GetName(), bestKey[2])
		}
		m.MaxAdapters = n
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

func adapterList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// cacheFamily reads the cache geometry from the first series.
func cacheFamily(f *dto.MetricFamily, n *MetricNames, m *datastore.Metrics) error {
	if f == nil || len(f.Metric) == 0 {
		return nil
	}
	s := f.Metric[0]
	for _, l := range []struct {
		name string
		to   *int
	}{{n.BlockSizeLabel, &m.BlockSize}, {n.NumBlocksLabel, &m.NumBlocks}} {
		if l.name == "" {
			continue
		}
		v := labelValue(s, l.name)
		if v == "" {
			continue
		}
		// vLLM prints some counts as floats ("512.0").
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || x < 0 || x > maxCount || x != math.Trunc(x) {
			return fmt.Errorf("metric %q has %s %q, want a count", f.GetName(), l.name, v)
		}
		*l.to = int(x)
	}
	return nil
}

func labelValue(s *dto.Metric, name string) string {
	for _, l := range s.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
