// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command image builds poolpicker's container image from a static binary,
// without a container engine, as one archive that is both an OCI image
// layout and a `docker save` archive; `image check` reads one back.
//
//	go run . build --binary poolpicker --out poolpicker.tar --ref ghcr.io/poolpicker/poolpicker:v0.1.0 \
//	    --version v0.1.0 --commit <sha> --created 2026-01-01T00:00:00Z --arch amd64
//	go run . check --ref ghcr.io/poolpicker/poolpicker:v0.1.0 poolpicker.tar
//
// check also pushes the archive, as `crane push` does, to a registry on
// loopback and pulls it back.
//
// One archive serves every consumer: `docker load` (Docker 25+ reads the OCI
// layout, older ones manifest.json), `kind load image-archive` and
// `ctr images import` (the OCI index, named by its io.containerd.image.name
// annotation) and `crane push` (manifest.json, as go-containerregistry's
// tarball package reads it).
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// The image's fixed shape; test/install and the Dockerfile check the same.
const (
	binaryPath = "/poolpicker"
	user       = "65532:65532" // "nonroot" of distroless images
	source     = "https://github.com/poolpicker/poolpicker"
)

// ports are the container ports poolpicker listens on by default: ext_proc,
// gRPC health, metrics.
var ports = []string{"9002/tcp", "9003/tcp", "9090/tcp"}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image build|check [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = runBuild(os.Args[2:])
	case "check":
		err = runCheck(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build or check", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func runBuild(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	binary := fs.String("binary", "", "static linux poolpicker binary to put at "+binaryPath)
	out := fs.String("out", "", "archive to write")
	ref := fs.String("ref", "", "image reference the archive is tagged with (registry/repository:tag)")
	version := fs.String("version", "", "version label")
	commit := fs.String("commit", "", "commit label")
	created := fs.String("created", "", "creation time, RFC 3339 (the commit's time keeps builds reproducible)")
	arch := fs.String("arch", "amd64", "GOARCH of the binary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for flagName, v := range map[string]string{"binary": *binary, "out": *out, "ref": *ref, "version": *version, "commit": *commit, "created": *created} {
		if v == "" {
			return fmt.Errorf("--%s is required", flagName)
		}
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", *ref, err)
	}
	when, err := time.Parse(time.RFC3339, *created)
	if err != nil {
		return fmt.Errorf("--created %q: %w", *created, err)
	}
	bin, err := os.ReadFile(*binary)
	if err != nil {
		return err
	}
	img, err := buildImage(bin, *arch, *version, *commit, when.UTC())
	if err != nil {
		return err
	}
	if err := writeArchive(*out, tag, img); err != nil {
		return err
	}
	// Read back as every consumer reads it, so a bad archive fails here.
	if _, _, err := checkArchive(*out, tag); err != nil {
		return fmt.Errorf("the written archive does not read back: %w", err)
	}
	return nil
}

// buildImage makes a one-layer image holding only the binary: no shell, no
// libc, no package manager, run as a non-root user.
func buildImage(bin []byte, arch, version, commit string, created time.Time) (v1.Image, error) {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(binaryPath, "/"), Mode: 0o755, Size: int64(len(bin)), ModTime: created, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerBytes := layerTar.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Created = v1.Time{Time: created}
	cf.Author = source
	cf.History = []v1.History{{Created: v1.Time{Time: created}, CreatedBy: "hack/tools/image: COPY poolpicker " + binaryPath}}
	cf.Config = v1.Config{
		User:         user,
		Entrypoint:   []string{binaryPath},
		WorkingDir:   "/",
		ExposedPorts: map[string]struct{}{},
		Labels:       Labels(version, commit, created),
	}
	for _, p := range ports {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return img, nil
}

// Labels are the OCI annotations the image carries in its config.
func Labels(version, commit string, created time.Time) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "poolpicker",
		"org.opencontainers.image.description": "Endpoint Picker for the Gateway API Inference Extension, serving many InferencePools",
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    commit,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
}

// writeArchive writes img as an OCI image layout whose blobs are also
// listed in a docker-save manifest.json, in one tar file.
func writeArchive(path string, tag name.Tag, img v1.Image) error {
	rawManifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	manifestDigest, err := img.Digest()
	if err != nil {
		return err
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configDigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	type file struct {
		name string
		data []byte
	}
	files := []file{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}}
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Digest:    manifestDigest,
			Size:      int64(len(rawManifest)),
			Annotations: map[string]string{
				// containerd (kind, ctr) names the imported image by this;
				// the OCI key holds the tag as the image-layout spec says.
				"io.containerd.image.name":          tag.Name(),
				"org.opencontainers.image.ref.name": tag.TagStr(),
			},
		}},
	}
	rawIndex, err := json.Marshal(index)
	if err != nil {
		return err
	}
	files = append(files, file{"index.json", rawIndex})
	docker := []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: blob(configDigest), RepoTags: []string{tag.Name()}}}
	files = append(files, file{blob(manifestDigest), rawManifest}, file{blob(configDigest), rawConfig})
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		files = append(files, file{blob(d), b})
		docker[0].Layers = append(docker[0].Layers, blob(d))
	}
	rawDocker, err := json.Marshal(docker)
	if err != nil {
		return err
	}
	files = append(files, file{"manifest.json", rawDocker})

	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	dirs := map[string]bool{}
	for _, fl := range files {
		// Directories first, as docker load and some tar readers expect.
		for d := filepath.Dir(fl.name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range []string{"blobs", "blobs/sha256"} {
		if dirs[d] {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, Format: tar.FormatPAX}); err != nil {
				return errors.Join(err, f.Close())
			}
		}
	}
	for _, fl := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fl.name, Mode: 0o644, Size: int64(len(fl.data)), Format: tar.FormatPAX}); err != nil {
			return errors.Join(err, f.Close())
		}
		if _, err := tw.Write(fl.data); err != nil {
			return errors.Join(err, f.Close())
		}
	}
	if err := errors.Join(tw.Close(), f.Close()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// runCheck reads an archive as `crane push` does (manifest.json) and as
// containerd does (the OCI layout), validates both images (every digest and
// diff ID) and checks that they are the same image, tagged --ref. It prints
// the image's digest and config as JSON.
func runCheck(args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	ref := fs.String("ref", "", "the reference the archive must be tagged with")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *ref == "" {
		return errors.New("usage: image check --ref REF ARCHIVE")
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", *ref, err)
	}
	digest, cf, err := checkArchive(fs.Arg(0), tag)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(struct {
		Digest string
		Config *v1.ConfigFile
	}{digest.String(), cf})
}

// checkArchive reads the archive at path both ways, validates both images
// and checks that they are one image tagged tag.
func checkArchive(path string, tag name.Tag) (v1.Hash, *v1.ConfigFile, error) {
	var none v1.Hash
	fromDocker, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		return none, nil, fmt.Errorf("reading %s as a docker-save archive tagged %s: %w", path, tag, err)
	}
	if err := validate.Image(fromDocker); err != nil {
		return none, nil, fmt.Errorf("docker-save view: %w", err)
	}
	dir, err := os.MkdirTemp("", "image-check-")
	if err != nil {
		return none, nil, err
	}
	defer os.RemoveAll(dir)
	if err := untar(path, dir); err != nil {
		return none, nil, err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return none, nil, fmt.Errorf("reading %s as an OCI image layout: %w", path, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return none, nil, err
	}
	if len(im.Manifests) != 1 {
		return none, nil, fmt.Errorf("OCI index lists %d manifests, want 1", len(im.Manifests))
	}
	if got := im.Manifests[0].Annotations["io.containerd.image.name"]; got != tag.Name() {
		return none, nil, fmt.Errorf("OCI index names the image %q, want %q", got, tag.Name())
	}
	fromOCI, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return none, nil, err
	}
	if err := validate.Image(fromOCI); err != nil {
		return none, nil, fmt.Errorf("OCI layout view: %w", err)
	}
	// The docker-save view synthesizes its own manifest (Docker media
	// types), so the two agree on content: config and layers.
	c1, err := fromDocker.ConfigName()
	if err != nil {
		return none, nil, err
	}
	c2, err := fromOCI.ConfigName()
	if err != nil {
		return none, nil, err
	}
	if c1 != c2 {
		return none, nil, fmt.Errorf("docker-save view has config %s, OCI view %s: two different images", c1, c2)
	}
	l1, err := fromDocker.Layers()
	if err != nil {
		return none, nil, err
	}
	l2, err := fromOCI.Layers()
	if err != nil {
		return none, nil, err
	}
	if len(l1) != len(l2) {
		return none, nil, fmt.Errorf("docker-save view has %d layers, OCI view %d", len(l1), len(l2))
	}
	for i := range l1 {
		a, err := l1[i].Digest()
		if err != nil {
			return none, nil, err
		}
		b, err := l2[i].Digest()
		if err != nil {
			return none, nil, err
		}
		if a != b {
			return none, nil, fmt.Errorf("layer %d is %s in the docker-save view, %s in the OCI view", i, a, b)
		}
	}
	d1, err := fromOCI.Digest()
	if err != nil {
		return none, nil, err
	}
	if err := pushAndPull(path, fromDocker, tag); err != nil {
		return none, nil, err
	}
	cf, err := fromOCI.ConfigFile()
	return d1, cf, err
}

// pushAndPull does what `crane push ARCHIVE REF` does (crane loads a file
// with tarball.ImageFromPath) against a registry served on loopback, then
// pulls the image back and compares its layers.
func pushAndPull(path string, img v1.Image, tag name.Tag) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	defer func() {
		_ = srv.Close()
		<-done
	}()
	dst := lis.Addr().String() + "/" + tag.RepositoryStr() + ":" + tag.TagStr()
	if err := crane.Push(img, dst, crane.Insecure); err != nil {
		return fmt.Errorf("crane push %s to a loopback registry: %w", path, err)
	}
	pulled, err := crane.Pull(dst, crane.Insecure)
	if err != nil {
		return fmt.Errorf("pulling back %s: %w", dst, err)
	}
	if err := validate.Image(pulled); err != nil {
		return fmt.Errorf("pulled image: %w", err)
	}
	want, err := img.ConfigName()
	if err != nil {
		return err
	}
	if got, err := pulled.ConfigName(); err != nil || got != want {
		return fmt.Errorf("pulled image has config %v (%v), pushed %v", got, err, want)
	}
	return nil
}

func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("archive entry %q leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if err := os.WriteFile(target, b, 0o644); err != nil {
				return err
			}
		}
	}
}
