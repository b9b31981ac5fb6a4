#!/usr/bin/env bash
# Runs every Go fuzz target (func FuzzXxx(f *testing.F) in a _test.go file outside test/) for
# FUZZTIME each, one after another: go test -fuzz takes one target per invocation
# (https://go.dev/doc/security/fuzz). A crash stops the run; go test writes the input to the
# package's testdata/fuzz/FuzzXxx/, where it becomes a seed that every go test run replays.
#
# Usage: hack/fuzz.sh [target regexp]   (FUZZTIME=30s by default; FUZZPARALLEL=1 by default: one
# worker per target, on a shared 2-core machine). Prints per target go test's last status line
# (executions, new interesting inputs) and exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fuzztime=${FUZZTIME:-30s}
parallel=${FUZZPARALLEL:-1}
filter=${1:-.}

# "package target" for every fuzz target, found in the sources so that a new one is never missed.
mapfile -t targets < <(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' \
	--exclude-dir=test --exclude-dir=bin --exclude-dir=.cache . |
	sed -E 's|^(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+).*|\1 \2|' | sort | grep -E "$filter")
if [ "${#targets[@]}" -eq 0 ]; then
	echo "no fuzz target matches $filter" >&2
	exit 1
fi

start=$(date +%s)
for t in "${targets[@]}"; do
	pkg=${t% *}
	name=${t#* }
	echo "=== $pkg $name ($fuzztime)"
	log=$(mktemp)
	if ! go test "$pkg" -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -parallel "$parallel" >"$log" 2>&1; then
		cat "$log"
		rm -f "$log"
		echo "FAIL $pkg $name: the failing input is in $pkg/testdata/fuzz/$name/" >&2
		exit 1
	fi
	grep -E '^fuzz: elapsed' "$log" | tail -1
	rm -f "$log"
done
echo "fuzz: ${#targets[@]} targets, $(($(date +%s) - start))s"
