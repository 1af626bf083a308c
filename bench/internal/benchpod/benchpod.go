// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package benchpod builds the pods the scale benchmarks create: shaped like
// real vLLM pods, so that a full pod weighs in the API server and in a
// client's cache what it would in a cluster.
package benchpod

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ModelServer is a vLLM pod (image, args, env, resources, probes, volumes)
// serving on port.
func ModelServer(ns, name string, labels map[string]string, port int32) *corev1.Pod {
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port)}},
			PeriodSeconds: 5, FailureThreshold: 3}
	}
	p := strconv.Itoa(int(port))
	var envVars []corev1.EnvVar
	for _, kv := range [][2]string{{"HF_HOME", "/data/hf"}, {"VLLM_USE_V1", "1"}, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true"},
		{"NCCL_DEBUG", "WARN"}, {"PORT", p}, {"MODEL", "meta-llama/Llama-3.1-8B-Instruct"}, {"TP_SIZE", "1"}, {"MAX_LORAS", "4"}} {
		envVars = append(envVars, corev1.EnvVar{Name: kv[0], Value: kv[1]})
	}
	envVars = append(envVars, corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}, Key: "token"}}})
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": p, "kubectl.kubernetes.io/default-container": "vllm"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "vllm",
				Image: "vllm/vllm-openai:v0.10.0",
				Args: []string{"--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", p, "--tensor-parallel-size", "1",
					"--enable-lora", "--max-loras", "4", "--max-cpu-loras", "12", "--gpu-memory-utilization", "0.9"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
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

// SetReady gives pod the status a kubelet reports for a running, ready
// pod at ip (write it with a status update).
func SetReady(pod *corev1.Pod, ip string) {
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
}
