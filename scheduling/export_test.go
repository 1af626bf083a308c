// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"context"

	"github.com/poolpicker/poolpicker/datastore"
)

// Schedule is ScheduleDeferred with its post-pick step run before it
// returns, as a caller that commits at once does.
func (s *Scheduler) Schedule(ctx context.Context, pool *datastore.Pool, req *Request) (*Result, error) {
	res, err := s.ScheduleDeferred(ctx, pool, req)
	res.Commit()
	return res, err
}
