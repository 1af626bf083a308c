// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/poll"
	"github.com/poolpicker/poolpicker/internal/testenv"
	"github.com/poolpicker/poolpicker/peersync"
)

// defaultPeerSyncPort is --peer-sync-port's default in cmd/poolpicker/app.
const defaultPeerSyncPort = 9004

// peerSyncPort is the port args run peer sync on: 0 when --peer-sync is
// off.
func peerSyncPort(t *testing.T, args []string) int {
	t.Helper()
	if !lastFlag(args, "peer-sync", false) {
		return 0
	}
	v := flagValue(args, "peer-sync-port")
	if v == "" {
		return defaultPeerSyncPort
	}
	p, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("--peer-sync-port=%s: %v", v, err)
	}
	return p
}

// keyWiring is how a Deployment gives its container the peer-sync hash
// key: the flag, the mount of the file's directory and its volume.
type keyWiring struct {
	arg, mount, volume string
}

// withoutPeerSyncKey removes the --peer-sync-key-file flag, the mount of
// its directory and that mount's volume from d, and returns them.
func withoutPeerSyncKey(t *testing.T, d *unstructured.Unstructured) keyWiring {
	t.Helper()
	if d == nil {
		t.Fatal("no Deployment")
	}
	var w keyWiring
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	args = slices.DeleteFunc(args, func(a string) bool {
		if strings.HasPrefix(a, "--peer-sync-key-file=") {
			w.arg = a
			return true
		}
		return false
	})
	_ = unstructured.SetNestedStringSlice(c, args, "args")
	if w.arg == "" {
		return w
	}
	dir := path.Dir(strings.TrimPrefix(w.arg, "--peer-sync-key-file="))
	var name string
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	mounts = slices.DeleteFunc(mounts, func(m any) bool {
		if m.(map[string]any)["mountPath"] == dir {
			w.mount, name = fmt.Sprint(m), fmt.Sprint(m.(map[string]any)["name"])
			return true
		}
		return false
	})
	if len(mounts) == 0 {
		delete(c, "volumeMounts")
	} else {
		_ = unstructured.SetNestedSlice(c, mounts, "volumeMounts")
	}
	_ = unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers")
	volumes, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
	volumes = slices.DeleteFunc(volumes, func(v any) bool {
		if v.(map[string]any)["name"] == name {
			w.volume = fmt.Sprint(v)
			return true
		}
		return false
	})
	if len(volumes) == 0 {
		unstructured.RemoveNestedField(d.Object, "spec", "template", "spec", "volumes")
	} else {
		_ = unstructured.SetNestedSlice(d.Object, volumes, "spec", "template", "spec", "volumes")
	}
	return w
}

// checkPeerSync: with --peer-sync on, the container exposes the peer-sync
// port, which differs from the other ports and which no Service exposes
// (the replicas dial each other's pod IPs; a Service would hand the port
// to whoever reaches it); a --peer-sync-key-file is a key of a mounted
// Secret, and a Secret the install renders holds a key of at least 32
// random bytes' worth. With it off, no peer-sync port.
func checkPeerSync(t *testing.T, objs []*unstructured.Unstructured, deploy *unstructured.Unstructured) {
	t.Helper()
	args := containerArgs(deploy)
	port := peerSyncPort(t, args)
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	cports, _, _ := unstructured.NestedSlice(c, "ports")
	var named int64
	for _, p := range cports {
		pm := p.(map[string]any)
		if pm["name"] == "peer-sync" {
			named = number(pm, "containerPort")
		}
	}
	if port == 0 {
		if named != 0 || flagValue(args, "peer-sync-key-file") != "" {
			t.Errorf("peer sync off, but container port peer-sync %d or a key file in args %v", named, args)
		}
		return
	}
	if named != int64(port) {
		t.Errorf("--peer-sync-port %d, container port peer-sync %d", port, named)
	}
	for _, name := range []string{"grpc-port", "grpc-health-port", "metrics-port"} {
		if flagValue(args, name) == strconv.Itoa(port) {
			t.Errorf("--peer-sync-port and --%s are both %d", name, port)
		}
	}
	for _, o := range objs {
		if o.GetKind() != "Service" {
			continue
		}
		ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
		for _, p := range ports {
			pm := p.(map[string]any)
			if pm["targetPort"] == "peer-sync" || number(pm, "port") == int64(port) || number(pm, "targetPort") == int64(port) {
				t.Errorf("Service %s exposes the peer-sync port: %v", o.GetName(), pm)
			}
		}
	}
	file := flagValue(args, "peer-sync-key-file")
	if file == "" {
		return // the derived key, which the base's comments say is not secret
	}
	d := deploy.DeepCopy()
	w := withoutPeerSyncKey(t, d)
	if w.mount == "" || w.volume == "" {
		t.Fatalf("--peer-sync-key-file=%s is on no mounted volume", file)
	}
	if strings.Contains(w.mount, "subPath") {
		t.Errorf("the key's mount %s uses a subPath", w.mount)
	}
	volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
	for _, v := range volumes {
		vol := v.(map[string]any)
		if fmt.Sprint(vol) != w.volume {
			continue
		}
		secret, _, _ := unstructured.NestedString(vol, "secret", "secretName")
		items, _, _ := unstructured.NestedSlice(vol, "secret", "items")
		if secret == "" || len(items) != 1 || items[0].(map[string]any)["path"] != path.Base(file) {
			t.Fatalf("the key's volume %v puts no Secret's key at %s", vol, file)
		}
		field := fmt.Sprint(items[0].(map[string]any)["key"])
		s := findIn(objs, "Secret", secret, deploy.GetNamespace())
		if s == nil {
			return // a Secret the user provides
		}
		enc, _, _ := unstructured.NestedString(s.Object, "data", field)
		key, err := base64.StdEncoding.DecodeString(enc)
		if err != nil || len(key) < 43 { // 32 random bytes, base64
			t.Errorf("Secret %s key %s: %d bytes (%v), want a random key of at least 43 characters", secret, field, len(key), err)
		}
	}
}

// findIn returns the object of kind, name and namespace among objs, or nil.
func findIn(objs []*unstructured.Unstructured, kind, name, namespace string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name && o.GetNamespace() == namespace {
			return o
		}
	}
	return nil
}

// TestChartPeerSyncKeyKeptOnUpgrade: the chart's peer-sync key Secret gets
// a new random key on a first install, and an upgrade (lookup finding the
// release's Secret) renders the key the cluster holds, so the replicas of
// an upgrade's rollout hash as the old ones do; with hashKey.secretName the
// chart renders no Secret and mounts the one named.
func TestChartPeerSyncKeyKeptOnUpgrade(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	const ns = "install-upgrade"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	opts := deploytest.ChartOptions{Namespace: ns, Kubeconfig: kubeconfig}
	keyOf := func(objs []*unstructured.Unstructured) string {
		t.Helper()
		s := findIn(objs, "Secret", "poolpicker-peer-sync", ns)
		if s == nil {
			t.Fatal("no Secret poolpicker-peer-sync rendered")
		}
		key, _, _ := unstructured.NestedString(s.Object, "data", "key")
		return key
	}
	install, err := tool.Chart(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	other, err := tool.Chart(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	first := keyOf(install)
	if first == "" || first == keyOf(other) {
		t.Fatalf("two first installs render the keys %q and %q; want two random keys", first, keyOf(other))
	}
	ensureNamespaces(t, ctx, install)
	secret := findIn(install, "Secret", "poolpicker-peer-sync", ns)
	if err := env.Client.Create(ctx, secret.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), secret.DeepCopy()) })
	for i := range 2 {
		upgrade, err := tool.Chart(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := keyOf(upgrade); got != first {
			t.Errorf("upgrade %d renders the key %q, want the installed %q", i+1, got, first)
		}
	}

	opts.Values = "peerSync: {hashKey: {secretName: team-peer-key, key: hash-key}}\n"
	own, err := tool.Chart(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range own {
		if o.GetKind() == "Secret" {
			t.Errorf("with hashKey.secretName the chart renders Secret %s", o.GetName())
		}
	}
	volumes, _, _ := unstructured.NestedSlice(deploytest.Find(own, "Deployment", "poolpicker").Object, "spec", "template", "spec", "volumes")
	if got := fmt.Sprint(volumes); !strings.Contains(got, "secretName:team-peer-key") || !strings.Contains(got, "key:hash-key") {
		t.Errorf("volumes %s do not mount key hash-key of Secret team-peer-key", got)
	}
}

// TestDefaultInstallSharesPicks installs what the chart renders with its
// default values (RBAC, the key Secret, the Service) on the API server and
// runs its Deployment's two replicas as their pods would run: each with the
// rendered args and the Secret's key, as the chart's ServiceAccount, on its
// own loopback address (its pod's IP, which --bind-address stands for; the
// ports are free ones instead of the rendered, which could be taken here).
// The replicas find each other from their ready pods through the API server
// and stream to each other; a request in flight through one replica and its
// pick's prompt blocks are applied by the other, which then routes the same
// prefix to the same model server; a stream from an address that is no
// replica's is refused.
func TestDefaultInstallSharesPicks(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	dir := t.TempDir()
	objs, err := tool.Chart(ctx, deploytest.ChartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deploy := deploytest.Find(objs, "Deployment", "poolpicker")
	ns := deploy.GetNamespace()
	if replicas := number(deploy.Object, "spec", "replicas"); replicas != 2 {
		t.Fatalf("the chart runs %d replicas by default; this test runs two", replicas)
	}
	ensureNamespaces(t, ctx, objs)
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			continue // its pods are the processes below
		}
		if err := env.Client.Create(ctx, o.DeepCopy()); err != nil {
			t.Fatalf("installing %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o.DeepCopy()) })
	}

	// The Secret's key, where the pods' volume puts it.
	args := containerArgs(deploy)
	keyFile := flagValue(args, "peer-sync-key-file")
	secret := findIn(objs, "Secret", "poolpicker-peer-sync", ns)
	if keyFile == "" || secret == nil {
		t.Fatalf("no --peer-sync-key-file in args %v, or no Secret poolpicker-peer-sync rendered", args)
	}
	enc, _, _ := unstructured.NestedString(secret.Object, "data", path.Base(keyFile))
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	localKey := filepath.Join(dir, "peer-sync-key")
	if err := os.WriteFile(localKey, key, 0o600); err != nil {
		t.Fatal(err)
	}

	// One pool of three model servers in a tenant's namespace, opting in
	// with the picker's label.
	const tenant = "install-tenant"
	serverPorts, err := localstack.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespaces(t, ctx, []*unstructured.Unstructured{{Object: map[string]any{"metadata": map[string]any{"namespace": tenant}}}})
	for i := range 3 {
		ip := fmt.Sprintf("127.0.34.%d", i+2)
		srv, err := modelsim.New(modelsim.Options{Addr: net.JoinHostPort(ip, strconv.Itoa(serverPorts[0])), Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		readyPod(t, ctx, tenant, fmt.Sprintf("model-%d", i), ip, map[string]string{"app": "install-model"})
	}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "chat", "namespace": tenant, "labels": map[string]any{"poolpicker.io/picker": flagValue(args, "picker-name")}},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "install-model"}},
			"targetPorts":       []any{map[string]any{"number": int64(serverPorts[0])}},
			"endpointPickerRef": map[string]any{"name": "chat-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}

	// The replicas' pods, ready, at their loopback addresses.
	podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
	ips := []string{"127.0.35.2", "127.0.35.3"}
	for i, ip := range ips {
		readyPod(t, ctx, ns, fmt.Sprintf("poolpicker-%d", i), ip, podLabels)
	}
	sa, _, _ := unstructured.NestedString(deploy.Object, "spec", "template", "spec", "serviceAccountName")
	saConfig, err := env.ServiceAccountConfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(saConfig, kubeconfig); err != nil {
		t.Fatal(err)
	}
	// A scraper allowed to read the metrics, as the docs bind Prometheus.
	scraper, err := env.ServiceAccountConfig(ctx, ns, "install-scraper")
	if err != nil {
		t.Fatal(err)
	}
	reader := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "install-scraper"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "poolpicker-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "install-scraper"}}}
	if err := env.Client.Create(ctx, reader); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), reader) })

	// POD_NAMESPACE, as the Deployment's downward API sets it.
	t.Setenv("POD_NAMESPACE", ns)
	ports, err := localstack.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	type replica struct {
		ip      string
		metrics string
		proc    *localstack.Process
		epp     *eppclient.Client
	}
	var replicas []*replica
	for i, ip := range ips {
		// The last occurrence of a flag wins.
		run := append(slices.Clone(args), "--kubeconfig="+kubeconfig, "--bind-address="+ip, "--peer-sync-key-file="+localKey,
			fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2]),
			fmt.Sprintf("--peer-sync-port=%d", ports[3]))
		r := &replica{ip: ip, metrics: net.JoinHostPort(ip, strconv.Itoa(ports[2])),
			proc: &localstack.Process{Path: pickerBinary, Args: run, Log: filepath.Join(dir, fmt.Sprintf("poolpicker-%d.log", i)), HealthAddr: net.JoinHostPort(ip, strconv.Itoa(ports[1]))},
			epp:  eppclient.New(net.JoinHostPort(ip, strconv.Itoa(ports[0])), eppclient.Options{TLS: true})}
		if err := r.proc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = r.epp.Close()
			if err := r.proc.Stop(); err != nil {
				t.Errorf("stopping replica %s: %v", r.ip, err)
			}
		})
		replicas = append(replicas, r)
	}
	defer func() {
		if t.Failed() {
			for _, r := range replicas {
				t.Logf("replica %s log:\n%s", r.ip, tailLog(r.proc.Log))
			}
		}
	}()
	metric := func(r *replica, name, kind string) float64 {
		t.Helper()
		return scrapeSum(t, ctx, r.metrics, scraper.BearerToken, name, kind)
	}
	for _, r := range replicas {
		poll.Until(t, time.Minute, r.ip+" finding its peer from the pods and streaming to it", func() bool {
			return metric(r, peersync.MetricPeers, "") == 1 && metric(r, peersync.MetricStreams, "") == 1
		})
	}

	answer := &eppclient.Response{Status: 200, Body: []byte(`{"choices":[{"text":"hi"}]}`), ServedPrimary: true}
	// pick routes a prompt through r; inFlight, when set, runs while the
	// request is in flight (routed, not yet answered).
	pick := func(r *replica, prompt string, inFlight func()) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2})
		req := eppclient.Request{Body: body, Response: answer}
		if inFlight != nil {
			req.Response, req.Forward = nil, func(context.Context, *eppclient.Result) (*eppclient.Response, error) {
				inFlight()
				return answer, nil
			}
		}
		res, err := r.epp.Do(ctx, req)
		if err != nil {
			t.Fatalf("pick through %s: %v", r.ip, err)
		}
		if res.Immediate != nil || len(res.Endpoints()) == 0 {
			t.Fatalf("pick through %s not routed: %+v", r.ip, res)
		}
		return res.Endpoints()[0]
	}
	for i, topic := range []string{"tides", "glaciers", "volcanoes"} {
		prefix := strings.Repeat(fmt.Sprintf("A long shared system prompt about %s, which every request of this conversation repeats. ", topic), 40)
		first, second := replicas[i%2], replicas[1-i%2]
		before := metric(second, peersync.MetricReceived, "blocks")
		// While the request is in flight through the first replica, the
		// second applies its in-flight count.
		inFlight := metric(second, peersync.MetricReceived, "in-flight")
		picked := pick(first, prefix+"First question?", func() {
			poll.Until(t, 30*time.Second, second.ip+" applying "+first.ip+"'s in-flight count", func() bool {
				return metric(second, peersync.MetricReceived, "in-flight") > inFlight
			})
		})
		poll.Until(t, 30*time.Second, second.ip+" applying "+first.ip+"'s pick", func() bool {
			return metric(second, peersync.MetricReceived, "blocks") > before
		})
		// Rendezvous hashing alone would send a prefix neither replica has
		// seen to one server from both; here the second replica has seen
		// it, through its peer.
		if got := pick(second, prefix+"Second question?", nil); got != picked {
			t.Errorf("prefix %q: %s picked %s, then %s picked %s; want the server that holds the prefix", topic, first.ip, picked, second.ip, got)
		}
	}

	// A stream from an address that is no replica's (127.0.0.1) is refused.
	refused := metric(replicas[0], peersync.MetricRefused, "")
	conn, err := grpc.NewClient(net.JoinHostPort(replicas[0].ip, strconv.Itoa(ports[3])),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))) //nolint:gosec // the replica's self-signed certificate
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/poolpicker.peersync.v1.PeerSync/Push")
	if err == nil {
		_ = stream.SendMsg(&wrapperspb.BytesValue{})
		_ = stream.CloseSend()
		err = stream.RecvMsg(&wrapperspb.BytesValue{})
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a stream from 127.0.0.1 to the peer-sync port: %v, want PermissionDenied", err)
	}
	if got := metric(replicas[0], peersync.MetricRefused, ""); got != refused+1 {
		t.Errorf("%s = %v after one stream from no replica, want %v", peersync.MetricRefused, got, refused+1)
	}
}

// scrapeSum sums the series of a metric on the metrics page at addr (those
// of label kind, when given), fetched with token.
func scrapeSum(t *testing.T, ctx context.Context, addr, token, name, kind string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scraping %s: %s: %.300s", addr, resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s's metrics: %v", addr, err)
	}
	total := 0.0
	for _, m := range fams[name].GetMetric() {
		if kind != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "kind" && l.GetValue() == kind }) {
			continue
		}
		total += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return total
}
