package scheduling

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
)

func TestMain(m *testing.M) {
	// The scheduler starts no goroutine; this keeps it so.
	goleak.VerifyTestMain(m)
}

// testPool is a real registry with one pool of n endpoints on port 8000,
// pod IPs 127.0.1.1 .. 127.0.1.n (endpoints sorted by address).
type testPool struct {
	reg  *datastore.Registry
	pool *datastore.Pool
	pods []datastore.EndpointSource
}

func newTestPool(t testing.TB, n int, sched *Scheduler) *testPool {
	t.Helper()
	reg := datastore.NewRegistry()
	if sched != nil {
		reg.AddObserver(sched)
	}
	key := datastore.PoolKey{Namespace: "ns", Name: "pool"}
	pool := reg.Upsert(key, &datastore.PoolSpec{Selector: map[string]string{"app": "m"}, TargetPorts: []int32{8000}})
	tp := &testPool{reg: reg, pool: pool}
	for i := 1; i <= n; i++ {
		tp.pods = append(tp.pods, podSource(i))
	}
	pool.SetPods(tp.pods)
	pool.SetSynced(true)
	if got := pool.Endpoints().Len(); got != n {
		t.Fatalf("pool has %d endpoints, want %d", got, n)
	}
	return tp
}

func podSource(i int) datastore.EndpointSource {
	return datastore.EndpointSource{
		Pod:    types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("pod-%03d", i)},
		UID:    types.UID(fmt.Sprintf("uid-%03d", i)),
		IP:     fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250),
		Labels: map[string]string{"app": "m"},
	}
}

// ep returns the endpoint of pod i (1-based, as created).
func (tp *testPool) ep(t testing.TB, i int) *datastore.Endpoint {
	t.Helper()
	src := podSource(i)
	e, ok := tp.pool.Endpoints().Get(src.IP + ":8000")
	if !ok {
		t.Fatalf("endpoint of pod %d not in pool", i)
	}
	return e
}

func (tp *testPool) setAnnotation(v string) {
	spec := *tp.pool.Spec()
	spec.Annotations = map[string]string{ProfileAnnotation: v}
	tp.reg.Upsert(tp.pool.Key, &spec)
}

// load is a fresh scrape with the given queue and KV use.
func load(waiting int, kv float64) *datastore.Metrics {
	return &datastore.Metrics{WaitingRequests: waiting, KVCacheUsage: kv, ScrapedAt: time.Now()}
}

// setAll gives every endpoint of the pool the same fresh idle metrics.
func (tp *testPool) setAll(m func() *datastore.Metrics) {
	for _, e := range tp.pool.Endpoints().Endpoints {
		e.SetMetrics(m())
	}
}

// seededRand is a deterministic source safe for concurrent use.
func seededRand(seed uint64) func() uint64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

func mustScheduler(t testing.TB, cfgText string, opts Options) *Scheduler {
	t.Helper()
	var cfg *Config
	if cfgText != "" {
		var err error
		if cfg, err = LoadConfig([]byte(cfgText)); err != nil {
			t.Fatalf("LoadConfig: %v", err)
		}
	}
	if opts.Rand == nil {
		opts.Rand = seededRand(1)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// newCycle is a CycleState as Schedule prepares it, for plugin tests.
func newCycle(pool *datastore.Pool, model string, seed uint64) *CycleState {
	cs := &CycleState{}
	opts := Options{Rand: seededRand(seed)}
	opts.setDefaults()
	cs.reset(pool, &opts)
	cs.TargetModel = model
	cs.Endpoints = pool.Endpoints()
	return cs
}

// candidates are the pool's endpoints with their metrics as Schedule sees
// them (nil when stale under the default staleness).
func candidates(pool *datastore.Pool) []Candidate {
	var out []Candidate
	now := time.Now()
	for i, e := range pool.Endpoints().Endpoints {
		m := e.Metrics()
		if !m.Fresh(now, DefaultMetricsStaleness) {
			m = nil
		}
		out = append(out, Candidate{Endpoint: e, Metrics: m, pos: i})
	}
	return out
}

// prompt returns n bytes of deterministic text seeded by s.
func prompt(s string, n int) []byte {
	b := make([]byte, 0, n)
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%s-%d ", s, i)
	}
	return b[:n]
}
