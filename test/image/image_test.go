// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The image archive `make image` wrote and the reference it is tagged with;
// `make test` and `make test-image` set them.
var (
	imageArchive = os.Getenv("IMAGE_ARCHIVE")
	imageRef     = os.Getenv("IMAGE_REF")
)

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// imageConfig is the part of an OCI image config the test checks.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User         string              `json:"User"`
		Entrypoint   []string            `json:"Entrypoint"`
		Cmd          []string            `json:"Cmd"`
		Env          []string            `json:"Env"`
		Labels       map[string]string   `json:"Labels"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		} else {
			files[h.Name] = nil
		}
	}
}

func blobPath(digest string) string { return "blobs/" + strings.Replace(digest, ":", "/", 1) }

// TestImageArchive reads the archive of `make image` back with nothing but
// the standard library, as the OCI image-layout and docker-save formats
// define it: one image, tagged, whose config runs /poolpicker as UID 65532
// with the version labels, and whose only layer holds the static binary
// (no shell). It then runs that binary with --version, and reads the
// archive with go-containerregistry as `crane push` does.
func TestImageArchive(t *testing.T) {
	if imageArchive == "" || imageRef == "" {
		t.Skip("IMAGE_ARCHIVE and IMAGE_REF unset: `make test` and `make test-image` build the image and run this test")
	}
	f, err := os.Open(imageArchive)
	if err != nil {
		t.Fatal(err)
	}
	files := readTar(t, f)
	f.Close()

	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", files["oci-layout"])
	}
	var index struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(index.Manifests))
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != imageRef {
		t.Errorf("index names the image %q (what kind and ctr import it as), want %q", got, imageRef)
	}
	var manifest struct {
		MediaType string          `json:"mediaType"`
		Config    ociDescriptor   `json:"config"`
		Layers    []ociDescriptor `json:"layers"`
	}
	if err := json.Unmarshal(files[blobPath(index.Manifests[0].Digest)], &manifest); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(manifest.Layers) != 1 {
		t.Fatalf("manifest %+v: want an OCI manifest of one layer", manifest)
	}
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil {
		t.Fatalf("manifest.json (what docker load reads): %v", err)
	}
	if len(docker) != 1 || docker[0].Config != blobPath(manifest.Config.Digest) || len(docker[0].RepoTags) != 1 || docker[0].RepoTags[0] != imageRef ||
		len(docker[0].Layers) != 1 || docker[0].Layers[0] != blobPath(manifest.Layers[0].Digest) {
		t.Errorf("manifest.json %+v does not describe the OCI manifest's config and layer tagged %s", docker, imageRef)
	}

	var cfg imageConfig
	if err := json.Unmarshal(files[blobPath(manifest.Config.Digest)], &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cfg.Config.User)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/poolpicker" || len(cfg.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/poolpicker] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	labels := cfg.Config.Labels
	for _, k := range []string{"org.opencontainers.image.version", "org.opencontainers.image.revision", "org.opencontainers.image.source", "org.opencontainers.image.title", "org.opencontainers.image.created"} {
		if labels[k] == "" {
			t.Errorf("label %s is missing", k)
		}
	}
	for _, p := range []string{"9002/tcp", "9003/tcp", "9090/tcp"} {
		if _, ok := cfg.Config.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed", p)
		}
	}

	gz, err := gzip.NewReader(bytes.NewReader(files[blobPath(manifest.Layers[0].Digest)]))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	layer := readTar(t, gz)
	if len(layer) != 1 || layer["poolpicker"] == nil {
		names := make([]string, 0, len(layer))
		for n := range layer {
			names = append(names, n)
		}
		t.Fatalf("layer holds %q, want only poolpicker (no shell, no libc)", names)
	}
	bin := layer["poolpicker"]
	if !bytes.HasPrefix(bin, []byte("\x7fELF")) {
		t.Fatal("layer's poolpicker is not an ELF binary")
	}
	if bytes.Contains(bin, []byte("ld-linux")) || bytes.Contains(bin, []byte(".interp\x00")) {
		t.Error("poolpicker names a dynamic loader: it must be static (CGO_ENABLED=0)")
	}

	path := filepath.Join(t.TempDir(), "poolpicker")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		t.Fatalf("poolpicker --version from the image: %v", err)
	}
	want := "poolpicker " + labels["org.opencontainers.image.version"] + " (commit " + labels["org.opencontainers.image.revision"]
	if !strings.HasPrefix(string(out), want) {
		t.Errorf("--version printed %q, want it to start %q (the labels)", out, want)
	}

	// go-containerregistry's readers (crane push's for manifest.json,
	// the OCI layout's as containerd reads it) verify every digest. go run
	// builds the tool first, which takes what it takes on a cold cache: no
	// deadline.
	check := exec.Command("go", "run", ".", "check", "--ref", imageRef, imageArchive)
	check.Dir = filepath.Join(root, "hack", "tools", "image")
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("image check: %v\n%s", err, out)
	}
}

// TestDockerfileBuildsTheSameImage: the Dockerfile, for those who build with
// Docker, sets what the archive's config holds and stamps the same
// version package.
func TestDockerfileBuildsTheSameImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{
		"FROM scratch",
		"CGO_ENABLED=0",
		"github.com/poolpicker/poolpicker/internal/version.Version=",
		"github.com/poolpicker/poolpicker/internal/version.Commit=",
		`USER 65532:65532`,
		`ENTRYPOINT ["/poolpicker"]`,
		"EXPOSE 9002 9003 9090",
		"org.opencontainers.image.version=",
		"org.opencontainers.image.revision=",
		"org.opencontainers.image.source=",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}
