#!/usr/bin/env bash
# Runs every Go fuzz target (func FuzzXxx(f *testing.F) in a _test.go file outside test/) for
# FUZZTIME each, one after another: go test -fuzz takes one target per invocation
# (https://go.dev/doc/security/fuzz). A crash stops the run; go test writes the input to the
# package's testdata/fuzz/FuzzXxx/, where it becomes a seed that every go test run replays.
#
# Usage: hack/fuzz.sh [target regexp]   (FUZZTIME=30s by default; FUZZPARALLEL=1 by default: one
# worker per target, on a shared 2-core machine). Prints per target go test's last status line
# (executions, new interesting inputs) and exits non-zero on the first failure.
# FUZZ_BINS=dir keeps the instrumented test binaries in dir and uses those already there;
# FUZZ_BUILD_ONLY=1 builds them and fuzzes nothing. make test builds them in its checks lane, at low
# priority beside the tests, and fuzzes with them at the end of the heavy lane (hack/test-levels.sh).
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

# fuzz_target fuzzes one target. A failing input ends the script with exit 1: a file the run wrote
# into the package's testdata/fuzz/<target>/ that also fails when replayed alone, or a seed or an
# input already in testdata that fails when the target is replayed without fuzzing. It returns 1,
# for one more try, when the run failed without one: Go's fuzzing engine sometimes
# exits non-zero without finding anything, "context deadline exceeded" as -fuzztime expires
# (golang/go#51484) or a worker counted as hung on a loaded machine, whose input then passes alone
# (golang/go#56238); such an input is printed and removed, since as a seed it would prove nothing.
fuzz_target() {
	local pkg=$1 name=$2 bin=$3 importpath=$4 log before f
	log=$(mktemp)
	before=$(ls "$pkg/testdata/fuzz/$name" 2>/dev/null || true)
	if (cd "$pkg" && "$bin" -test.run '^$' -test.fuzz "^${name}\$" -test.fuzztime "$fuzztime" -test.parallel "$parallel" \
		-test.timeout 10m -test.fuzzcachedir "$fuzzcache/$importpath" >"$log" 2>&1); then
		grep -E '^fuzz: elapsed' "$log" | tail -1
		rm -f "$log"
		return 0
	fi
	cat "$log"
	for f in $(ls "$pkg/testdata/fuzz/$name" 2>/dev/null); do
		if grep -qxF "$f" <<<"$before"; then
			continue
		fi
		if ! (cd "$pkg" && "$bin" -test.run "^${name}/${f}\$" -test.v >"$log" 2>&1) ||
			! grep -qF -- "--- PASS: ${name}/${f} " "$log"; then
			echo "FAIL $pkg $name: the failing input is $pkg/testdata/fuzz/$name/$f (go test -run '^${name}/${f}\$' $pkg)" >&2
			exit 1
		fi
		echo "fuzz: $pkg/testdata/fuzz/$name/$f passes when replayed alone (the engine's error, not the target's); removed:"
		cat "$pkg/testdata/fuzz/$name/$f"
		rm -f "$pkg/testdata/fuzz/$name/$f"
		rmdir "$pkg/testdata/fuzz/$name" "$pkg/testdata/fuzz" "$pkg/testdata" 2>/dev/null || true
	done
	if ! (cd "$pkg" && "$bin" -test.run "^${name}\$" -test.v >"$log" 2>&1); then
		cat "$log"
		echo "FAIL $pkg $name: a seed (f.Add) or an input in $pkg/testdata/fuzz/$name/ fails (go test -run '^${name}\$' $pkg)" >&2
		exit 1
	fi
	rm -f "$log"
	echo "fuzz: $pkg $name: the fuzzing engine failed without a failing input; trying once more"
	return 1
}

# One instrumented test binary per package (go test -c -fuzz), run once per target from the package's
# directory, as go test -fuzz would run it: the same fuzz cache (go clean -fuzzcache) and a crash's
# input written to the package's testdata/fuzz/. go test -fuzz would link the binary again for every
# target (11 targets in 5 packages: 77 s against 37 s for the three controller packages
# with FUZZTIME=1s and warm caches, 2026-11-28).
start=$(date +%s)
if [ -n "${FUZZ_BINS:-}" ]; then
	bins=$FUZZ_BINS
	mkdir -p "$bins"
else
	bins=$(mktemp -d)
	trap 'rm -rf "$bins"' EXIT
fi
fuzzcache="$(go env GOCACHE)/fuzz"
module=$(go list -m)
built=""
for t in "${targets[@]}"; do
	pkg=${t% *}
	name=${t#* }
	bin="$bins/$(echo "$pkg" | tr -c 'A-Za-z0-9\n' _).test"
	if [[ " $built " != *" $pkg "* ]]; then
		[ -x "$bin" ] || go test -c -fuzz . -o "$bin" "$pkg"
		built="$built $pkg"
	fi
	if [ "${FUZZ_BUILD_ONLY:-}" = 1 ]; then
		continue
	fi
	importpath="$module/${pkg#./}"
	echo "=== $pkg $name ($fuzztime)"
	fuzz_target "$pkg" "$name" "$bin" "$importpath" ||
		fuzz_target "$pkg" "$name" "$bin" "$importpath" ||
		{
			echo "FAIL $pkg $name: the fuzzing engine failed twice without a failing input (its output is above)" >&2
			exit 1
		}
done
if [ "${FUZZ_BUILD_ONLY:-}" = 1 ]; then
	echo "fuzz: built the test binaries of ${#targets[@]} targets into $bins, $(($(date +%s) - start))s"
	exit 0
fi
echo "fuzz: ${#targets[@]} targets, $(($(date +%s) - start))s"
