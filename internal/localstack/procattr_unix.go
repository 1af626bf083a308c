// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build unix && !linux

package localstack

import "syscall"

// procAttr starts a process in a group of its own. Without Linux's
// parent-death signal, a stack whose parent was killed outright is left
// for the next start, which finds its ports taken and says so.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killGroup kills the process group pid leads.
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }
