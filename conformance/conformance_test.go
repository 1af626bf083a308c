package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/poolpicker/poolpicker/conformance"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

const (
	namespace    = "eppconform"
	maxBodyBytes = 1 << 20
)

var (
	env                 *testenv.Env
	eppAddr, healthAddr string
	root                string
)

// TestMain starts a control plane and one poolpicker, built once, serving
// every pool of the suite's namespace with the conformance-test behaviours
// on, as the suite's report on the site runs it.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env, err = testenv.Start(testenv.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Stop()
	dir, err := os.MkdirTemp("", "eppconform-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary, err := localstack.BuildPicker(context.Background(), root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfig(env.Config, kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ports, err := localstack.FreePorts(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	eppAddr, healthAddr = fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	p := &localstack.Process{Path: binary, Log: filepath.Join(dir, "poolpicker.log"), HealthAddr: healthAddr, Args: []string{
		"--kubeconfig=" + kubeconfig, fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]),
		fmt.Sprintf("--metrics-port=%d", ports[2]), "--watch-namespaces=" + namespace, "--pool-selector=",
		"--enable-conformance-test-behaviors", fmt.Sprintf("--max-request-body-bytes=%d", maxBodyBytes),
		"--metrics-endpoint-auth=false", "--tracing=false"}}
	if err := p.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if err := p.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "poolpicker:", err)
		code = 1
	}
	if code != 0 {
		b, _ := os.ReadFile(p.Log)
		fmt.Fprintf(os.Stderr, "poolpicker log:\n%s\n", tail(b))
	}
	return code
}

func tail(b []byte) []byte {
	if len(b) > 8000 {
		return b[len(b)-8000:]
	}
	return b
}

// TestPoolpicker runs every case against poolpicker, claiming every part
// of the contract: each case passes (none is skipped but for what the
// options leave out).
func TestPoolpicker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	outcomes, err := conformance.Run(ctx, conformance.Options{
		EPPAddr: eppAddr, HealthAddr: healthAddr, TLS: true, Config: env.Config, Namespace: namespace,
		Parts:     []conformance.Part{conformance.Protocol, conformance.SuiteBehaviour, conformance.Extension},
		MultiPool: true, MaxBodyBytes: maxBodyBytes,
	})
	if err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	if err := conformance.Report(&report, outcomes); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", report.String())
	if len(outcomes) != len(conformance.Cases()) {
		t.Errorf("%d outcomes of %d cases", len(outcomes), len(conformance.Cases()))
	}
	for _, o := range outcomes {
		t.Run(o.Name, func(t *testing.T) {
			switch o.Status {
			case conformance.Failed:
				t.Error(o.Detail)
			case conformance.Skipped:
				t.Errorf("skipped (%s), although poolpicker claims every part", o.Detail)
			}
		})
	}
	if path := os.Getenv("EPPCONFORM_MARKDOWN"); path != "" {
		var md bytes.Buffer
		if err := conformance.Markdown(&md, outcomes); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, md.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSiteReportListsEveryCase keeps the report on the site in step with the
// cases.
func TestSiteReportListsEveryCase(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "site-src", "conformance.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conformance.Cases() {
		if !strings.Contains(string(doc), "| "+c.Name+" | "+string(c.Part)+" | passed |") {
			t.Errorf("site-src/conformance.md's report lacks %q (%s) as passed: regenerate it with EPPCONFORM_MARKDOWN=FILE go test ./conformance", c.Name, c.Part)
		}
	}
}
