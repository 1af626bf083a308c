// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package isolation_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

var full = flag.Bool("isolation.full", false, "run the isolation suite's full mode: each case as pairs of windows with and without tenant A's misbehaviour, tenant B's pick and metric-age p99 held to 1.2x of the paired reference and reported in a table")

// The picker's limits in this suite: small enough that tenant A reaches
// each of them with a few hundred streams, deadlines long enough that A's
// stalled streams stay stalled for a whole window.
const (
	staleness        = 2 * time.Second
	maxStreams       = 200
	heldBudget       = 32 << 20
	maxBodyBytes     = 4 << 20
	bodyStartTimeout = 2 * time.Minute
	bodyTimeout      = 2 * time.Minute
	staleEndpoints   = 10 * time.Minute
	pickerReplicas   = 2
	// maxModelLabels is the picker's model-name label budget, shared by
	// the tenants; adapters is how many model names tenant A's servers
	// serve: more than all of it.
	maxModelLabels = 64
	adapters       = 100
)

// firstPickerIP is the first replica's loopback IP; localstack gives the
// next replicas the next addresses.
const firstPickerIP = "127.0.121.2"

// The tenants: pool a in namespace iso-a (the misbehaving one), pool b in
// iso-b (the one that must not notice).
var (
	poolA = tenant{ns: "iso-a", name: "a", host: "a.iso.example", model: "tenant-a/base", deploy: types.NamespacedName{Namespace: "iso-a", Name: "a-vllm"}}
	poolB = tenant{ns: "iso-b", name: "b", host: "b.iso.example", model: "tenant-b/base", deploy: types.NamespacedName{Namespace: "iso-b", Name: "b-vllm"}}
)

type tenant struct {
	ns, name, host, model string
	deploy                types.NamespacedName
}

// authority is the ext_proc :authority a gateway sends for the pool: its
// picker Service.
func (p tenant) authority() string { return "epp-" + p.name + "." + p.ns + ".svc:9002" }

var (
	stack    *localstack.Stack
	grpcPort int
	// peerSyncPort is every replica's peer-sync port.
	peerSyncPort int
	httpClient   = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 2 * time.Minute}
	// scrapesOfB times the scrapes of tenant B's servers, by server address.
	scrapesOfB = newScrapeClocks()
	// memoryLimit is the chart's memory limit of the picker container.
	memoryLimit int64
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ports, err := localstack.FreePorts(4)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := filepath.Abs(".artifacts")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = os.RemoveAll(dir)
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if memoryLimit, err = chartMemoryLimit(filepath.Join(root, "charts", "poolpicker", "values.yaml")); err != nil {
		fmt.Fprintln(os.Stderr, "isolation:", err)
		return 1
	}
	grpcPort, peerSyncPort = ports[0], ports[3]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The replicas authenticate each other with a key both read, as the
	// chart mounts its Secret.
	key := filepath.Join(dir, "peer-sync-key")
	if err := os.WriteFile(key, []byte("the isolation suite's peer-sync key, more than sixteen bytes"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The replicas' loopback IPs, as localstack assigns them from
	// FirstPickerIP: each lists both as its peers.
	var peers []string
	for i := range pickerReplicas {
		peers = append(peers, net.JoinHostPort(fmt.Sprintf("127.0.121.%d", 2+i), strconv.Itoa(ports[3])))
	}
	// Built without -race: the suite measures the process's memory against
	// the chart's limit.
	s, err := localstack.Start(context.Background(), localstack.Options{
		Dir:            dir,
		SampleDir:      filepath.Join(root, "test", "isolation", "testdata", "samples"),
		FirstIP:        "127.0.120.2", // a range of its own: other packages start pods at the same time
		PickerReplicas: pickerReplicas,
		FirstPickerIP:  firstPickerIP,
		GatewayAddr:    "127.0.0.1:0",
		GRPCPort:       ports[0], HealthPort: ports[1], MetricsPort: ports[2],
		PickerArgs: []string{
			"--metrics-staleness-threshold=" + staleness.String(),
			fmt.Sprintf("--max-concurrent-streams=%d", maxStreams),
			fmt.Sprintf("--max-held-request-body-bytes=%d", heldBudget),
			fmt.Sprintf("--max-request-body-bytes=%d", maxBodyBytes),
			fmt.Sprintf("--max-model-labels=%d", maxModelLabels),
			"--request-body-start-timeout=" + bodyStartTimeout.String(),
			"--request-body-timeout=" + bodyTimeout.String(),
			// Long enough that tenant A's pool serves its other endpoints
			// through the IP-reuse case however slow the machine.
			"--stale-endpoints-timeout=" + staleEndpoints.String(),
			// One watch of each namespace's pods for all its pools: the plan
			// that sees every pod a tenant creates, its pools' or not.
			"--pod-watch-plan=namespace",
			// The tenants' namespaces, each of which grants the picker
			// its pods (pickerIdentity).
			"--watch-namespaces=" + poolA.ns + "," + poolB.ns,
			"--peer-sync", fmt.Sprintf("--peer-sync-port=%d", ports[3]), "--peer-sync-peers=" + strings.Join(peers, ","), "--peer-sync-key-file=" + key,
		},
		Sim: func(d types.NamespacedName, o *modelsim.Options) {
			if d == poolB.deploy {
				ln, err := net.Listen("tcp", o.Addr)
				if err != nil {
					panic(err) // the address is the stack's own; nothing else binds it
				}
				o.Listener = scrapesOfB.listen(o.Addr, ln)
			}
		},
		Logger: funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, p, a) }, funcr.Options{Verbosity: 0}),
		// The replicas reach the API server through a proxy whose
		// connections the IP-reuse case cuts, as a ServiceAccount that
		// lists each tenant's pods by that tenant's RoleBinding.
		PickerKubeconfig: func(ctx context.Context, env *testenv.Env) (string, error) {
			return pickerIdentity(ctx, env, filepath.Join(dir, "picker.kubeconfig"))
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "isolation: starting the local stack:", err)
		if apiProxy != nil {
			apiProxy.Close()
		}
		return 1
	}
	stack = s
	if err := applyTenants(root); err != nil {
		fmt.Fprintln(os.Stderr, "isolation: the tenants:", err)
		_ = s.Stop()
		return 1
	}
	code := m.Run()
	httpClient.CloseIdleConnections()
	conns.Close()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "isolation: stopping the local stack:", err)
		code = 1
	}
	if apiProxy != nil {
		apiProxy.Close()
	}
	if code == 0 {
		if err := testenv.LeakedGoroutines(); err != nil {
			fmt.Fprintln(os.Stderr, "isolation: goroutines left behind:", err)
			code = 1
		}
	}
	return code
}

// apiProxy is the replicas' way to the API server.
var apiProxy *testenv.Outage

// The picker's ServiceAccount, and what it may do: the chart's
// ClusterRole but pods, which each namespace grants (podsGrant).
const (
	pickerAccount = "isolation-picker"
	podsGrant     = "isolation-picker-pods"
)

// pickerIdentity creates the replicas' ServiceAccount with the chart's
// permissions, except that pods are granted per namespace: the replicas'
// own and each tenant's (whose namespaces it creates), so that a test can
// take one tenant's away. It starts apiProxy and writes a kubeconfig
// reaching the API server through it as the account.
func pickerIdentity(ctx context.Context, env *testenv.Env, path string) (string, error) {
	c := env.Client
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{"inference.networking.x-k8s.io", "llm-d.ai"}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites", "inferenceobjectives/status", "inferencemodelrewrites/status"}, Verbs: []string{"list", "watch", "patch"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"httproutes"}, Verbs: []string{"list", "watch"}},
	}
	account := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: localstack.DefaultPickerNamespace, Name: pickerAccount}
	objs := []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: pickerAccount}, Rules: rules},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: pickerAccount},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: pickerAccount}, Subjects: []rbacv1.Subject{account}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: podsGrant},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}},
	}
	for _, ns := range []string{localstack.DefaultPickerNamespace, poolA.ns, poolB.ns} {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, podsBinding(ns))
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("%T %s: %w", o, o.GetName(), err)
		}
	}
	cfg, err := env.ServiceAccountConfig(ctx, account.Namespace, account.Name)
	if err != nil {
		return "", err
	}
	if apiProxy, err = env.StartOutage(); err != nil {
		return "", err
	}
	cfg.Host = apiProxy.Config.Host
	return path, testenv.WriteKubeconfig(cfg, path)
}

// podsBinding grants the picker the pods of ns.
func podsBinding(ns string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: podsGrant},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: podsGrant},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: localstack.DefaultPickerNamespace, Name: pickerAccount}}}
}

// applyTenants creates both tenants' servers, pools and routes (their
// namespaces are pickerIdentity's).
func applyTenants(root string) error {
	b, err := os.ReadFile(filepath.Join(root, "test", "isolation", "testdata", "tenants.yaml"))
	if err != nil {
		return err
	}
	names := make([]string, adapters)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-a/adapter-%03d", i)
	}
	return stack.Apply(context.Background(), bytes.ReplaceAll(b, []byte("{{adapters}}"), []byte(strings.Join(names, ","))))
}

// chartMemoryLimit reads resources.limits.memory of the chart's values.
func chartMemoryLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var v struct {
		Resources struct {
			Limits struct {
				Memory string `json:"memory"`
			} `json:"limits"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	m := v.Resources.Limits.Memory
	for suffix, unit := range map[string]int64{"Gi": 1 << 30, "Mi": 1 << 20} {
		if n, ok := strings.CutSuffix(m, suffix); ok {
			x, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: resources.limits.memory %q: %w", path, m, err)
			}
			return x * unit, nil
		}
	}
	return 0, fmt.Errorf("%s: resources.limits.memory %q is not in Mi or Gi", path, m)
}

// pickerCPU is the CPU time the replicas have used, from
// /proc/PID/stat (user and system, in the kernel's clock ticks of 10 ms).
func pickerCPU() time.Duration {
	var total time.Duration
	for _, r := range stack.Replicas() {
		pid, err := r.Process.Running()
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		for _, v := range f[11:13] {
			ticks, _ := strconv.ParseInt(v, 10, 64)
			total += time.Duration(ticks) * 10 * time.Millisecond
		}
	}
	return total
}

// peakRSS samples every replica's resident memory until done is closed
// and returns the largest it saw.
func peakRSS(done <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, r := range stack.Replicas() {
				if pid, err := r.Process.Running(); err == nil {
					if n, err := testenv.RSS(pid); err == nil {
						peak = max(peak, n)
					}
				}
			}
			select {
			case <-done:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// metricSum is the sum over the replicas of a picker metric's series whose
// labels include match.
func metricSum(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, r := range stack.Replicas() {
		n, err := testenv.MetricSum(httpClient, "http://"+r.MetricsAddr+"/metrics", name, match)
		if err != nil {
			t.Fatalf("replica %s: %v", r.Pod, err)
		}
		sum += n
	}
	return sum
}

// conns keeps one gRPC connection per replica and :authority.
var conns = testenv.PickerConns{MaxMsgBytes: 16 << 20}

func conn(t *testing.T, replicaIP, authority string) *grpc.ClientConn {
	t.Helper()
	c, err := conns.Get(net.JoinHostPort(replicaIP, strconv.Itoa(grpcPort)), authority)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
