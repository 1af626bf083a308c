// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// cutProxy is a loopback TCP proxy in front of the API server whose open
// connections a test can cut, as a network blip or an API server restart
// does: every watch through it ends, and the clients reconnect.
type cutProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// newCutProxy starts a cutProxy for cfg's API server; it returns cfg
// through it. It is closed when the test ends.
func newCutProxy(t *testing.T, cfg *rest.Config) (*cutProxy, *rest.Config) {
	t.Helper()
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	through := rest.CopyConfig(cfg)
	through.Host = (&url.URL{Scheme: u.Scheme, Host: ln.Addr().String(), Path: u.Path}).String()
	return p, through
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *cutProxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	client.Close()
	server.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// cut closes every open connection; new ones pass.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// revokePods takes back what grantPods gave.
func revokePods(t *testing.T, ns string) {
	t.Helper()
	for _, o := range []client.Object{
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"}},
	} {
		if err := env.Client.Delete(ctx(t), o); err != nil {
			t.Fatal(err)
		}
	}
}

// tenants are two namespaces of one pool each, served through a cutProxy as
// a user who may list the pods of both until a test revokes it.
type tenants struct {
	a, b       string
	aKey, bKey datastore.PoolKey
	aCreated   time.Time
	proxy      *cutProxy
	r          *running
}

func startTenants(t *testing.T, plan podsource.Plan, staleAfter time.Duration, aIP, bIP string) *tenants {
	t.Helper()
	tn := &tenants{a: env.Namespace(t, "tenant-a"), b: env.Namespace(t, "tenant-b")}
	user := "picker-" + tn.a
	cfg := limitedUser(t, user)
	grantPods(t, user, tn.a)
	grantPods(t, user, tn.b)
	lbls := map[string]string{"app": "m"}
	tn.aCreated = createPod(t, tn.a, "a1", lbls, podState{ip: aIP, ready: true}).CreationTimestamp.Time
	createPod(t, tn.b, "b1", lbls, podState{ip: bIP, ready: true})
	createPool(t, tn.a, "pool", lbls, []int32{8000})
	createPool(t, tn.b, "pool", lbls, []int32{8000})
	tn.aKey, tn.bKey = datastore.PoolKey{Namespace: tn.a, Name: "pool"}, datastore.PoolKey{Namespace: tn.b, Name: "pool"}
	tn.proxy, cfg = newCutProxy(t, cfg)
	tn.r = start(t, cfg, Options{PodWatchPlan: plan, Namespaces: []string{tn.a, tn.b}, StaleEndpointsTimeout: staleAfter})
	tn.r.waitEndpoints(t, tn.aKey, aIP+":8000")
	tn.r.waitEndpoints(t, tn.bKey, bIP+":8000")
	return tn
}

// failA makes tenant A's pod watch fail: its permission is revoked and the
// watches are cut, so that A's cannot resume while B's does.
func (tn *tenants) failA(t *testing.T) time.Time {
	t.Helper()
	revokePods(t, tn.a)
	tn.proxy.cut()
	tn.r.waitFor(t, "A's watch failing", func() bool {
		p, ok := tn.r.reg.Get(tn.aKey)
		return ok && strings.Contains(p.SyncError(), "forbidden")
	})
	return time.Now()
}

// A pool whose pods cannot be listed or watched keeps its last endpoints
// for --stale-endpoints-timeout, then is refused (not synced, no
// endpoints, a metric, an Event naming the flag) until its pods are listed
// again; the other tenant's pool is served throughout.
func TestStaleEndpointsExpireForTheFailingPoolAlone(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		const staleAfter = 3 * time.Second
		tn := startTenants(t, plan, staleAfter, "10.22.0.1", "10.22.1.1")
		r := tn.r
		failed := tn.failA(t)
		if p, _ := r.reg.Get(tn.aKey); time.Since(failed) < staleAfter/2 && (!p.Synced() || p.Endpoints().Len() != 1) {
			t.Fatalf("A dropped its endpoints at once (synced %v, %d endpoints): it should keep them for %s", p.Synced(), p.Endpoints().Len(), staleAfter)
		}
		r.waitFor(t, "A's endpoints expired", func() bool {
			p, _ := r.reg.Get(tn.aKey)
			return !p.Synced() && p.Endpoints().Len() == 0 && r.metric("poolpicker_pool_endpoints_expired", tn.a, "pool") == 1
		})
		if took := time.Since(failed); took < staleAfter/2 {
			t.Errorf("A expired %v after its failure was seen, before --stale-endpoints-timeout %v", took, staleAfter)
		}
		if p, _ := r.reg.Get(tn.aKey); !strings.Contains(p.SyncError(), "--stale-endpoints-timeout") {
			t.Errorf("A's reason %q does not name --stale-endpoints-timeout", p.SyncError())
		}
		if got := r.endpoints(tn.bKey); len(got) != 1 || got[0] != "10.22.1.1:8000" {
			t.Errorf("B's endpoints %v while A is expired", got)
		}
		if p, _ := r.reg.Get(tn.bKey); !p.Synced() || p.SyncError() != "" || r.metric("poolpicker_pool_endpoints_expired", tn.b, "pool") != 0 {
			t.Errorf("B is affected: synced %v, reason %q", p.Synced(), p.SyncError())
		}
		r.waitFor(t, "an EndpointsExpired Event on A's pool", func() bool {
			var evs eventsv1.EventList
			if err := env.Client.List(ctx(t), &evs, client.InNamespace(tn.a)); err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == "EndpointsExpired" && strings.Contains(e.Note, "--stale-endpoints-timeout") {
					return true
				}
			}
			return false
		})

		// Meanwhile A's pods changed; once listable again, A serves what
		// is there now.
		deletePod(t, tn.a, "a1")
		createPod(t, tn.a, "a2", map[string]string{"app": "m"}, podState{ip: "10.22.0.2", ready: true})
		grantPods(t, "picker-"+tn.a, tn.a)
		r.waitEndpoints(t, tn.aKey, "10.22.0.2:8000")
		r.waitFor(t, "A's failure cleared", func() bool {
			p, _ := r.reg.Get(tn.aKey)
			return p.SyncError() == "" && r.metric("poolpicker_pool_endpoints_expired", tn.a, "pool") == 0 &&
				r.metric("poolpicker_pool_sync_failing", tn.a, "pool") == 0
		})
	})
}

// While tenant A's watch is failing (within --stale-endpoints-timeout),
// A's pod is deleted and its IP given to a new pod of tenant B: A must not
// route to B's server, so the address leaves A's endpoints as soon as B's
// watch sees it, and comes back to nobody else's.
func TestReusedAddressLeavesTheStalePool(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		tn := startTenants(t, plan, time.Hour, "10.23.0.1", "10.23.1.1")
		r := tn.r
		tn.failA(t)
		deletePod(t, tn.a, "a1")
		// Creation times have a resolution of a second, and the newer pod
		// holds the address: B's must be created in a later second than
		// A's, as it is in a cluster, where an IP is reused after a grace.
		time.Sleep(time.Until(tn.aCreated.Add(time.Second)))
		createPod(t, tn.b, "b2", map[string]string{"app": "m"}, podState{ip: "10.23.0.1", ready: true})
		r.waitEndpoints(t, tn.bKey, "10.23.0.1:8000", "10.23.1.1:8000")
		r.waitFor(t, "the reused address out of A's endpoints", func() bool {
			p, _ := r.reg.Get(tn.aKey)
			return p.Endpoints().Len() == 0
		})
		// The registry's index by endpoint follows A's publish too.
		r.waitFor(t, "10.23.0.1:8000 an endpoint of B's pool alone", func() bool {
			for _, p := range r.reg.ByEndpoint("10.23.0.1:8000") {
				if p.Key != tn.bKey {
					return false
				}
			}
			return true
		})
		// The gauge follows the publish that took the address out of A.
		r.waitFor(t, "poolpicker_pool_addresses_held_elsewhere for A at 1", func() bool {
			return r.metric("poolpicker_pool_addresses_held_elsewhere", tn.a, "pool") == 1
		})
		// A is still served (within --stale-endpoints-timeout): only the
		// address B holds left it.
		if p, _ := r.reg.Get(tn.aKey); !p.Synced() {
			t.Errorf("A stopped being served within --stale-endpoints-timeout")
		}
	})
}

// An InferencePool that an InferenceObjective refers to but that lacks the
// opt-in label, and that no picker has claimed, gets a Warning Event
// naming the label; the pool the picker serves is claimed (the served-by
// annotation names the picker serving it) and gets no such Event.
func TestUnservedPoolWarnsNamingTheOptInLabel(t *testing.T) {
	ns := env.Namespace(t, "optin")
	name := uniquePickerName("optin")
	lbls := map[string]string{"app": "m"}
	createPool(t, ns, "served", lbls, []int32{8000}, withLabels(map[string]string{PickerLabel: name}))
	createPool(t, ns, "unserved", lbls, []int32{8000})
	for _, pool := range []string{"served", "unserved"} {
		if err := env.Client.Create(ctx(t), objective(ns, "chat-"+pool, pool, nil)); err != nil {
			t.Fatal(err)
		}
	}
	opts := haOptions(name, ns, ns)
	opts.ProvisionPickerServices = false
	opts.PoolSelector = PickerLabel + "=" + name
	r := start(t, nil, opts)
	r.waitFor(t, "the Lease", r.parts.Leader.IsLeader)
	waitClaim(t, r, datastore.PoolKey{Namespace: ns, Name: "served"}, ns+"/"+name)
	notes := func(pool string) []string {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx(t), &evs, client.InNamespace(ns)); err != nil {
			return nil
		}
		var out []string
		for _, e := range evs.Items {
			if e.Reason == "PoolNotServed" && e.Regarding.Name == pool {
				out = append(out, e.Note)
			}
		}
		return out
	}
	r.waitFor(t, "a PoolNotServed Event on the unserved pool", func() bool { return len(notes("unserved")) > 0 })
	if note := notes("unserved")[0]; !strings.Contains(note, PickerLabel) || !strings.Contains(note, "InferenceObjective chat-unserved") {
		t.Errorf("the Event %q does not name the opt-in label %s and the objective", note, PickerLabel)
	}
	if got := notes("served"); len(got) > 0 {
		t.Errorf("the served pool got PoolNotServed Events: %q", got)
	}
}

// Start-up says every few seconds how many of the pools served at start
// have synced, at Info; each pool's own sync line is at V(4), so that a
// start with thousands of pools does not log a line per pool at the
// default verbosity.
func TestStartupReportsProgress(t *testing.T) {
	ns := env.Namespace(t, "progress")
	const pools = 24
	lbls := map[string]string{"app": "m"}
	for i := range pools {
		createPool(t, ns, fmt.Sprintf("pool-%d", i), map[string]string{"app": fmt.Sprintf("m%d", i)}, []int32{8000})
	}
	createPod(t, ns, "m0", lbls, podState{ip: "10.24.0.1", ready: true})
	// Each pool's first list is one request; at 8 a second the pools sync
	// over about three seconds, long enough for progress lines.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 8, 1
	lines := &logLines{}
	opts := Options{Namespaces: []string{ns}, PodWatchPlan: podsource.PlanPerPool, Logger: lines.logger(2)}
	r := startConfigured(t, cfg, opts, func(p *Parts) { p.InitialSync.progressInterval = 200 * time.Millisecond })
	r.waitFor(t, "the initial sync", r.parts.InitialSync.HasSynced)
	progress := lines.matching("pools synced")
	if len(progress) == 0 {
		t.Fatalf("no progress line during the initial sync; lines: %q", lines.all())
	}
	if !strings.Contains(progress[0], fmt.Sprintf(`"of"=%d`, pools)) {
		t.Errorf("progress line %q does not say of %d", progress[0], pools)
	}
	for _, msg := range []string{"pod source synced", "serving pool", "starting pod watch"} {
		if got := lines.matching(msg); len(got) > 0 {
			t.Errorf("per-pool lines %q at verbosity 2 during the initial sync: %q", msg, got[0])
		}
	}
}

// logLines keeps the lines of a logger up to a verbosity.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger(verbosity int) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: verbosity})
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (l *logLines) matching(msg string) []string {
	var out []string
	for _, line := range l.all() {
		if strings.Contains(line, `"msg"="`+msg+`"`) {
			out = append(out, line)
		}
	}
	return out
}
