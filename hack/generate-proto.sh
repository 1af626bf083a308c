#!/usr/bin/env bash
# Generates the Go code of the module's .proto files (peer sync's wire
# format) into their directories, without protoc: hack/tools/protogen
# compiles them and runs the pinned protoc-gen-go and protoc-gen-go-grpc.
# With an argument, generates under that copy of the module instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
(cd "$root/hack/tools/protogen" &&
	go build -o "$tools/protogen" . &&
	go build -o "$tools/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc)
cd "$out"
"$tools/protogen" -root . -grpc-plugin "$tools/protoc-gen-go-grpc" $(git -C "$root" ls-files --cached --others --exclude-standard '*.proto')
