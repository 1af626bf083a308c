// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package requestcontrol carries one request through its life once its
// pool and body are known: admission (by flow control, else the shedding of
// a sheddable request from a saturated pool), the model the request is sent
// as (the pool's rewrite rules), scheduling, the in-flight count on the
// endpoint that serves it, and the end of all of that, exactly once. The
// scheduler only filters, scores and picks.
//
// The ext_proc server (package extproc) owns the protocol: the stream's
// state machine, its headers and body, and every answer sent to the
// gateway. It hands this package what it read (a Request) and turns what
// comes back (a Decision, or a Refusal) into answers. The life, in order:
//
//	Pick     admit (flow control, else shed), rewrite, schedule, admit per endpoint
//	Commit   the decision leaves: count the request on its endpoint
//	Sent     the answer is sent: the scheduler learns from its pick
//	Served   the gateway reports the endpoint that served: move the count
//	Finish   the response ended, or the stream did: uncount, once
//
// A Request belongs to its stream and is not safe for concurrent use; the
// stream calls it under the lock it holds while handling a message. The
// Controller is shared by every stream and holds nothing mutable.
package requestcontrol
