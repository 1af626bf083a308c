// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package peersync

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
)

// A stream is authenticated by the Secret every replica holds, in both
// directions, before any record is applied or sent:
//
//  1. the dialling replica opens the stream with a fresh random nonce
//     (nonceHeader), its id and the key's fingerprint;
//  2. the receiving replica answers in its headers with a nonce of its own
//     and its proof, an HMAC-SHA256 under the Secret of the transcript
//     (both nonces, both ids and, over TLS, the session's exported keying
//     material), which the dialler checks before it sends anything;
//  3. the dialler's first message is its own proof of the same transcript,
//     which the receiver checks before it reads a record;
//  4. every later message is a frame behind a tag: an HMAC under a key of
//     this stream (from the Secret and the transcript) of the message's
//     sequence number and the frame.
//
// The nonces make every transcript new, so nothing recorded from another
// stream is accepted; the keying material binds the proofs to the TLS
// session they were made in, so a relay in the middle (whose two sessions
// have different material) proves nothing; the tags keep a stream's frames
// whole and in order where it runs without TLS.

// Headers of the handshake.
const (
	// nonceHeader carries each side's nonce (hex).
	nonceHeader = "poolpicker-peer-sync-nonce"
	// proofHeader carries the receiver's proof (hex).
	proofHeader = "poolpicker-peer-sync-proof"
)

const (
	nonceBytes = 32
	// tagBytes is the length of a frame's tag: a truncated HMAC-SHA256.
	tagBytes = 16
	// MinSecretBytes is the shortest Secret New takes.
	MinSecretBytes = 16
	// ekmLabel is the TLS exporter label of the channel binding.
	ekmLabel = "EXPERIMENTAL-poolpicker-peer-sync"
)

var errUnauthenticated = errors.New("the peer did not prove it holds the peer-sync key")

// newNonce is a fresh random nonce in hex.
func newNonce() (string, error) {
	var b [nonceBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// validNonce reports whether s is a nonce as newNonce makes them.
func validNonce(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == nonceBytes
}

// channelBinding is the TLS session's exported keying material for the
// stream of ctx, nil without TLS; an error when the session is TLS but
// exports nothing (a version before TLS 1.3 without extended master
// secret), as a proof not bound to its session could be relayed.
func channelBinding(ctx context.Context) ([]byte, error) {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return nil, errors.New("no peer on the stream")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, nil
	}
	ekm, err := info.State.ExportKeyingMaterial(ekmLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("TLS session exports no keying material: %w", err)
	}
	return ekm, nil
}

// session is one stream's authenticated state on either side.
type session struct {
	transcript [sha256.Size]byte
	secret     []byte
	frameKey   []byte
	seq        uint64
}

// newSession hashes the transcript of a stream: the dialler's nonce and id,
// the receiver's nonce and id, and the channel binding.
func newSession(secret []byte, dialNonce, dialID, recvNonce, recvID string, binding []byte) *session {
	h := sha256.New()
	for _, part := range [][]byte{[]byte("poolpicker peer sync v1"), []byte(dialNonce), []byte(dialID), []byte(recvNonce), []byte(recvID), binding} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	s := &session{secret: secret}
	h.Sum(s.transcript[:0])
	s.frameKey = s.mac(secret, "frames")
	return s
}

func (s *session) mac(key []byte, role string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(role))
	m.Write([]byte{0})
	m.Write(s.transcript[:])
	return m.Sum(nil)
}

// The roles a proof is made for.
const (
	roleReceiver = "receiver"
	roleDialler  = "dialler"
)

// proof is the proof of the side of role.
func (s *session) proof(role string) []byte { return s.mac(s.secret, role) }

// checkProof reports whether got is the proof of role.
func (s *session) checkProof(role string, got []byte) bool {
	return hmac.Equal(got, s.proof(role))
}

// tag is the tag of the next message's frame.
func (s *session) tag(frame []byte) []byte {
	m := hmac.New(sha256.New, s.frameKey)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], s.seq)
	m.Write(n[:])
	m.Write(frame)
	return m.Sum(nil)[:tagBytes]
}

// seal returns the next message: the frame behind its tag.
func (s *session) seal(frame []byte) []byte {
	out := make([]byte, 0, tagBytes+len(frame))
	out = append(out, s.tag(frame)...)
	s.seq++
	return append(out, frame...)
}

// open checks the next message's tag and returns its frame.
func (s *session) open(msg []byte) ([]byte, error) {
	if len(msg) < tagBytes {
		return nil, fmt.Errorf("message of %d bytes, shorter than its tag", len(msg))
	}
	frame := msg[tagBytes:]
	if !hmac.Equal(msg[:tagBytes], s.tag(frame)) {
		return nil, errors.New("a frame whose tag does not match: changed, replayed or out of order")
	}
	s.seq++
	return frame, nil
}
