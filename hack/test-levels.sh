#!/usr/bin/env bash
# Runs every Go test package of `make test` in two lanes side by side, so that at most two test
# binaries run at once (as `go test -p 2` did) but never two of the heavy ones:
#
#   heavy: the two packages that run many workload clusters one after another (etcd member
#          processes, kubelet stand-ins) or the full stack (CAPI's core, KCP, kube-controller-manager):
#          test/kubeadm, then test/scenarios. Side by side they loaded this 2-core machine until
#          healthy etcd members could not be dialled within the sandbox's timeouts (issue 35).
#   light: everything else, one package at a time: pure unit tests and envtest suites, then the
#          packages that start one sandbox with a cluster or two (test/e2e, test/binary,
#          test/sandbox, test/storage), which fill the time the heavy lane still needs (light about
#          13 minutes before them, heavy about 28 on the 2-core CI machine).
#
# Usage: hack/test-levels.sh <timeout> [go test flags...]. The chaos suite is run by the Makefile
# after this. Prints each lane's time at the end; exits non-zero if either lane failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

timeout=${1:?usage: hack/test-levels.sh <timeout> [go test flags...]}
shift

# The heavy packages, longest first (full stack, then the sandbox scenarios); the single-sandbox
# packages run last in the light lane.
heavy=(./test/kubeadm ./test/scenarios)
single_sandbox=(./test/storage ./test/e2e ./test/binary ./test/sandbox)
# Excluded from make test: the fault suite (run after this) and the full-stack scenarios kept for
# make test-kcp (test/kubeadm/more).
mapfile -t light < <(go list ./... | grep -v -e '/test/chaos' -e '/test/kubeadm' \
	-e '/test/scenarios$' -e '/test/storage$' -e '/test/e2e$' -e '/test/binary$' -e '/test/sandbox$')

stamp() { date -u +%H:%M:%S; }
lane() { # name, then go test arguments
	local name=$1
	shift
	local start=$SECONDS
	echo "== $(stamp) lane $name: start"
	go test "$@" -p 1 -count=1 -timeout "$timeout" 2>&1 | sed -u "s/^/[$name] /"
	local rc=${PIPESTATUS[0]}
	echo "== $(stamp) lane $name: exit $rc after $((SECONDS - start)) s"
	echo "$rc $((SECONDS - start))" >"$tmp/$name"
	return "$rc"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lane heavy "${heavy[@]}" "$@" &
heavy_pid=$!
lane light "${light[@]}" "${single_sandbox[@]}" "$@"
wait "$heavy_pid"

rc=0
echo "== test lanes (seconds):"
for name in heavy light; do
	read -r lrc secs <"$tmp/$name" || { lrc=1; secs=?; }
	echo "   $name: $secs s, exit $lrc"
	[ "$lrc" = 0 ] || rc=1
done
exit "$rc"
