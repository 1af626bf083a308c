// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bytes"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
)

// plainParse reads the kept lines when every one is of the plain form real
// pages use (a sample `name{label="value",...} value` with no escapes, no
// timestamp and single spaces, or `# TYPE name gauge|counter|untyped`),
// into families built from the parser's reused objects: no allocation once
// the parser has seen a page like it. Anything else (HELP, histograms and
// summaries, escapes, timestamps, a family's samples apart or typed after
// them, a repeated series) returns false and expfmt reads the lines, so
// the result and the errors are always expfmt's.
func (p *Parser) plainParse() (map[string]*dto.MetricFamily, bool) {
	if p.fams == nil {
		p.fams = map[string]*dto.MetricFamily{}
		p.strs = map[string]string{}
	}
	clear(p.fams)
	clear(p.series)
	p.nFam, p.nMet, p.nLabel = 0, 0, 0
	var cur *dto.MetricFamily // the family of the last sample
	for rest := p.kept; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return nil, false // expfmt wants the last line ended
		}
		line := rest[:i]
		rest = rest[i+1:]
		if len(line) > 0 && line[0] == '#' {
			name, typ, ok := typeLine(line)
			if !ok {
				return nil, false
			}
			if _, seen := p.fams[string(name)]; seen {
				return nil, false // a second TYPE, or TYPE after samples
			}
			f := p.family(name)
			f.Type = &p.types[typ]
			continue
		}
		name, labels, value, ok := sampleLine(line)
		if !ok {
			return nil, false
		}
		f, seen := p.fams[string(name)]
		switch {
		case !seen:
			f = p.family(name)
		case f != cur && len(f.Metric) > 0:
			return nil, false // the family's samples apart
		}
		cur = f
		m := p.metric()
		for len(labels) > 0 {
			var k, v []byte
			k, v, labels = nextLabel(labels)
			l := p.label()
			*l.Name, *l.Value = p.intern(k), p.intern(v)
			m.Label = append(m.Label, l)
		}
		if !p.firstSeries(f, m) {
			// A repeated label, or a series seen before (or a hash shared
			// by two series): expfmt's answer.
			return nil, false
		}
		h := p.holders[p.nMet-1]
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			m.Gauge = &h.gauge
			m.Gauge.Value = &h.value
		case dto.MetricType_COUNTER:
			m.Counter = &h.counter
			m.Counter.Value = &h.value
		default:
			m.Untyped = &h.untyped
			m.Untyped.Value = &h.value
		}
		h.value = value
		f.Metric = append(f.Metric, m)
	}
	// expfmt drops the families that got a TYPE and no sample.
	for name, f := range p.fams {
		if len(f.Metric) == 0 {
			delete(p.fams, name)
		}
	}
	return p.fams, true
}

// valueHolder holds a reused metric's value, of whichever type.
type valueHolder struct {
	gauge   dto.Gauge
	counter dto.Counter
	untyped dto.Untyped
	value   float64
}

// family returns a reused, emptied family named name, filed in p.fams.
func (p *Parser) family(name []byte) *dto.MetricFamily {
	if p.nFam == len(p.famArena) {
		p.famArena = append(p.famArena, &dto.MetricFamily{Name: new(string)})
	}
	f := p.famArena[p.nFam]
	p.nFam++
	*f.Name = p.intern(name)
	f.Type = &p.types[dto.MetricType_UNTYPED]
	f.Metric = f.Metric[:0]
	p.fams[*f.Name] = f
	return f
}

// metric returns a reused, emptied metric; its value's holder is
// p.holders at the same index.
func (p *Parser) metric() *dto.Metric {
	if p.nMet == len(p.metArena) {
		p.metArena = append(p.metArena, &dto.Metric{})
		p.holders = append(p.holders, &valueHolder{})
	}
	m := p.metArena[p.nMet]
	p.nMet++
	m.Label = m.Label[:0]
	m.Gauge, m.Counter, m.Untyped = nil, nil, nil
	return m
}

func (p *Parser) label() *dto.LabelPair {
	if p.nLabel == len(p.labelArena) {
		p.labelArena = append(p.labelArena, &dto.LabelPair{Name: new(string), Value: new(string)})
	}
	l := p.labelArena[p.nLabel]
	p.nLabel++
	return l
}

// intern returns b as a string, allocated once per distinct value a
// parser sees (up to a bound; label values of hostile pages do not grow
// it without end).
func (p *Parser) intern(b []byte) string {
	if s, ok := p.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(p.strs) < maxInterned {
		p.strs[s] = s
	}
	return s
}

// maxInterned bounds a parser's interned strings.
const maxInterned = 1024

// firstSeries reports whether m's labels have no name twice and name a
// series not seen before on the page, in time linear in its labels: each
// series is known by a hash of its family and its labels sorted by name.
// Two series sharing a hash read as a repeat, which sends the page to
// expfmt; the answer is still expfmt's.
func (p *Parser) firstSeries(f *dto.MetricFamily, m *dto.Metric) bool {
	if p.series == nil {
		p.series = map[uint64]struct{}{}
		p.seed = maphash.MakeSeed()
	}
	key := maphash.String(p.seed, *f.Name)
	labels := m.Label
	if len(labels) > 1 {
		p.order = append(p.order[:0], labels...)
		slices.SortFunc(p.order, func(a, b *dto.LabelPair) int { return strings.Compare(*a.Name, *b.Name) })
		labels = p.order
	}
	for i, l := range labels {
		if i > 0 && *l.Name == *labels[i-1].Name {
			clear(p.order)
			return false // expfmt refuses a repeated label
		}
		key = (key ^ maphash.String(p.seed, *l.Name)) * 0x9e3779b97f4a7c15
		key = (key ^ maphash.String(p.seed, *l.Value)) * 0xc2b2ae3d27d4eb4f
	}
	clear(p.order)
	if _, seen := p.series[key]; seen {
		return false
	}
	p.series[key] = struct{}{}
	return true
}

// typeLine reads "# TYPE name gauge|counter|untyped".
func typeLine(line []byte) (name []byte, typ dto.MetricType, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte("# TYPE "))
	if !ok {
		return nil, 0, false
	}
	name, kind, ok := bytes.Cut(rest, []byte(" "))
	if !ok || !plainName(name) {
		return nil, 0, false
	}
	switch string(kind) {
	case "gauge":
		return name, dto.MetricType_GAUGE, true
	case "counter":
		return name, dto.MetricType_COUNTER, true
	case "untyped":
		return name, dto.MetricType_UNTYPED, true
	}
	return nil, 0, false
}

// sampleLine reads `name{labels} value` or `name value`; labels are the
// text between the braces, checked by it.
func sampleLine(line []byte) (name, labels []byte, value float64, ok bool) {
	i := 0
	for i < len(line) && nameChar[line[i]]&continuation != 0 {
		i++
	}
	name = line[:i]
	if !plainName(name) || i == len(line) {
		return nil, nil, 0, false
	}
	if line[i] == '{' {
		end := bytes.IndexByte(line[i:], '}')
		if end < 0 {
			return nil, nil, 0, false
		}
		labels = line[i+1 : i+end]
		if !plainLabels(labels) {
			return nil, nil, 0, false
		}
		i += end + 1
	}
	if i == len(line) || line[i] != ' ' {
		return nil, nil, 0, false
	}
	v := line[i+1:]
	if len(v) == 0 {
		return nil, nil, 0, false
	}
	for _, c := range v {
		if !(c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
			return nil, nil, 0, false // NaN, Inf, a timestamp, anything else: expfmt's
		}
	}
	value, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return nil, nil, 0, false
	}
	return name, labels, value, true
}

// plainLabels checks `k="v",k="v"` (at least one pair, no trailing comma,
// label names of the legacy charset not starting with __, values with no
// backslash, valid UTF-8).
func plainLabels(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for len(b) > 0 {
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 || !plainLabelName(b[:eq]) || eq+1 >= len(b) || b[eq+1] != '"' {
			return false
		}
		b = b[eq+2:]
		q := bytes.IndexByte(b, '"')
		if q < 0 || bytes.IndexByte(b[:q], '\\') >= 0 || !utf8.Valid(b[:q]) {
			return false
		}
		b = b[q+1:]
		if len(b) == 0 {
			return true
		}
		if b[0] != ',' || len(b) == 1 {
			return false
		}
		b = b[1:]
	}
	return true
}

// nextLabel splits the first pair off labels checked by plainLabels.
func nextLabel(b []byte) (k, v, rest []byte) {
	eq := bytes.IndexByte(b, '=')
	k, b = b[:eq], b[eq+2:]
	q := bytes.IndexByte(b, '"')
	v, rest = b[:q], b[q+1:]
	if len(rest) > 0 {
		rest = rest[1:]
	}
	return k, v, rest
}

func plainName(n []byte) bool {
	return len(n) > 0 && nameChar[n[0]]&nameStart != 0
}

func plainLabelName(n []byte) bool {
	if len(n) == 0 || bytes.HasPrefix(n, []byte("__")) || n[0] == ':' || nameChar[n[0]]&nameStart == 0 {
		return false
	}
	for _, c := range n {
		if c == ':' || nameChar[c]&continuation == 0 {
			return false
		}
	}
	return true
}
