// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Metric selects series of one metric family: all of them, or those whose
// labels carry the values in Match.
type Metric struct {
	Name string
	// Match maps label names to the value a read series carries; an empty
	// value matches a series without the label, as in PromQL.
	Match map[string]string
}

// ParseMetric reads a metric selector as the reference picker's flags and
// engine configs write one: a name, optionally followed by equality
// matchers in braces, whose values may be quoted or not:
// nv_trt_llm_request_metrics{request_type=waiting}. The whole selector may
// be in double quotes, as the reference picker's Helm chart passes it.
func ParseMetric(s string) (Metric, error) {
	bad := func(why string) (Metric, error) {
		return Metric{}, fmt.Errorf("metric selector %q: %s", s, why)
	}
	rest := strings.TrimSpace(s)
	if len(rest) >= 2 && rest[0] == '"' && rest[len(rest)-1] == '"' {
		rest = strings.TrimSpace(rest[1 : len(rest)-1])
	}
	i := 0
	for i < len(rest) && nameChar[rest[i]]&continuation != 0 {
		i++
	}
	m := Metric{Name: rest[:i]}
	if m.Name == "" || nameChar[m.Name[0]]&nameStart == 0 {
		return bad("want a metric name first")
	}
	rest = strings.TrimSpace(rest[i:])
	if rest == "" {
		return m, nil
	}
	if rest[0] != '{' || rest[len(rest)-1] != '}' {
		return bad("want only label matchers in braces after the name")
	}
	rest = rest[1 : len(rest)-1]
	m.Match = map[string]string{}
	for {
		rest = strings.TrimSpace(rest)
		if rest == "" {
			break
		}
		j := 0
		for j < len(rest) && nameChar[rest[j]]&continuation != 0 && rest[j] != ':' {
			j++
		}
		label := rest[:j]
		if label == "" || nameChar[label[0]]&nameStart == 0 {
			return bad("want a label name")
		}
		rest = strings.TrimSpace(rest[j:])
		if !strings.HasPrefix(rest, "=") || strings.HasPrefix(rest, "=~") {
			return bad("label " + label + ": want label=value (no other matchers)")
		}
		rest = strings.TrimSpace(rest[1:])
		var value string
		if strings.HasPrefix(rest, `"`) {
			var ok bool
			value, rest, ok = unquoteLabelValue(rest[1:])
			if !ok {
				return bad("label " + label + ": unterminated or badly escaped quoted value")
			}
		} else {
			k := strings.IndexAny(rest, ",} \t\"")
			if k < 0 {
				k = len(rest)
			}
			value, rest = rest[:k], rest[k:]
		}
		if _, dup := m.Match[label]; dup {
			return bad("label " + label + " matched twice")
		}
		m.Match[label] = value
		rest = strings.TrimSpace(rest)
		if rest == "" {
			break
		}
		if rest[0] != ',' {
			return bad("want a comma between label matchers")
		}
		rest = rest[1:]
	}
	if len(m.Match) == 0 {
		m.Match = nil
	}
	return m, nil
}

// unquoteLabelValue reads a quoted label value after its opening quote, with
// the text format's escapes (\\, \", \n); it returns the value and the text
// after the closing quote.
func unquoteLabelValue(s string) (value, rest string, ok bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], true
		case '\\':
			if i+1 == len(s) {
				return "", "", false
			}
			i++
			switch s[i] {
			case '\\', '"':
				b.WriteByte(s[i])
			case 'n':
				b.WriteByte('\n')
			default:
				return "", "", false
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

// mustMetric parses a selector of the engine table.
func mustMetric(s string) Metric {
	m, err := ParseMetric(s)
	if err != nil {
		panic(err)
	}
	return m
}

// String writes the selector back, labels sorted, values quoted where the
// plain form would not read back.
func (m Metric) String() string {
	if len(m.Match) == 0 {
		return m.Name
	}
	var b strings.Builder
	b.WriteString(m.Name)
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m.Match)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		v := m.Match[k]
		if v != "" && !strings.ContainsAny(v, ",} \t\"\\\n") {
			b.WriteString(v)
			continue
		}
		b.WriteByte('"')
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func (m Metric) equal(o Metric) bool { return m.Name == o.Name && maps.Equal(m.Match, o.Match) }

// selects reports whether the series is one the selector reads.
func (m *Metric) selects(s *dto.Metric) bool {
	for k, v := range m.Match {
		if labelValue(s, k) != v {
			return false
		}
	}
	return true
}
