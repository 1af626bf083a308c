// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	// headingRE matches an ATX heading, with the explicit id attr_list reads
	// from a trailing {#id}.
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)(?:\s+\{#([\w-]+)\})?\s*$`)
	// linkRE matches an inline Markdown link's target, [text](target).
	linkRE  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fenceRE = regexp.MustCompile("^\\s*(```|~~~)")
)

// slug is Python-Markdown's toc slugify, which mkdocs uses for heading ids:
// inline markup and punctuation dropped, lower case, runs of spaces and
// hyphens turned into one hyphen.
func slug(title string) string {
	title = strings.NewReplacer("`", "", "*", "", "_", "_").Replace(title)
	// Link text stays, its target goes: [text](target) -> text.
	title = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(title, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r > unicode.MaxASCII:
			// NFKD then ASCII only: letters with accents keep their base;
			// the pages use none, and other symbols are dropped.
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-', unicode.IsSpace(r):
			b.WriteRune(r)
		}
	}
	s := strings.TrimSpace(b.String())
	return regexp.MustCompile(`[-\s]+`).ReplaceAllString(s, "-")
}

// anchors returns the ids of a page's headings, numbered as toc numbers
// repeated ones (id, id_1, id_2, ...).
func anchors(page string) map[string]bool {
	ids := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(page, "\n") {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		id := m[2]
		if id == "" {
			id = slug(m[1])
		}
		for n, base := 1, id; ids[id]; n++ {
			id = base + "_" + strconv.Itoa(n)
		}
		ids[id] = true
	}
	return ids
}

// links returns the link targets of a page outside code blocks and spans.
func links(page string) []string {
	var out []string
	inFence := false
	for _, line := range strings.Split(page, "\n") {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// TestLinksResolve: every link from one page of site-src to another (or to an
// image) names a file that exists, and every #anchor names a heading of the
// page it points at. mkdocs build --strict checks the pages but, in the
// versions Debian ships, not the anchors.
func TestLinksResolve(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "site-src")
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no pages under %s: %v", dir, err)
	}
	pages := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pages[filepath.Base(f)] = string(b)
	}
	checked := 0
	for name, page := range pages {
		for _, target := range links(page) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			if file == "" {
				file = name
			}
			checked++
			if !strings.HasSuffix(file, ".md") {
				if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
					t.Errorf("%s links to %s, which does not exist", name, target)
				}
				continue
			}
			to, ok := pages[file]
			if !ok {
				t.Errorf("%s links to %s: no page %s", name, target, file)
				continue
			}
			if anchor != "" && !anchors(to)[anchor] {
				t.Errorf("%s links to %s: %s has no heading with id %q", name, target, file, anchor)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d links found: the link pattern no longer matches the pages", checked)
	}
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ title, want string }{
		{"Peer sync", "peer-sync"},
		{"ext_proc TLS and client certificates", "ext_proc-tls-and-client-certificates"},
		{"Scrapes on a poller", "scrapes-on-a-poller"},
		{"`--pool-name` and friends", "-pool-name-and-friends"},
		{"1,000 and 10,000 pools", "1000-and-10000-pools"},
		{"Where a new prefix goes", "where-a-new-prefix-goes"},
	} {
		if got := slug(tc.title); got != tc.want {
			t.Errorf("slug(%q) = %q, want %q", tc.title, got, tc.want)
		}
	}
}

// repoRoot is the directory of the module's go.mod above the test's own.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
