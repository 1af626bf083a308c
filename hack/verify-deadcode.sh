#!/usr/bin/env bash
# Fails when a production package holds a function that poolpicker's binary
# never reaches (only a test or a benchmark does), or when an entry of
# hack/deadcode-allowlist.txt is no longer reported (so the list only ever
# shrinks to what is truly needed). deadcode (golang.org/x/tools) is pinned by
# hack/tools/deadcode and analyses the product's main package without tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
allowlist=hack/deadcode-allowlist.txt

got=$(go run -modfile=hack/tools/deadcode/go.mod golang.org/x/tools/cmd/deadcode -test=false \
	-f '{{range .Funcs}}{{$.Path}}.{{.Name}}{{"\n"}}{{end}}' ./cmd/poolpicker | sed '/^$/d' | sort)
want=$(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$allowlist" | sort)

new=$(comm -23 <(echo "$got") <(echo "$want") | sed '/^$/d')
stale=$(comm -13 <(echo "$got") <(echo "$want") | sed '/^$/d')
fail=0
if [[ -n $new ]]; then
	echo "functions in production packages that poolpicker never calls (only tests or benchmarks do):" >&2
	echo "$new" | sed 's/^/  /' >&2
	echo "remove them, move test-only helpers into a _test.go file (export_test.go for other packages' tests)," >&2
	echo "or, for API meant only for out-of-tree users, add them to $allowlist with the reason" >&2
	fail=1
fi
if [[ -n $stale ]]; then
	echo "$allowlist lists functions that are no longer unreachable; delete these entries:" >&2
	echo "$stale" | sed 's/^/  /' >&2
	fail=1
fi
((fail)) && exit 1
echo "no dead code in production packages beyond $allowlist"
