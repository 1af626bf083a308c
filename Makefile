# poolpicker — developer entry points. `make help` lists them.

SHELL := /usr/bin/env bash
BIN := $(CURDIR)/bin
CONTROLLER_GEN := go run -modfile=hack/tools/controller-gen/go.mod sigs.k8s.io/controller-tools/cmd/controller-gen

.PHONY: help
help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: generate
generate: ## Regenerate deepcopy code of the API types.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: generate ## Regenerate the CRD manifests under config/crd/bases.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases

.PHONY: verify
verify: ## Fail when generated files are stale.
	hack/verify-generated.sh

.PHONY: control-plane
control-plane: ## Build kube-apiserver and etcd into bin/ (only when missing or re-pinned).
	hack/build-control-plane.sh

.PHONY: test
test: control-plane verify ## Run every test (unit, API server, e2e) with the race detector.
	KUBEBUILDER_ASSETS=$(BIN) go test -race -count=1 ./...

.PHONY: run
run: control-plane ## Run poolpicker locally: API server, sample pools, simulated model servers (ARGS="-v 2" passes flags).
	go build -o $(BIN)/localdemo ./cmd/localdemo
	$(BIN)/localdemo $(ARGS)

.PHONY: docs
docs: ## Build the documentation site from site-src/ into site/ (needs Debian's mkdocs + mkdocs-material).
	@command -v mkdocs >/dev/null || { echo "mkdocs missing: apt-get install -y mkdocs mkdocs-material" >&2; exit 1; }
	mkdocs build --strict
