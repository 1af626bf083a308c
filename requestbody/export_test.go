package requestbody

// ParseSkimming is Parse that also returns the byte ranges it only
// skimmed, where a defect goes unnoticed.
func ParseSkimming(body []byte, kind Kind, promptLimit int) (*Request, [][2]int, error) {
	var skimmed [][2]int
	sc := NewScanner(kind, promptLimit)
	sc.skimmed = func(start, end int) { skimmed = append(skimmed, [2]int{start, end}) }
	_ = sc.Feed(body, true)
	rb, err := sc.Result(body)
	return rb, skimmed, err
}

// ErrPromptFull never leaves the package.
var ErrPromptFull = errPromptFull
