# poolpicker — developer entry points. `make help` lists them.

SHELL := /usr/bin/env bash
BIN := $(CURDIR)/bin
CONTROLLER_GEN := go run -modfile=hack/tools/controller-gen/go.mod sigs.k8s.io/controller-tools/cmd/controller-gen

# The image: `make image IMAGE=registry/repo VERSION=v1.2.3 ARCH=arm64`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's time, so that rebuilding a commit gives the same image.
CREATED ?= $(shell git log -1 --format=%cI 2>/dev/null | grep . || date -u +%Y-%m-%dT%H:%M:%SZ)
ARCH ?= $(shell go env GOARCH)
IMAGE ?= ghcr.io/poolpicker/poolpicker
IMAGE_ARCHIVE ?= $(BIN)/poolpicker-image.tar
VERSION_PKG := github.com/poolpicker/poolpicker/internal/version
# The reference EPP that bench/routing compares against (router reference-epp).
REFERENCE_EPP_VERSION ?= v1.5.0

.PHONY: help
help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: generate
generate: ## Regenerate deepcopy code of the API types and the Go code of the .proto files.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	hack/generate-proto.sh

.PHONY: manifests
manifests: generate ## Regenerate the CRD manifests under config/crd/bases.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	cp config/crd/bases/*.yaml charts/poolpicker/files/crds/
	cp config/grafana/*.json charts/poolpicker/files/dashboards/

.PHONY: verify
verify: ## Fail when generated files are stale, a Go file lacks its license header, a module is not tidy, the docs site does not build, lint finds a problem, a production package holds code only tests reach, or the module does not build for macOS and Windows.
	hack/verify-generated.sh
	hack/verify-headers.sh
	hack/verify-tidy.sh
	$(MAKE) docs
	$(MAKE) lint
	$(MAKE) deadcode
	$(MAKE) cross-build

# The platforms a developer builds on besides Linux: macOS runs `make run`,
# Windows builds.
CROSS_PLATFORMS := darwin/arm64 windows/amd64

.PHONY: cross-build
cross-build: ## Build every package of the module for macOS (arm64) and Windows (amd64).
	@set -e; for p in $(CROSS_PLATFORMS); do \
		echo "go build ./... ($$p)"; \
		GOOS=$${p%/*} GOARCH=$${p#*/} go build ./...; \
	done

# The modules golangci-lint checks, each with the repository's .golangci.yml.
LINT_MODULES := . bench examples/longprompt

# Built once per pin (its first build takes a few CPU-minutes); `make lint`
# then runs the binary in each module.
$(BIN)/golangci-lint: hack/tools/golangci-lint/go.mod hack/tools/golangci-lint/go.sum
	cd hack/tools/golangci-lint && go build -o $(BIN)/golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: lint
lint: $(BIN)/golangci-lint ## Run golangci-lint (.golangci.yml: gofmt, goimports, govet, staticcheck, errorlint, revive, ...) over every module.
	@set -e; for m in $(LINT_MODULES); do \
		echo "golangci-lint run ($$m)"; \
		(cd $$m && $(BIN)/golangci-lint run --config $(CURDIR)/.golangci.yml ./...); \
	done

.PHONY: deadcode
deadcode: ## Fail when poolpicker's binary never reaches a function of a production package (hack/deadcode-allowlist.txt aside).
	hack/verify-deadcode.sh

.PHONY: control-plane
control-plane: ## Build kube-apiserver and etcd into bin/ (only when missing or re-pinned).
	hack/build-control-plane.sh

.PHONY: test
test: control-plane verify image ## Run every test (unit, API server, e2e, install, the image) with the race detector.
	IMAGE_ARCHIVE=$(IMAGE_ARCHIVE) IMAGE_REF=$(IMAGE):$(VERSION) KUBEBUILDER_ASSETS=$(BIN) go test -race -count=1 -timeout 60m ./...
	KUBEBUILDER_ASSETS=$(BIN) go -C bench test -race -count=1 -timeout 60m ./...

.PHONY: test-unit
test-unit: ## The fast loop: the packages whose tests need no API server, binary or image (hack/unit-packages.sh), -short, with the race detector.
	go test -short -race -count=1 $$(hack/unit-packages.sh)

.PHONY: image
image: ## Build the OCI image archive bin/poolpicker-image.tar without Docker (IMAGE, VERSION, ARCH override).
	CGO_ENABLED=0 GOOS=linux GOARCH=$(ARCH) go build -trimpath \
		-ldflags "-s -w -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Commit=$(COMMIT)" \
		-o $(BIN)/image/poolpicker ./cmd/poolpicker
	cd hack/tools/image && go run . build --binary $(BIN)/image/poolpicker --out $(IMAGE_ARCHIVE) \
		--ref $(IMAGE):$(VERSION) --version $(VERSION) --commit $(COMMIT) --created $(CREATED) --arch $(ARCH)
	@echo "$(IMAGE_ARCHIVE): $(IMAGE):$(VERSION); docker load -i, kind load image-archive or crane push it"

.PHONY: test-image
test-image: image ## Build the image and run only its test.
	IMAGE_ARCHIVE=$(IMAGE_ARCHIVE) IMAGE_REF=$(IMAGE):$(VERSION) go test -count=1 ./test/image/

.PHONY: run
run: control-plane ## Run poolpicker locally: API server, sample pools, simulated model servers (ARGS="-v 2" passes flags).
	go build -o $(BIN)/localdemo ./internal/cmd/localdemo
	$(BIN)/localdemo $(ARGS)

.PHONY: reference-epp
reference-epp: ## Build the reference EPP (the Inference Extension's cmd/epp at REFERENCE_EPP_VERSION) into bin/epp, for bench/routing only.
	@# Built in its own module directory with its own go.mod and go.sum: it is
	@# no dependency of any poolpicker module. (`go install ...@version` does
	@# the same, but also asks the proxy for the module's version list.)
	@dir=$$(cd / && go mod download -json sigs.k8s.io/gateway-api-inference-extension@$(REFERENCE_EPP_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	test -n "$$dir" || { echo "reference-epp: go mod download gave no module directory" >&2; exit 1; }; \
	cd "$$dir" && GOWORK=off GOFLAGS=-mod=readonly go build -o $(BIN)/epp ./cmd/epp

.PHONY: docs
docs: ## Build the documentation site from site-src/ into site/ (needs Debian's mkdocs + mkdocs-material).
	@command -v mkdocs >/dev/null || { echo "mkdocs missing: apt-get install -y mkdocs mkdocs-material" >&2; exit 1; }
	PYTHONWARNINGS=ignore mkdocs build --strict --quiet
