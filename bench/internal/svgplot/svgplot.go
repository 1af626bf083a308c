// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package svgplot draws the pieces the benchmarks' SVG line plots share.
package svgplot

import (
	"fmt"
	"strings"
)

// Series draws one line through pts ("x,y" each) with a dot on every point.
func Series(b *strings.Builder, pts []string, color string) {
	fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), color)
	for _, pt := range pts {
		x, y, _ := strings.Cut(pt, ",")
		fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`+"\n", x, y, color)
	}
}

// LegendEntry draws a short line of color at x, y and its label after it.
func LegendEntry(b *strings.Builder, x, y int, color, label string) {
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`, x, x+20, y, y, color)
	fmt.Fprintf(b, `<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", x+26, y, label)
}
