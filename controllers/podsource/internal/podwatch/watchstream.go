// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podwatch

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// eventSource is one watch response's events, read by the pod watch's own
// goroutine.
type eventSource interface {
	// next blocks for the next event; more reports whether part of another
	// has arrived already (a burst goes on), ok false that the watch ended.
	next(ctx context.Context) (ev watch.Event, more, ok bool)
	stop()
}

// streamEvents decodes a protobuf watch response on the goroutine that
// reads it. client-go's watch.Interface spends a goroutine per stream on
// decoding into a channel, and keeps a decoding buffer grown to the largest
// event (the streaming list's) for the stream's life; thousands of pool
// watches make both add up. Here a frame's buffer is borrowed from a pool
// for its decoding only, and what stays per stream is a 512-byte reader.
type streamEvents struct {
	body io.ReadCloser
	r    *bufio.Reader
	// err is why the stream ended, for the log.
	err error
}

// watchContentType asks for protobuf watch frames: a length, then a
// metav1.WatchEvent whose object is a protobuf-encoded pod.
const watchContentType = "application/vnd.kubernetes.protobuf;stream=watch"

// maxWatchFrame bounds one event: a pod is a few kilobytes; a larger frame
// means the stream is not what was asked for.
const maxWatchFrame = 16 << 20

// errNotProtobuf is a watch answered in another encoding (a proxy in the
// way): the pod watches use client-go's decoder instead from then on.
var errNotProtobuf = errors.New("the API server answered a protobuf watch in another encoding")

var (
	watchEventSerializer = protobuf.NewRawSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme)
	// The object inside an event is a protobuf-encoded pod (or a Status for
	// an error): decoded directly, without trying other encodings first.
	watchObjectDecoder = protobuf.NewSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme)
	frameBuffers       = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}
)

// openStreamEvents starts a watch of the namespace's pods with opts through
// rc, which paces it (client QPS) and retries it when the API server says
// to (429 or 5xx with Retry-After, as priority and fairness answers).
func openStreamEvents(ctx context.Context, rc rest.Interface, namespace string, opts metav1.ListOptions) (*streamEvents, error) {
	opts.Watch = true
	req := rc.Get().Namespace(namespace).Resource("pods").
		VersionedParams(&opts, clientgoscheme.ParameterCodec).
		SetHeader("Accept", watchContentType)
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	body, err := req.Stream(ctx)
	if err != nil {
		return nil, err
	}
	s := &streamEvents{body: body, r: bufio.NewReaderSize(body, 512)}
	// A JSON stream starts with '{'; a protobuf frame with its length's
	// high byte, 0 for any frame under 16 MiB.
	if b, err := s.r.Peek(1); err == nil && b[0] != 0 {
		body.Close()
		return nil, errNotProtobuf
	}
	return s, nil
}

func (s *streamEvents) next(context.Context) (watch.Event, bool, bool) {
	ev, err := s.decode()
	if err != nil {
		s.err = err
		return watch.Event{}, false, false
	}
	return ev, s.r.Buffered() > 0, true
}

func (s *streamEvents) decode() (watch.Event, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return watch.Event{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxWatchFrame {
		return watch.Event{}, fmt.Errorf("watch frame of %d bytes exceeds %d", n, maxWatchFrame)
	}
	bp := frameBuffers.Get().(*[]byte)
	if cap(*bp) < int(n) {
		*bp = make([]byte, n)
	}
	defer func() {
		// An odd huge pod is not worth keeping a buffer for.
		if cap(*bp) <= 64<<10 {
			frameBuffers.Put(bp)
		}
	}()
	buf := (*bp)[:n]
	if _, err := io.ReadFull(s.r, buf); err != nil {
		return watch.Event{}, err
	}
	// Decoding copies what it keeps: the buffer goes back to the pool.
	var we metav1.WatchEvent
	if _, _, err := watchEventSerializer.Decode(buf, nil, &we); err != nil {
		return watch.Event{}, fmt.Errorf("decoding a watch event: %w", err)
	}
	obj, _, err := watchObjectDecoder.Decode(we.Object.Raw, nil, nil)
	if err != nil {
		return watch.Event{}, fmt.Errorf("decoding a watch event's %s object: %w", we.Type, err)
	}
	return watch.Event{Type: watch.EventType(we.Type), Object: obj}, nil
}

func (s *streamEvents) stop() { s.body.Close() }

// chanEvents is client-go's watch.Interface, for API servers that do not
// answer watches in protobuf.
type chanEvents struct{ w watch.Interface }

func (c chanEvents) next(ctx context.Context) (watch.Event, bool, bool) {
	select {
	case <-ctx.Done():
		return watch.Event{}, false, false
	case ev, open := <-c.w.ResultChan():
		return ev, len(c.w.ResultChan()) > 0, open
	}
}

func (c chanEvents) stop() { c.w.Stop() }
