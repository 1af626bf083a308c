#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver and etcd) into bin/ from the
# pinned tools modules under hack/tools. Rebuilds only when a pin changes: the
# stamp file records the hash of the tools modules' go.mod/go.sum.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
mkdir -p "$bin"

build() { # name
	local name=$1 dir="$root/hack/tools/$1"
	local want
	want=$(cat "$dir/go.mod" "$dir/go.sum" "$dir/main.go" | sha256sum | cut -d' ' -f1)
	if [[ -x "$bin/$name" && -f "$bin/.$name.stamp" && "$(cat "$bin/.$name.stamp")" == "$want" ]]; then
		return
	fi
	echo "building $name (first build takes minutes; cached afterwards)" >&2
	(cd "$dir" && go build -trimpath -o "$bin/$name.tmp" .)
	mv "$bin/$name.tmp" "$bin/$name"
	echo "$want" >"$bin/.$name.stamp"
}

build etcd
build kube-apiserver
