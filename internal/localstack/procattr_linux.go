// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build linux

package localstack

import "syscall"

// procAttr starts a process in a group of its own, killed when this
// process dies. Pdeathsig fires when the forking thread exits; the Go
// runtime retires only threads whose goroutine exits locked to them,
// which never happens here, so it fires when this process dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group pid leads.
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }
