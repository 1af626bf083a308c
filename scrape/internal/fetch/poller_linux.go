// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/poolpicker/poolpicker/datastore"
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
	// complete hears of each scrape's end on the poller's goroutine.
	complete func(s *server, r polled)
	parse    func(s *server, page []byte) (datastore.Metrics, error)
	kept     *atomic.Int64 // the manager's count of kept connections
	limit    int64
	timeout  time.Duration

	mu       sync.Mutex
	queued   []*server // submitted, not started
	cancels  []*server
	closed   bool
	sleeping atomic.Bool  // the goroutine waits: a submission wakes it
	tid      atomic.Int32 // the goroutine's thread, once it runs (tests)

	// The goroutine's own.
	inflight map[int32]*server
	first    *server // in-flight scrapes by deadline, the earliest first
	last     *server
	deadline time.Time // the one set on file
	touched  []*server // the scrapes this wake-up worked on
	finished []*server
	seq      uint32
}

// polled is a scrape's result.
type polled struct {
	met       datastore.Metrics
	err       error
	cancelled bool
	// cpu is the scrape's share of the CPU time of the wake-ups that
	// worked on it.
	cpu time.Duration
}

// exchange is the state of a server's scrape on its poller.
type exchange struct {
	active     bool
	seq        uint32
	connecting bool
	reused     bool // the request went on a kept connection
	written    int
	deadline   time.Time
	buf        *bytes.Buffer
	eof        bool
	// bodyAt is the offset of the body once the header is whole; hdr and
	// status are the header read then.
	bodyAt int
	hdr    header
	status int
	hdrErr error
	result polled
	prev   *server
	next   *server
}

// pollable reports whether t's scrapes can run on a poller: plain http to
// an IP address (a pod's), whose socket address is returned.
func pollable(t target) (unix.Sockaddr, int, bool) {
	if t.err != nil || t.scheme != "http" {
		return nil, 0, false
	}
	ap, err := netip.ParseAddrPort(t.host)
	if err != nil {
		return nil, 0, false
	}
	if ap.Addr().Is4() || ap.Addr().Is4In6() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}, unix.AF_INET, true
	}
	sa := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	return sa, unix.AF_INET6, true
}

func newPoller(limit int64, timeout time.Duration, kept *atomic.Int64, parse func(*server, []byte) (datastore.Metrics, error), complete func(*server, polled)) (*poller, error) {
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
		complete: complete, parse: parse, kept: kept, limit: limit, timeout: timeout,
		inflight: map[int32]*server{},
	}, nil
}

// submit starts a scrape of s; its end is reported to complete. After the
// poller has stopped, it is reported cancelled at once.
func (p *poller) submit(s *server) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.complete(s, polled{cancelled: true})
		return
	}
	p.queued = append(p.queued, s)
	p.mu.Unlock()
	p.wake()
}

// cancel ends s's scrape, submitted or in flight, as cancelled.
func (p *poller) cancel(s *server) {
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
func (p *poller) stop() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.sleeping.Store(true)
	p.wake()
}

// run is the poller's goroutine, until stop; then it closes its set.
func (p *poller) run() {
	defer func() {
		p.file.Close()
		unix.Close(p.evfd)
	}()
	p.tid.Store(int32(lowerPriority()))
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := p.wait(events)
		if err != nil {
			// The set itself failed: nothing can be read any more.
			panic(fmt.Sprintf("scrape poller: epoll_wait: %v", err))
		}
		startCPU, startWall := threadCPU(), time.Now()
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
		queued, cancels, closed := p.queued, p.cancels, p.closed
		p.queued, p.cancels = p.queued[len(p.queued):], p.cancels[len(p.cancels):]
		p.mu.Unlock()
		for _, s := range cancels {
			if s.x.active && s.cancelled.Load() {
				p.touch(s)
				p.end(s, polled{cancelled: true})
			}
		}
		now := time.Now()
		for _, s := range queued {
			p.touch(s)
			p.start(s, now)
		}
		for s := p.first; s != nil && !now.Before(s.x.deadline); s = p.first {
			p.touch(s)
			p.end(s, polled{err: failure("timeout", "GET %s: timed out after %v (%d bytes read)", s.target.url, p.timeout, p.bufLen(s))})
		}
		if closed {
			for p.first != nil {
				p.end(p.first, polled{cancelled: true})
			}
		}
		p.account(startCPU, startWall)
		for _, s := range p.finished {
			r := s.x.result
			s.x.result = polled{}
			p.complete(s, r)
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
	pending := len(p.queued) > 0 || len(p.cancels) > 0 || p.closed
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
func (p *poller) touch(s *server) { p.touched = append(p.touched, s) }

// account shares the CPU time of the wake-up between the scrapes it
// worked on.
func (p *poller) account(startCPU time.Duration, startWall time.Time) {
	if len(p.touched) == 0 {
		return
	}
	d := min(max(threadCPU()-startCPU, 0), time.Since(startWall))
	each := d / time.Duration(len(p.touched))
	for _, s := range p.touched {
		s.x.result.cpu += each
	}
	clear(p.touched)
	p.touched = p.touched[:0]
}

func (p *poller) bufLen(s *server) int {
	if s.x.buf == nil {
		return 0
	}
	return s.x.buf.Len()
}

// start begins s's scrape: on its kept connection, or a new one.
func (p *poller) start(s *server, now time.Time) {
	x := &s.x
	p.seq++
	x.active, x.seq = true, p.seq
	x.deadline = now.Add(p.timeout)
	x.result = polled{}
	x.buf = bodyPool.Get().(*bytes.Buffer)
	x.buf.Reset()
	p.link(s)
	if s.cancelled.Load() {
		p.end(s, polled{cancelled: true})
		return
	}
	if s.fd >= 0 {
		p.send(s, true)
		return
	}
	p.dial(s)
}

// dial opens a connection to s, ready for the request once connected.
func (p *poller) dial(s *server) {
	x := &s.x
	fd, err := unix.Socket(s.family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		p.end(s, polled{err: failure("connect", "GET %s: socket: %v", s.target.url, err)})
		return
	}
	s.fd = fd
	p.kept.Add(1)
	err = unix.Connect(fd, s.addr)
	x.connecting = errors.Is(err, unix.EINPROGRESS)
	if err != nil && !x.connecting {
		p.end(s, polled{err: connectFailure(s.target.url, err)})
		return
	}
	p.inflight[int32(fd)] = s
	if err := p.arm(s, unix.EPOLL_CTL_ADD, unix.EPOLLOUT); err != nil {
		p.end(s, polled{err: failure("transport", "GET %s: epoll: %v", s.target.url, err)})
		return
	}
	if !x.connecting {
		p.send(s, false)
	}
}

func connectFailure(u string, err error) error {
	if errors.Is(err, unix.ECONNREFUSED) {
		return failure("connect", "GET %s: connection refused", u)
	}
	return failure("connect", "GET %s: connect: %v", u, err)
}

// arm has the set report s's connection once when ready for events.
func (p *poller) arm(s *server, op int, events uint32) error {
	ev := unix.EpollEvent{Events: events | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(s.fd), Pad: int32(s.x.seq)}
	return unix.EpollCtl(p.epfd, op, s.fd, &ev)
}

// send writes the request (the rest of it) and waits for the answer.
func (p *poller) send(s *server, reused bool) {
	x := &s.x
	x.reused = reused
	p.inflight[int32(s.fd)] = s
	for x.written < len(s.request) {
		n, err := unix.Write(s.fd, s.request[x.written:])
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
// scrapes).
func (p *poller) rearm(s *server, events uint32) {
	if err := p.arm(s, unix.EPOLL_CTL_MOD, events); err != nil {
		p.end(s, polled{err: failure("transport", "GET %s: epoll: %v", s.target.url, err)})
	}
}

// progress moves s's scrape on after its connection reported events.
func (p *poller) progress(s *server) {
	x := &s.x
	if x.connecting {
		x.connecting = false
		errno, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && errno != 0 {
			err = syscall.Errno(errno)
		}
		if err != nil {
			p.end(s, polled{err: connectFailure(s.target.url, err)})
			return
		}
		p.send(s, false)
		return
	}
	if x.written < len(s.request) {
		p.send(s, x.reused)
		return
	}
	for {
		if x.buf.Available() < 16<<10 {
			x.buf.Grow(32 << 10)
		}
		b := x.buf.AvailableBuffer()
		n, err := unix.Read(s.fd, b[:cap(b)])
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
		x.eof = n == 0
		if p.whole(s) {
			p.finish(s)
			return
		}
	}
}

// failExchange ends an exchange whose connection failed: a kept one the
// server closed before answering is dialled again, once.
func (p *poller) failExchange(s *server, err error) {
	x := &s.x
	if x.reused && x.buf.Len() == 0 && (errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)) {
		p.redial(s)
		return
	}
	if errors.Is(err, unix.ECONNREFUSED) {
		p.end(s, polled{err: connectFailure(s.target.url, err)})
		return
	}
	p.end(s, polled{err: readFailure(s.target.url, err, x.buf.Len())})
}

// redial sends the request again on a new connection.
func (p *poller) redial(s *server) {
	p.dropConn(s)
	x := &s.x
	x.written, x.reused, x.eof = 0, false, false
	x.bodyAt, x.hdr, x.status, x.hdrErr = 0, header{}, 0, nil
	x.buf.Reset()
	p.dial(s)
}

// whole reports whether s's buffer holds the whole response (or all the
// server will send), without decoding it: the decoder (decode) then
// reads it from the buffer alone and reports whatever is wrong with it.
func (p *poller) whole(s *server) bool {
	x := &s.x
	b := x.buf.Bytes()
	if x.eof {
		return true
	}
	if x.bodyAt == 0 {
		i := bytes.Index(b, []byte("\r\n\r\n"))
		if i < 0 {
			return len(b) > maxHeaderBytes
		}
		if i > maxHeaderBytes {
			return true
		}
		x.bodyAt = i + 4
		x.status, x.hdrErr = statusOf(b)
		if x.hdrErr == nil {
			x.hdr, x.hdrErr = parseHeader(b[:x.bodyAt])
		}
	}
	h := x.hdr
	body := b[x.bodyAt:]
	switch {
	case x.hdrErr != nil, x.status != 200, h.length > p.limit:
		return true
	case h.chunked:
		return chunkedWhole(body, p.limit)
	case h.length >= 0:
		return int64(len(body)) >= h.length
	default:
		return int64(len(body)) > p.limit
	}
}

// chunkedWhole reports whether b holds a whole chunked body, or enough of
// one to tell it is malformed or too large.
func chunkedWhole(b []byte, limit int64) bool {
	var total int64
	for {
		i := bytes.Index(b, []byte("\r\n"))
		if i < 0 {
			return len(b) > 4096
		}
		line := b[:i]
		if j := bytes.IndexByte(line, ';'); j >= 0 {
			line = line[:j]
		}
		size, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 62)
		if err != nil {
			return true
		}
		b = b[i+2:]
		if size == 0 {
			for {
				i := bytes.Index(b, []byte("\r\n"))
				if i < 0 {
					return len(b) > 4096
				}
				if i == 0 {
					return true
				}
				b = b[i+2:]
			}
		}
		total += int64(size)
		if total > limit {
			return true
		}
		if uint64(len(b)) < size+2 {
			return false
		}
		b = b[size+2:]
	}
}

// finish decodes and parses s's whole response and ends its scrape.
func (p *poller) finish(s *server) {
	x := &s.x
	r := responseReader{buf: x.buf, eof: x.eof}
	page, closeConn, err := decode(s.target.url, &r, p.limit)
	if err != nil {
		if x.reused && x.buf.Len() == 0 && x.eof {
			p.redial(s)
			return
		}
		p.end(s, polled{err: err})
		return
	}
	if closeConn {
		p.dropConn(s)
	}
	res := polled{}
	res.met, res.err = p.parse(s, page)
	p.end(s, res)
}

// end ends s's scrape with r; a connection not left at the end of a
// whole exchange is closed.
func (p *poller) end(s *server, r polled) {
	x := &s.x
	if !x.active {
		return
	}
	ok := r.err == nil && !r.cancelled
	var se *scrapeError
	if !ok && !(errors.As(r.err, &se) && se.reason == "parse") {
		p.dropConn(s)
	}
	if s.fd >= 0 {
		delete(p.inflight, int32(s.fd))
	}
	p.unlink(s)
	bodyPool.Put(x.buf)
	cpu := x.result.cpu
	*x = exchange{}
	x.result = r
	x.result.cpu = cpu
	p.finished = append(p.finished, s)
}

// dropConn closes s's connection, which leaves the set with it.
func (p *poller) dropConn(s *server) {
	if s.fd >= 0 {
		delete(p.inflight, int32(s.fd))
	}
	if s.closeConn() {
		p.kept.Add(-1)
	}
}

func (p *poller) link(s *server) {
	s.x.prev, s.x.next = p.last, nil
	if p.last != nil {
		p.last.x.next = s
	} else {
		p.first = s
	}
	p.last = s
}

func (p *poller) unlink(s *server) {
	x := &s.x
	if x.prev != nil {
		x.prev.x.next = x.next
	} else if p.first == s {
		p.first = x.next
	}
	if x.next != nil {
		x.next.x.prev = x.prev
	} else if p.last == s {
		p.last = x.prev
	}
	x.prev, x.next = nil, nil
}
