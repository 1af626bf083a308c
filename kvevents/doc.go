// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package kvevents keeps, per pool and endpoint, the set of KV-cache blocks its model
// server says it holds, from the server's KV-cache events (vLLM's and
// SGLang's ZMQ publisher, as llm-d's simulator also speaks it), and computes a
// prompt's block keys the way those events name them.
//
// The wire format: a ZMQ PUB/SUB message of three frames [topic, sequence
// (8 bytes, big-endian), payload]; the topic is "kv@<endpoint>@<model>"; the
// payload a msgpack array [timestamp, [event...], data parallel rank
// (optional)] whose events are BlockStored, BlockRemoved and
// AllBlocksCleared, each either a positional array led by its tag or a map
// with named fields and the tag under "type". A ROUTER socket beside the
// publisher replays the batches from a sequence number on request.
//
// A subscription misses what its server publishes before the subscription
// reaches it (ZMQ's slow joiner), so each one asks the replay socket for
// the history it has not seen until its first message arrives; from then on
// a lost batch shows as a gap in the sequence numbers and is replayed. The
// sockets' connections refuse a frame or message beyond the message bound
// at its header, before anything of it is allocated.
//
// Block keys are the events' own when the server hashes as llm-d does (its
// simulator); for any other hash the index keeps its own keys, computed from
// the token ids each BlockStored event carries, and maps the server's hashes
// to them, so a prompt's keys (Hasher.Keys) match whichever the server uses.
package kvevents
