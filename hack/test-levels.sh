#!/usr/bin/env bash
# Runs every Go test package of `make test`, and the fault suite's fixed-seed runs, in two lanes side
# by side, so that at most two test binaries run at once (as `go test -p 2` did) but never two of the
# heavy packages:
#
#   heavy: the two packages that run many workload clusters one after another (etcd member
#          processes, kubelet stand-ins) or the full stack (CAPI's core, KCP, kube-controller-manager):
#          test/kubeadm, then test/scenarios. Side by side they loaded this 2-core machine until
#          healthy etcd members could not be dialled within the sandbox's timeouts. Then
#          every fuzz target fuzzing for TEST_FUZZTIME with one worker (hack/fuzz.sh, as `make fuzz`
#          runs it; go test only replays the seeds), then test/sandbox.
#   light: everything else, one package at a time: pure unit tests and envtest suites (test/integration,
#          test/adversarial, and each package's own, behind the build tag envtest, which both lanes
#          pass), then the packages that start one sandbox with a cluster or two (test/e2e, test/binary,
#          test/storage), then the fault suite (`make chaos` with TEST_CHAOS_RUNS runs from
#          TEST_CHAOS_SEED, TEST_CHAOS_PARALLEL at a time, and the known seeds). Before the fault
#          suite moved here the light lane idled for about 15 minutes while the heavy lane finished,
#          and the fault suite ran alone after both.
#   checks: at the lowest CPU priority (nice 19), what needs CPU but no test waits for: the fuzz
#          targets' instrumented test binaries (every dependency compiled again, about 450 s of both
#          cores from empty caches), which the heavy lane's fuzz step waits for; then golangci-lint
#          (TEST_CHECKS, a command) and hack/verify-tools.sh. The tests mostly wait (etcd joins,
#          remediations), so this lane fills their idle CPU instead of delaying them (the
#          budget from empty caches); nice 19 keeps it from slowing the tests' own processes, which
#          a loaded machine made miss etcd's dial timeouts.
#
# Usage: [TEST_CHAOS_RUNS=n TEST_CHAOS_SEED=s TEST_CHAOS_PARALLEL=p TEST_FUZZTIME=t TEST_CHECKS=cmd]
# hack/test-levels.sh <timeout> [go test flags...]; TEST_CHAOS_RUNS unset or 0 runs no fault suite,
# TEST_FUZZTIME unset or 0 no fuzzing, TEST_CHECKS unset no golangci-lint. Prints each step's and
# each lane's time at the end, with a failed step's failed tests (also into the file
# TEST_LANES_SUMMARY names, if set, for .ci/run); exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

timeout=${1:?usage: hack/test-levels.sh <timeout> [go test flags...]}
shift
go_flags=("$@")

# The heavy packages, longest first (full stack, then the sandbox scenarios); the single-sandbox
# packages run after the other light ones.
heavy=(./test/kubeadm ./test/scenarios)
# Heavy scenarios that make test leaves to make test-kcp and make test-scenarios: what each proves is
# proved at the same level by a test make test keeps, or is listed with the claims resting on it in
# docs/developer/testing.md#ci (the budget).
heavy_elsewhere=(
	TestKCPTwoOfFiveDeadNeverDeadlocks # make test-kcp
	TestCAPIMachineHealthCheckDrivesCAPR # make test-kcp
	TestTopologyMemberDeadDeletesFirst # make test-kcp
	TestTopologyLeaveWaitsForConsent # make test-kcp
	TestTopologyCAPIHealthChecksDriveCAPR # make test-kcp
	TestTopologyCAPIHealthCheckRecoveryWithdrawsCAPR # make test-kcp
	TestTopologyGitOpsRevertIsLeftAlone # make test-kcp
	TestTopologyReplicasRemovedMidRemediationIsLeftAlone # make test-kcp
	TestLostLockNeverAllowsTwoRunning # make test-scenarios
)
single_sandbox=(./test/storage ./test/e2e ./test/binary)
# test/sandbox (one sandbox at a time, about 80 s) ends the heavy lane instead: from empty caches the
# light lane is the longer one (1,838 s against 1,664, 2026-11-28).
heavy_tail=(./test/sandbox)
# Excluded from the go test runs: the fault suite (the light lane's last step) and the full-stack
# scenarios kept for make test-kcp (test/kubeadm/more).
mapfile -t light < <(go list ./... | grep -v -e '/test/chaos' -e '/test/kubeadm' \
	-e '/test/scenarios$' -e '/test/storage$' -e '/test/e2e$' -e '/test/binary$' -e '/test/sandbox$')
# The adversarial suite (one hostile tenant's objects beside an honest one) is what keeps
# the class of tenant defects from coming back: a filter above that dropped it would fail here.
if ! printf '%s\n' "${light[@]}" | grep -q '/test/adversarial$'; then
	echo "hack/test-levels.sh: test/adversarial is missing from the light lane" >&2
	exit 2
fi

stamp() { date -u +%H:%M:%S; }

# step runs one command of a lane, its output prefixed with the lane's name, and records its time.
step() { # lane, step name, command...
	local lane=$1 name=$2
	shift 2
	local start=$SECONDS log
	log=$(mktemp -p "$tmp")
	echo "== $(stamp) lane $lane: $name: start"
	"$@" 2>&1 | tee "$log" | sed -u "s/^/[$lane] /"
	local rc=${PIPESTATUS[0]}
	echo "== $(stamp) lane $lane: $name: exit $rc after $((SECONDS - start)) s"
	printf '%-34s %5d s, exit %d\n' "$name" $((SECONDS - start)) "$rc" >>"$tmp/$lane.steps"
	# A failed step names its failed tests, panics and timeouts in the summary too: CI keeps only
	# the end of a run's output, and a lane's log interleaves with the others'.
	if [ "$rc" != 0 ]; then
		grep -E -e '^\s*--- FAIL' -e '^FAIL\s' -e '^panic:' -e 'test timed out' "$log" | head -n 40 |
			sed 's/^/    ! /' >>"$tmp/$lane.steps"
	fi
	rm -f "$log"
	return "$rc"
}

# -tags envtest: the packages' own envtest suites (*_envtest_test.go, behind the tag so that
# `make unit` starts no API server) run here too.
gotest() { go test -tags envtest "$@" -p 1 -count=1 -timeout "$timeout" "${go_flags[@]}"; }

heavy_lane() {
	local skip
	skip="^($(IFS='|'; echo "${heavy_elsewhere[*]}"))\$"
	local rc=0
	step heavy "go test (full stack, sandbox)" gotest "${heavy[@]}" -skip "$skip" || rc=1
	if [ "${TEST_FUZZTIME:-0}" != 0 ]; then
		# make fuzz, briefly: a crash fails the step and leaves its input in the package's
		# testdata/fuzz/, which go test replays from then on. With the binaries the checks lane
		# built: the instrumented builds are most of make fuzz's time from empty caches.
		step heavy "fuzz (${TEST_FUZZTIME} per target)" fuzz_prebuilt || rc=1
	fi
	step heavy "go test (${heavy_tail[*]})" gotest "${heavy_tail[@]}" || rc=1
	return "$rc"
}

light_lane() {
	local rc=0
	step light "go test (unit, envtest)" gotest "${light[@]}" || rc=1
	step light "go test (single sandbox)" gotest "${single_sandbox[@]}" || rc=1
	if [ "${TEST_CHAOS_RUNS:-0}" -gt 0 ]; then
		# make chaos, as a person runs it; CHAOS_TESTS adds the known seeds (TestChaosKnownSeeds).
		step light "fault suite (${TEST_CHAOS_RUNS} runs)" make --no-print-directory chaos RUNS="$TEST_CHAOS_RUNS" \
			SEED="${TEST_CHAOS_SEED:-1}" PARALLEL="${TEST_CHAOS_PARALLEL:-1}" CHAOS_TESTS='^TestChaos(KnownSeeds)?$$' || rc=1
	fi
	return "$rc"
}

# fuzz_prebuilt waits for the checks lane's instrumented binaries (it writes fuzzbins.rc when done,
# whether or not the build failed) and fuzzes with them at normal priority.
fuzz_prebuilt() {
	local waited=$SECONDS
	until [ -e "$tmp/fuzzbins.rc" ] || ! kill -0 "$checks_pid" 2>/dev/null; do sleep 1; done
	echo "fuzz: waited $((SECONDS - waited)) s for the checks lane's test binaries"
	[ "$(cat "$tmp/fuzzbins.rc" 2>/dev/null)" = 0 ] || { echo "fuzz: the checks lane could not build the test binaries"; return 1; }
	FUZZ_BINS="$tmp/fuzzbins" FUZZTIME="$TEST_FUZZTIME" FUZZPARALLEL=1 hack/fuzz.sh
}

checks_lane() {
	local rc=0
	if [ "${TEST_FUZZTIME:-0}" != 0 ]; then
		step checks "fuzz test binaries (instrumented)" env FUZZ_BINS="$tmp/fuzzbins" FUZZ_BUILD_ONLY=1 hack/fuzz.sh
		local frc=$?
		echo "$frc" >"$tmp/fuzzbins.rc"
		[ "$frc" = 0 ] || rc=1
	fi
	if [ -n "${TEST_CHECKS:-}" ]; then
		step checks "$TEST_CHECKS" bash -c "$TEST_CHECKS" || rc=1
	fi
	step checks "hack/verify-tools.sh" hack/verify-tools.sh || rc=1
	return "$rc"
}

lane() { # name: runs <name>_lane and records the lane's time
	local name=$1 start=$SECONDS
	echo "== $(stamp) lane $name: start"
	"${name}_lane"
	local rc=$?
	echo "== $(stamp) lane $name: exit $rc after $((SECONDS - start)) s"
	echo "$rc $((SECONDS - start))" >"$tmp/$name"
	return "$rc"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The checks lane first, so that its fuzz binaries are ready as early as its priority allows.
(
	renice -n 19 -p "$BASHPID" >/dev/null || echo "hack/test-levels.sh: the checks lane runs at normal priority" >&2
	lane checks
) &
checks_pid=$!
lane heavy &
heavy_pid=$!
lane light
wait "$heavy_pid"
wait "$checks_pid"

rc=0
{
	echo "== test lanes (seconds):"
	for name in heavy light checks; do
		read -r lrc secs <"$tmp/$name" || { lrc=1; secs=?; }
		echo "   $name: $secs s, exit $lrc"
		sed 's/^/     /' "$tmp/$name.steps" 2>/dev/null
	done
} | tee ${TEST_LANES_SUMMARY:+"$TEST_LANES_SUMMARY"}
for name in heavy light checks; do
	read -r lrc _ <"$tmp/$name" || lrc=1
	[ "$lrc" = 0 ] || rc=1
done
exit "$rc"
