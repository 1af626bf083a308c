#!/usr/bin/env bash
# Fails when a Go file of the repository (every module, generated files
# included) does not start with the license header of hack/boilerplate.go.txt,
# in any year (below a first //go:build line, where controller-gen puts it). With --fix it adds the header to the files that lack it.
set -euo pipefail
cd "$(dirname "$0")/.."
boilerplate=hack/boilerplate.go.txt
line1=$(sed -n 1p "$boilerplate" | sed 's/[0-9]\{4\}/[0-9]{4}/')
line2=$(sed -n 2p "$boilerplate")

missing=()
while IFS= read -r f; do
	[[ -f $f ]] || continue # deleted in the work tree
	{ IFS= read -r a || true; IFS= read -r b || true; IFS= read -r c || true; IFS= read -r d || true; } <"$f"
	# controller-gen writes its build constraint above the header.
	if [[ $a == //go:build* && -z $b ]]; then
		a=$c b=$d
	fi
	if ! [[ $a =~ ^${line1}$ && $b == "$line2" ]]; then
		missing+=("$f")
	fi
done < <(git ls-files --cached --others --exclude-standard -- '*.go')

if ((${#missing[@]} == 0)); then
	echo "every Go file has the license header"
	exit 0
fi
if [[ ${1:-} == --fix ]]; then
	for f in "${missing[@]}"; do
		{ cat "$boilerplate"; echo; cat "$f"; } >"$f.header" && mv "$f.header" "$f"
	done
	echo "added the license header to ${#missing[@]} files"
	exit 0
fi
echo "Go files without the license header of $boilerplate (hack/verify-headers.sh --fix adds it):" >&2
printf '  %s\n' "${missing[@]}" >&2
exit 1
