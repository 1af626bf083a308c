package datastore

// Policy is a pool's request policy from InferenceObjective and
// InferenceModelRewrite objects; immutable once published.
type Policy struct {
	// Objectives maps an InferenceObjective name to its priority.
	Objectives map[string]int
	// Rewrites maps a requested model (exact match) to its weighted targets.
	// When several rewrite objects claim one model, the oldest wins.
	Rewrites map[string][]RewriteTarget
}

// RewriteTarget is one weighted target model of a rewrite.
type RewriteTarget struct {
	Model  string
	Weight int32
	// Rewrite names the InferenceModelRewrite the target comes from.
	Rewrite string
}

// Priority returns the priority of the named objective, 0 when unknown or unnamed.
func (p *Policy) Priority(objective string) (priority int, found bool) {
	if p == nil || objective == "" {
		return 0, false
	}
	priority, found = p.Objectives[objective]
	return priority, found
}
