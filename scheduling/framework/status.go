// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import (
	"strconv"
	"strings"
)

// Code is what a plugin's Status says of a request, as kube-scheduler's
// status codes do.
type Code int

// Status codes. A nil *Status is Success.
const (
	// Success: the plugin did its job; a nil *Status says the same.
	Success Code = iota
	// Unschedulable: a filter dropped candidates by its rule (the reasons
	// say which rule); the request goes on with the candidates it kept.
	Unschedulable
	// Failed: the plugin could not do its job (kube-scheduler's Error). A
	// filter's Failed refuses the request; a scorer's drops its scores for
	// the request.
	Failed
)

var codeNames = [...]string{Success: "Success", Unschedulable: "Unschedulable", Failed: "Failed"}

func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.Itoa(int(c)) + ")"
}

// Status is a plugin's answer at a Filter or a Score: a code and the
// reasons, in words an operator can act on. nil means Success. A Status
// is immutable once returned, so a plugin may return one it made once
// (a reason without per-request values costs the pick no allocation).
type Status struct {
	code    Code
	reasons []string
}

// NewStatus returns a status of code with the reasons given.
func NewStatus(code Code, reasons ...string) *Status {
	return &Status{code: code, reasons: reasons}
}

// Code is the status's code; Success for nil.
func (s *Status) Code() Code {
	if s == nil {
		return Success
	}
	return s.code
}

// IsSuccess reports whether s is nil or of code Success.
func (s *Status) IsSuccess() bool { return s.Code() == Success }

// Reasons are the reasons given; shared, never to be modified.
func (s *Status) Reasons() []string {
	if s == nil {
		return nil
	}
	return s.reasons
}

// Message is the reasons joined by "; ".
func (s *Status) Message() string {
	if s == nil {
		return ""
	}
	return strings.Join(s.reasons, "; ")
}

// String is the code, then the message after ": " when there is one.
func (s *Status) String() string {
	if m := s.Message(); m != "" {
		return s.Code().String() + ": " + m
	}
	return s.Code().String()
}
