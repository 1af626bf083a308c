// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command manifests renders and lints poolpicker's install manifests with
// Helm's and kustomize's Go libraries, for the tests of test/install and
// test/rbac (so these libraries stay out of poolpicker's module).
//
//	go run . render --chart DIR [--values FILE] [--namespace NS] [--release NAME] [--kubeconfig FILE]
//	go run . lint --chart DIR [--values FILE] [--namespace NS]
//	go run . kustomize DIR
//
// render prints the manifests as `helm template` would (NOTES.txt and
// partials left out), in template-file order; with --kubeconfig, templates'
// lookup calls ask that API server, as `helm install --dry-run=server` does.
// lint prints every finding and fails on a warning or worse, as
// `helm lint --strict` does.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: manifests render|lint|kustomize [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "render":
		err = render(os.Args[2:])
	case "lint":
		err = runLint(os.Args[2:])
	case "kustomize":
		err = runKustomize(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want render, lint or kustomize", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

type common struct {
	chart, values, namespace, release, kubeconfig string
}

func parse(name string, args []string) (*common, error) {
	var c common
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&c.chart, "chart", "", "chart directory")
	fs.StringVar(&c.values, "values", "", "values file merged over the chart's values.yaml")
	fs.StringVar(&c.namespace, "namespace", "poolpicker-system", "release namespace")
	fs.StringVar(&c.release, "release", "poolpicker", "release name")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "API server that templates' lookup calls ask (render only)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.chart == "" {
		return nil, errors.New("--chart is required")
	}
	return &c, nil
}

func (c *common) userValues() (map[string]any, error) {
	if c.values == "" {
		return map[string]any{}, nil
	}
	v, err := chartutil.ReadValuesFile(c.values)
	if err != nil {
		return nil, err
	}
	return v.AsMap(), nil
}

func render(args []string) error {
	c, err := parse("render", args)
	if err != nil {
		return err
	}
	chrt, err := loader.Load(c.chart)
	if err != nil {
		return err
	}
	user, err := c.userValues()
	if err != nil {
		return err
	}
	if err := chartutil.ProcessDependenciesWithMerge(chrt, user); err != nil {
		return err
	}
	vals, err := chartutil.ToRenderValues(chrt, user,
		chartutil.ReleaseOptions{Name: c.release, Namespace: c.namespace, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return err
	}
	var files map[string]string
	if c.kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
		if err != nil {
			return err
		}
		files, err = engine.RenderWithClient(chrt, vals, cfg)
		if err != nil {
			return err
		}
	} else if files, err = engine.Render(chrt, vals); err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if path.Base(name) == "NOTES.txt" || strings.TrimSpace(files[name]) == "" {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("---\n# Source: %s\n%s\n", name, strings.TrimSpace(files[name]))
	}
	return nil
}

func runLint(args []string) error {
	c, err := parse("lint", args)
	if err != nil {
		return err
	}
	user, err := c.userValues()
	if err != nil {
		return err
	}
	result := lint.All(c.chart, user, c.namespace, false)
	failed := 0
	for _, m := range result.Messages {
		fmt.Println(m.Error())
		if m.Severity >= support.WarningSev {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d lint findings of warning or error severity", failed)
	}
	return nil
}

// runKustomize prints the build of one kustomization directory, as
// `kubectl kustomize DIR` does.
func runKustomize(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: manifests kustomize DIR")
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), args[0])
	if err != nil {
		return err
	}
	out, err := res.AsYaml()
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}
