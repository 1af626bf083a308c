// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package modelsim simulates an OpenAI-compatible model server (vLLM-like) on a
// real socket, so that poolpicker can be run and tested end to end without GPUs.
//
// A Server answers /v1/completions, /v1/chat/completions (JSON and SSE
// streaming, with usage), /v1/models, /health and a vLLM-sized /metrics page.
// Behind the API sits a small engine that behaves like a continuous-batching
// server where it matters to a picker: at most MaxNumSeqs sequences run at
// once and the rest wait in a FIFO queue; per-token latency rises with the
// number of running sequences; the KV cache is a fixed number of blocks with
// prefix reuse (a cached prompt prefix is not prefilled again, which cuts the
// time to first token) and LRU eviction of unused cached blocks; LoRA adapters
// occupy at most MaxLoRAs slots at once.
//
// Generated text, token counts and jitter are a pure function of the seed, the
// model and the prompt; only timings depend on the load the server sees.
package modelsim
