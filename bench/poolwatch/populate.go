package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

func startControlPlane() (*testenv.Env, error) {
	return testenv.Start(testenv.Options{})
}

func writeKubeconfig(env *testenv.Env, path string) error {
	return testenv.WriteKubeconfig(env.Config, path)
}

// modelServerPod is shaped like a real vLLM pod (image, args, env,
// resources, probes, volumes), so a full cached pod weighs what it would in
// a cluster.
func modelServerPod(ns, name string, labels map[string]string) *corev1.Pod {
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(8000)}},
			PeriodSeconds: 5, FailureThreshold: 3}
	}
	var envVars []corev1.EnvVar
	for _, kv := range [][2]string{{"HF_HOME", "/data/hf"}, {"VLLM_USE_V1", "1"}, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true"},
		{"NCCL_DEBUG", "WARN"}, {"PORT", "8000"}, {"MODEL", "meta-llama/Llama-3.1-8B-Instruct"}, {"TP_SIZE", "1"}, {"MAX_LORAS", "4"}} {
		envVars = append(envVars, corev1.EnvVar{Name: kv[0], Value: kv[1]})
	}
	envVars = append(envVars, corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}, Key: "token"}}})
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "kubectl.kubernetes.io/default-container": "vllm"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "vllm",
				Image: "vllm/vllm-openai:v0.10.0",
				Args: []string{"--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--tensor-parallel-size", "1",
					"--enable-lora", "--max-loras", "4", "--max-cpu-loras", "12", "--gpu-memory-utilization", "0.9"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000, Protocol: corev1.ProtocolTCP}},
				Env:   envVars,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("32Gi"), "nvidia.com/gpu": resource.MustParse("1")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Gi"), "nvidia.com/gpu": resource.MustParse("1")},
				},
				ReadinessProbe: probe("/health"),
				LivenessProbe:  probe("/health"),
				StartupProbe:   probe("/health"),
				VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "shm", MountPath: "/dev/shm"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
			},
			Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		},
	}
}

func podIP(n int) string { return fmt.Sprintf("10.%d.%d.%d", (n>>16)&255, (n>>8)&255, n&255) }

// populate creates the namespaces, pods (pool pods made Ready with an IP)
// and pools, with a pool of workers.
func populate(env *testenv.Env, f benchFlags) error {
	ctx := context.Background()
	nss := namespaces(f)
	for _, ns := range nss {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	type job func() error
	jobs := make(chan job)
	var firstErr atomic.Value
	var done atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for j := range jobs {
				if err := j(); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				done.Add(1)
			}
		})
	}
	for i := range f.pools {
		ns := nss[i%len(nss)]
		for j := range f.pods {
			n := i*f.pods + j + 1
			jobs <- func() error {
				pod := modelServerPod(ns, fmt.Sprintf("p%d-%d", i, j), map[string]string{"pool": fmt.Sprintf("p%d", i), "app": "vllm"})
				if err := env.Client.Create(ctx, pod); err != nil {
					return err
				}
				pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: podIP(n), PodIPs: []corev1.PodIP{{IP: podIP(n)}},
					Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
				return env.Client.Status().Update(ctx, pod)
			}
		}
	}
	for k := range f.unrelated {
		ns := nss[k%len(nss)]
		jobs <- func() error {
			return env.Client.Create(ctx, modelServerPod(ns, fmt.Sprintf("u%d", k), map[string]string{"app": "unrelated", "batch": fmt.Sprintf("u%d", k%100)}))
		}
	}
	for i := range f.pools {
		ns := nss[i%len(nss)]
		jobs <- func() error {
			pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}}
			pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"pool": v1.LabelValue(fmt.Sprintf("p%d", i))}
			pool.Spec.TargetPorts = []v1.Port{{Number: 8000}}
			pool.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}}
			return env.Client.Create(ctx, pool)
		}
	}
	close(jobs)
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok && err != nil {
		return err
	}
	// A fresh API server builds a CRD's watch cache on the first request
	// to it and answers 429 until it is ready; a cluster's is long warm.
	// Touch the kinds the picker watches so the measured runs do not pay
	// for that.
	if err := env.Client.List(ctx, &v1alpha2.InferenceObjectiveList{}); err != nil {
		return err
	}
	if err := env.Client.List(ctx, &v1alpha2.InferenceModelRewriteList{}); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // no event tells when a watch cache is ready
	return nil
}

// childProcess returns the pid of this process's child running the named
// command, 0 if none.
func childProcess(comm string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != comm {
			continue
		}
		if f := strings.Fields(s[end+1:]); len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			return pid
		}
	}
	return 0
}

// procRSS is a process's resident memory in bytes.
func procRSS(pid int) int64 { return procStatusField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS") }

// procCPU is a process's user and system CPU in seconds.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	// Fields 14 and 15 of stat (utime, stime), in clock ticks of 1/100 s.
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}
