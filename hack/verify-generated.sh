#!/usr/bin/env bash
# Fails when the generated deepcopy code or CRD manifests differ from what
# controller-gen makes of the API types now, or the Go code of a .proto file
# from what hack/generate-proto.sh makes of it. It regenerates in a scratch copy
# of the module, so the working tree is never touched.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

mkdir -p "$scratch/hack/tools" "$scratch/config/crd/bases"
cp "$root/go.mod" "$root/go.sum" "$scratch/"
cp -r "$root/api" "$scratch/api"
cp -r "$root/hack/tools/controller-gen" "$scratch/hack/tools/"
cp "$root/hack/boilerplate.go.txt" "$scratch/hack/"
cd "$scratch"
gen() { go run -modfile=hack/tools/controller-gen/go.mod sigs.k8s.io/controller-tools/cmd/controller-gen "$@"; }
gen object:headerFile=hack/boilerplate.go.txt paths=./api/...
gen crd paths=./api/... output:crd:artifacts:config=config/crd/bases

mkdir -p proto
(cd "$root" && git ls-files --cached --others --exclude-standard '*.proto' '*.pb.go') | while read -r f; do
	mkdir -p "proto/$(dirname "$f")" && cp "$root/$f" "proto/$f"
done
(cd proto && find . -name '*.pb.go' -delete)
"$root/hack/generate-proto.sh" "$scratch/proto"

stale=0
(cd "$root" && git ls-files --cached --others --exclude-standard '*.pb.go') | while read -r f; do
	diff -u "$root/$f" "proto/$f" || echo "$f" >> stale-proto
done
[[ ! -e stale-proto ]] || stale=1
diff -ru "$root/config/crd/bases" config/crd/bases || stale=1
for f in $(find api -name zz_generated.deepcopy.go); do
	diff -u "$root/$f" "$f" || stale=1
done
if ((stale)); then
	echo "generated files are stale: run 'make manifests' (which runs 'make generate') and commit the result" >&2
	exit 1
fi
echo "generated files are up to date"
