// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build linux && !portablefetch

package fetch

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A poller runs the http scrapes of its servers on one goroutine over an
// epoll set of their connections: it dials, sends each GET, reads what is
// ready and parses the pages that are whole, many scrapes per wake-up. A
// goroutine per scrape made every answer a goroutine to schedule, and at
// ten thousand scrapes a second those goroutines kept Go's run queues from
// ever running dry; the runtime looks for ready sockets, the picks'
// among them, only when they do (or every 10 ms), so picks waited
// milliseconds for a core that was free for them. A poller is one
// goroutine: it holds at most one core, and its epoll set is itself in
// the runtime's poller, so it waits there and not in a system call.
type poller struct {
	epfd int
	file *os.File // epfd, registered with the runtime's poller
	raw  syscall.RawConn
	evfd int // an eventfd in the set: new scrapes or cancellations
	o    Options

	mu       sync.Mutex
	queued   []*Conn // submitted, not started
	cancels  []*Conn
	closed   bool
	sleeping atomic.Bool  // the goroutine waits: a submission wakes it
	tid      atomic.Int32 // the goroutine's thread, once it runs (tests)

	// The goroutine's own.
	inflight map[int32]*Conn
	first    *Conn // in-flight scrapes by deadline, the earliest first
	last     *Conn
	deadline time.Time // the one set on file
	touched  []*Conn   // the scrapes this wake-up worked on
	finished []*Conn
	seq      uint32
	// attributed is the CPU time of this wake-up charged to one exchange
	// (its page's parse).
	attributed time.Duration

	// aside parses the large pages (asidePageBytes), on a thread of its
	// own: asideN counts those handed to it and not yet back in parsed.
	aside   chan *Conn
	asideN  int
	parsed  []*Conn // under mu
	gotBack chan struct{}
}

// asidePageBytes is the size past which a page is decoded and parsed on
// the poller's aside goroutine rather than on the poller: a page's parse
// is linear in its size, but a megabyte of series the picker reads still
// takes tens of milliseconds, which on the poller would hold every other
// server's scrape (at its lowered priority, on a loaded machine, ten
// times as long). A vLLM page is a few to a few tens of kilobytes, and
// one of asidePageBytes of series parses in about two milliseconds.
const asidePageBytes = 128 << 10

// sysConn is a Conn's kept socket (-1: none).
type sysConn struct{ fd int }

func newSysConn() sysConn { return sysConn{fd: -1} }

// Close closes c's kept connection, which no exchange may be using,
// reporting whether there was one.
func (c *Conn) Close() bool {
	if c.sys.fd < 0 {
		return false
	}
	unix.Close(c.sys.fd)
	c.sys.fd = -1
	return true
}

// Connected reports whether c keeps a connection.
func (c *Conn) Connected() bool { return c.sys.fd >= 0 }

// New returns the fetcher of this platform: an epoll poller.
func New(o Options) (Fetcher, error) { return newPoller(o) }

func newPoller(o Options) (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("scrape poller: epoll_create1: %w", err)
	}
	// Non-blocking, so that os.NewFile registers it with the runtime's
	// poller: the set is readable while one of its sockets is ready.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("scrape poller: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("scrape poller: eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, fmt.Errorf("scrape poller: %w", err)
	}
	file := os.NewFile(uintptr(epfd), "scrape-epoll")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		unix.Close(evfd)
		return nil, fmt.Errorf("scrape poller: %w", err)
	}
	return &poller{
		epfd: epfd, file: file, raw: raw, evfd: evfd,
		o: o, inflight: map[int32]*Conn{},
		// Every connection has at most one exchange: a few hundred
		// queued is a backlog of costly pages, which beyond it are
		// parsed on the poller.
		aside: make(chan *Conn, 256), gotBack: make(chan struct{}, 1),
	}, nil
}

// submit starts a scrape of s; its end is reported to complete. After the
// poller has stopped, it is reported cancelled at once.
func (p *poller) Submit(s *Conn) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.o.Complete(s, Result{Cancelled: true})
		return
	}
	p.queued = append(p.queued, s)
	p.mu.Unlock()
	p.wake()
}

// cancel ends s's scrape, submitted or in flight, as cancelled.
func (p *poller) Cancel(s *Conn) {
	s.cancelled.Store(true)
	p.mu.Lock()
	p.cancels = append(p.cancels, s)
	p.mu.Unlock()
	p.wake()
}

func (p *poller) wake() {
	if p.sleeping.Swap(false) {
		var one = [8]byte{1}
		unix.Write(p.evfd, one[:]) //nolint:errcheck // a full counter wakes it as well
	}
}

// stop ends the goroutine: every scrape submitted or in flight is reported
// cancelled, and later ones are at once.
func (p *poller) Stop() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.sleeping.Store(true)
	p.wake()
}

// run is the poller's goroutine, until stop; then it closes its set.
func (p *poller) Run() {
	defer func() {
		p.file.Close()
		unix.Close(p.evfd)
	}()
	p.tid.Store(int32(lowerPriority()))
	asideDone := make(chan struct{})
	go p.parseAside(asideDone)
	defer func() {
		close(p.aside)
		<-asideDone
	}()
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := p.wait(events)
		if err != nil {
			// The set itself failed: nothing can be read any more.
			panic(fmt.Sprintf("scrape poller: epoll_wait: %v", err))
		}
		startCPU, startWall := ThreadCPU(), time.Now()
		for _, ev := range events[:n] {
			if int(ev.Fd) == p.evfd {
				var b [8]byte
				unix.Read(p.evfd, b[:]) //nolint:errcheck // drained; EAGAIN when already
				continue
			}
			s := p.inflight[ev.Fd]
			if s == nil || s.x.seq != uint32(ev.Pad) {
				continue
			}
			p.touch(s)
			p.progress(s)
		}
		p.mu.Lock()
		queued, cancels, closed, parsed := p.queued, p.cancels, p.closed, p.parsed
		p.queued, p.cancels, p.parsed = p.queued[len(p.queued):], p.cancels[len(p.cancels):], nil
		p.mu.Unlock()
		for _, s := range parsed {
			p.touch(s)
			p.backFromAside(s)
		}
		for _, s := range cancels {
			// One being parsed aside ends when it is back.
			if s.x.active && !s.x.aside && s.cancelled.Load() {
				p.touch(s)
				p.end(s, Result{Cancelled: true})
			}
		}
		now := time.Now()
		for _, s := range queued {
			p.touch(s)
			p.start(s, now)
		}
		for s := p.first; s != nil && !now.Before(s.x.deadline); s = p.first {
			p.touch(s)
			p.end(s, Result{Err: Failure("timeout", "GET %s: timed out after %v (%d bytes read)", s.URL, p.o.Timeout, s.x.read)})
		}
		if closed {
			for p.first != nil {
				p.end(p.first, Result{Cancelled: true})
			}
			// The pages being parsed aside end as they come back.
			for p.asideN > 0 {
				<-p.gotBack
				p.mu.Lock()
				parsed := p.parsed
				p.parsed = nil
				p.mu.Unlock()
				for _, s := range parsed {
					p.backFromAside(s)
				}
			}
		}
		p.account(startCPU, startWall)
		for _, s := range p.finished {
			r := s.x.result
			s.x.result = Result{}
			p.o.Complete(s, r)
		}
		clear(p.finished)
		p.finished = p.finished[:0]
		if closed {
			// Every scrape submitted before stop was taken above; later
			// ones were reported cancelled by submit.
			return
		}
	}
}

// pollerNice is how much lower than the process's the priority of a
// poller's thread is: the kernel runs a pick's threads before it
// whenever both are runnable, and gives it all the CPU nothing else
// wants. The budget bounds its share of the process's goroutines; a
// core's other runnable threads of equal priority would otherwise share
// that core with it turn about, a pick waiting its turn.
const pollerNice = 10

// lowerPriority locks the calling goroutine to its thread, for good (the
// thread ends with the goroutine, its priority never passed on), and
// lowers the thread's priority by pollerNice. Where the kernel refuses,
// the poller runs at the process's priority.
func lowerPriority() (tid int) {
	runtime.LockOSThread()
	tid = unix.Gettid()
	// The raw value is 20 - nice.
	if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil {
		unix.Setpriority(unix.PRIO_PROCESS, tid, min(20-prio+pollerNice, 19)) //nolint:errcheck // best effort
	}
	return tid
}

// wait returns the ready events, waiting in the runtime's poller (until
// the earliest deadline) while there are none and nothing was submitted.
func (p *poller) wait(events []unix.EpollEvent) (int, error) {
	if d := p.nextDeadline(); !d.Equal(p.deadline) {
		p.deadline = d
		p.file.SetReadDeadline(d) //nolint:errcheck // the set is pollable
	}
	p.sleeping.Store(true)
	p.mu.Lock()
	pending := len(p.queued) > 0 || len(p.cancels) > 0 || len(p.parsed) > 0 || p.closed
	p.mu.Unlock()
	if pending {
		p.sleeping.Store(false)
		n, err := unix.EpollWait(p.epfd, events, 0)
		if errors.Is(err, unix.EINTR) {
			return 0, nil
		}
		return n, err
	}
	var n int
	var werr error
	err := p.raw.Read(func(uintptr) bool {
		n, werr = unix.EpollWait(p.epfd, events, 0)
		if errors.Is(werr, unix.EINTR) {
			n, werr = 0, nil
		}
		return n > 0 || werr != nil
	})
	p.sleeping.Store(false)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, err
	}
	return n, werr
}

func (p *poller) nextDeadline() time.Time {
	if p.first == nil {
		return time.Time{}
	}
	return p.first.x.deadline
}

// touch notes that this wake-up works on s, whose scrape shares its CPU.
func (p *poller) touch(s *Conn) { p.touched = append(p.touched, s) }

// account shares the CPU time of the wake-up between the scrapes it
// worked on.
func (p *poller) account(startCPU time.Duration, startWall time.Time) {
	if len(p.touched) == 0 {
		return
	}
	d := min(max(ThreadCPU()-startCPU, 0), time.Since(startWall))
	d = max(d-p.attributed, 0)
	p.attributed = 0
	each := d / time.Duration(len(p.touched))
	for _, s := range p.touched {
		s.x.result.CPU += each
	}
	clear(p.touched)
	p.touched = p.touched[:0]
}

// maxReadPerTurn bounds what one connection's event reads before the
// poller turns to the others' events and to the deadlines: a server that
// keeps its socket full never makes a read wait, and would otherwise hold
// the poller until its bytes ran out.
const maxReadPerTurn = 256 << 10

// start begins s's exchange: on its kept connection, or a new one.
func (p *poller) start(s *Conn, now time.Time) {
	x := &s.x
	p.seq++
	x.begin(now.Add(p.o.Timeout))
	x.seq = p.seq
	p.link(s)
	if s.cancelled.Load() {
		p.end(s, Result{Cancelled: true})
		return
	}
	if s.sys.fd >= 0 {
		p.send(s, true)
		return
	}
	p.dial(s)
}

// dial opens a connection to s, ready for the request once connected.
func (p *poller) dial(s *Conn) {
	x := &s.x
	var sa unix.Sockaddr
	family := unix.AF_INET6
	if a := s.addr.Addr(); a.Is4() || a.Is4In6() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(s.addr.Port()), Addr: a.Unmap().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(s.addr.Port()), Addr: a.As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		p.end(s, Result{Err: Failure("connect", "GET %s: socket: %v", s.URL, err)})
		return
	}
	s.sys.fd = fd
	p.o.Kept.Add(1)
	err = unix.Connect(fd, sa)
	x.connecting = errors.Is(err, unix.EINPROGRESS)
	if err != nil && !x.connecting {
		p.end(s, Result{Err: connectFailure(s.URL, err)})
		return
	}
	p.inflight[int32(fd)] = s
	if err := p.arm(s, unix.EPOLL_CTL_ADD, unix.EPOLLOUT); err != nil {
		p.end(s, Result{Err: Failure("transport", "GET %s: epoll: %v", s.URL, err)})
		return
	}
	if !x.connecting {
		p.send(s, false)
	}
}

func connectFailure(u string, err error) error {
	if errors.Is(err, unix.ECONNREFUSED) {
		return Failure("connect", "GET %s: connection refused", u)
	}
	return Failure("connect", "GET %s: connect: %v", u, err)
}

// arm has the set report s's connection once when ready for events.
func (p *poller) arm(s *Conn, op int, events uint32) error {
	ev := unix.EpollEvent{Events: events | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(s.sys.fd), Pad: int32(s.x.seq)}
	return unix.EpollCtl(p.epfd, op, s.sys.fd, &ev)
}

// send writes the request (the rest of it) and waits for the answer.
func (p *poller) send(s *Conn, reused bool) {
	x := &s.x
	x.reused = reused
	p.inflight[int32(s.sys.fd)] = s
	for x.written < len(s.request) {
		n, err := unix.Write(s.sys.fd, s.request[x.written:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			p.rearm(s, unix.EPOLLOUT)
			return
		}
		if err != nil {
			p.failExchange(s, err)
			return
		}
		x.written += n
	}
	p.rearm(s, unix.EPOLLIN)
}

// rearm waits for events on s's connection, registered with the set when
// it was dialled (a kept connection stays registered, disarmed, between
// exchanges).
func (p *poller) rearm(s *Conn, events uint32) {
	if err := p.arm(s, unix.EPOLL_CTL_MOD, events); err != nil {
		p.end(s, Result{Err: Failure("transport", "GET %s: epoll: %v", s.URL, err)})
	}
}

// progress moves s's exchange on after its connection reported events.
func (p *poller) progress(s *Conn) {
	x := &s.x
	if x.connecting {
		x.connecting = false
		errno, err := unix.GetsockoptInt(s.sys.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && errno != 0 {
			err = syscall.Errno(errno)
		}
		if err != nil {
			p.end(s, Result{Err: connectFailure(s.URL, err)})
			return
		}
		p.send(s, false)
		return
	}
	if x.written < len(s.request) {
		p.send(s, x.reused)
		return
	}
	for turn := 0; turn < maxReadPerTurn; {
		if x.buf.Available() < 16<<10 {
			x.buf.Grow(32 << 10)
		}
		b := x.buf.AvailableBuffer()
		n, err := unix.Read(s.sys.fd, b[:cap(b)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			p.rearm(s, unix.EPOLLIN)
			return
		}
		if err != nil {
			p.failExchange(s, err)
			return
		}
		x.buf.Write(b[:n])
		x.read += int64(n)
		turn += max(n, 1)
		x.eof = n == 0
		if x.whole(p.o.MaxPageBytes) {
			p.finish(s)
			return
		}
	}
	// More is ready: the set reports it again at once, after the others.
	p.rearm(s, unix.EPOLLIN)
}

// failExchange ends an exchange whose connection failed: a kept one the
// server closed before answering is dialled again, once.
func (p *poller) failExchange(s *Conn, err error) {
	x := &s.x
	if x.reused && x.buf.Len() == 0 && (errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)) {
		p.redial(s)
		return
	}
	if errors.Is(err, unix.ECONNREFUSED) {
		p.end(s, Result{Err: connectFailure(s.URL, err)})
		return
	}
	p.end(s, Result{Err: readFailure(s.URL, err, x.buf.Len())})
}

// redial sends the request again on a new connection.
func (p *poller) redial(s *Conn) {
	p.dropConn(s)
	s.x.restart()
	p.dial(s)
}

// finish decodes and parses s's whole response and ends its exchange; a
// large page is handed to the aside goroutine and ends when it is back.
func (p *poller) finish(s *Conn) {
	if s.x.buf.Len() > asidePageBytes {
		select {
		case p.aside <- s:
			// Off the deadlines and the events until it is back: the
			// connection is disarmed (one-shot) and nothing reads it.
			s.x.aside = true
			p.asideN++
			p.unlink(s)
			delete(p.inflight, int32(s.sys.fd))
			return
		default:
		}
	}
	// The page's decoding and parse are its own: charged to it alone, not
	// shared with the wake-up's other exchanges.
	start := ThreadCPU()
	r, keep, redial := s.x.conclude(s, p.o.MaxPageBytes, p.o.Parse)
	own := max(ThreadCPU()-start, 0)
	p.attributed += own
	r.CPU += own
	p.concluded(s, r, keep, redial)
}

// parseAside decodes and parses the pages handed to it, on a thread of
// its own at the poller's priority, and gives each back to the poller,
// until aside is closed; then it closes done.
func (p *poller) parseAside(done chan<- struct{}) {
	defer close(done)
	lowerPriority()
	for s := range p.aside {
		start := ThreadCPU()
		x := &s.x
		x.asideResult, x.asideKeep, x.asideRedial = x.conclude(s, p.o.MaxPageBytes, p.o.Parse)
		x.asideResult.CPU += max(ThreadCPU()-start, 0)
		p.mu.Lock()
		p.parsed = append(p.parsed, s)
		p.mu.Unlock()
		select {
		case p.gotBack <- struct{}{}:
		default:
		}
		p.wake()
	}
}

// backFromAside ends the exchange of a page parsed aside.
func (p *poller) backFromAside(s *Conn) {
	x := &s.x
	p.asideN--
	x.aside = false
	r, keep, redial := x.asideResult, x.asideKeep, x.asideRedial
	x.asideResult = Result{}
	p.link(s) // on the deadline list again, as end and redial expect
	if s.sys.fd >= 0 {
		p.inflight[int32(s.sys.fd)] = s
	}
	if s.cancelled.Load() {
		r = Result{Cancelled: true, CPU: r.CPU}
		keep, redial = false, false
	}
	p.concluded(s, r, keep, redial)
}

// concluded ends s's exchange after its response was decoded and parsed.
func (p *poller) concluded(s *Conn, r Result, keep, redial bool) {
	if redial {
		p.redial(s)
		return
	}
	if !keep {
		p.dropConn(s)
	}
	s.x.concluded = true
	p.end(s, r)
}

// end ends s's exchange with r; a connection not left at the end of a
// whole exchange is closed.
func (p *poller) end(s *Conn, r Result) {
	x := &s.x
	if !x.active {
		return
	}
	if (r.Err != nil || r.Cancelled) && !x.concluded {
		p.dropConn(s)
	}
	if s.sys.fd >= 0 {
		delete(p.inflight, int32(s.sys.fd))
	}
	p.unlink(s)
	x.release(r)
	p.finished = append(p.finished, s)
}

// dropConn closes s's connection, which leaves the set with it.
func (p *poller) dropConn(s *Conn) {
	if s.sys.fd >= 0 {
		delete(p.inflight, int32(s.sys.fd))
	}
	if s.Close() {
		p.o.Kept.Add(-1)
	}
}

func (p *poller) link(s *Conn) {
	s.x.before, s.x.after = p.last, nil
	if p.last != nil {
		p.last.x.after = s
	} else {
		p.first = s
	}
	p.last = s
}

func (p *poller) unlink(s *Conn) {
	x := &s.x
	if x.before != nil {
		x.before.x.after = x.after
	} else if p.first == s {
		p.first = x.after
	}
	if x.after != nil {
		x.after.x.before = x.before
	} else if p.last == s {
		p.last = x.before
	}
	x.before, x.after = nil, nil
}

// ThreadClock reports whether ThreadCPU reads a thread's CPU clock.
const ThreadClock = true

// ThreadCPU reads the running thread's CPU clock. The kernel has no fast
// path for it (unlike the wall clock), and clock_gettime never blocks, so
// it is a raw system call: without the runtime's bookkeeping for one that
// may block, which cost as much again.
func ThreadCPU() time.Duration {
	var ts unix.Timespec
	if _, _, errno := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_THREAD_CPUTIME_ID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
