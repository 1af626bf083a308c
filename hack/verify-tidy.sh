#!/usr/bin/env bash
# Fails when a module's go.mod or go.sum is not what `go mod tidy` makes of
# it, printing the difference: the modules code is written in (the product,
# bench, the example plugin). The pinned tools modules under hack/tools change
# only when re-pinned, and tidying them would fetch the test dependencies of
# all of Kubernetes.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=()
for dir in . bench examples/longprompt; do
	if ! (cd "$dir" && go mod tidy -diff); then
		failed+=("$dir")
	fi
done

if ((${#failed[@]})); then
	echo "go.mod or go.sum not tidy in: ${failed[*]} (run go mod tidy there)" >&2
	exit 1
fi
echo "every module is tidy"
