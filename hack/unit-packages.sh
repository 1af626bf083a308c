#!/usr/bin/env bash
# Prints the packages of the main module whose tests need no API server, no
# built binary and no image: those whose test binaries do not link
# internal/testenv (nor testenv itself). `make test-unit` runs them.
set -euo pipefail
cd "$(dirname "$0")/.."

module=$(go list -m)
go list -test -f '{{.ImportPath}}|{{join .Deps " "}}' ./... |
	awk -F'|' -v env="$module/internal/testenv" '
		{ pkg = $1; sub(/ \[.*$/, "", pkg); sub(/(_test|\.test)$/, "", pkg); all[pkg] = 1 }
		index(" " $2 " ", " " env " ") { heavy[pkg] = 1 }
		END { for (p in all) if (!(p in heavy)) print p }' |
	grep -vx "$module/internal/testenv" |
	sort
