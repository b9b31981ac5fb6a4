#!/usr/bin/env bash
# Makes sure this host can run kind and CAPD nodes, changing it only where a check shows it must
# (docs/developer/kind.md, "What the host needs"):
#
#   1. A docker engine that answers. If none answers and this is a Debian host where we are root,
#      Debian's docker.io is installed and dockerd started (no systemd runs on CI machines of this
#      kind). Elsewhere (a laptop with Docker Desktop or a distribution's docker) nothing is installed:
#      a missing engine is an error that says what to do.
#   2. Privileged containers that start. kind and CAPD run every node --privileged. A host whose
#      capability bounding set lacks CAP_SYS_RESOURCE cannot start one: runc fails with "unable to
#      apply caps: operation not permitted". Only then is a runtime wrapper (hack/kind/runc-wrapper)
#      installed as docker's default runtime; it drops that one capability from what runc is asked for.
#   3. debootstrap and jq, which the offline images are built with (hack/kind/images.sh).
#   4. inotify limits for about ten nodes. Every node's systemd, kubelet and containerd take inotify
#      instances from the host's one per-user pool; at Linux's default of 128 instances the seventh
#      or so node's kubelet fails to start ("inotify_init: too many open files") and restarts for
#      ever, so a replacement Machine never gets a Node. Limits below kind's recommended values
#      (kind's "known issues": 512 instances, 524288 watches) are raised to them; higher ones are kept.
#
# Nothing is changed on a host that passes every check. Prints one line per decision.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

log() { echo "host: $*"; }
die() { echo "host: $*" >&2; exit 1; }

DOCKERD_LOG=${DOCKERD_LOG:-/var/log/capr-dockerd.log}
WRAPPER=/usr/local/libexec/capr/runc-wrapper
RUNTIME_NAME=capr-runc

is_root() { [ "$(id -u)" = 0 ]; }

apt_install() { # packages...
	is_root || die "need root to install $* (apt-get)"
	command -v apt-get >/dev/null || die "$* missing, and this host has no apt-get: install them"
	log "installing $* from Debian's packages"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}

docker_answers() { timeout 20 docker info >/dev/null 2>&1; }

start_dockerd() {
	log "starting dockerd (log: $DOCKERD_LOG)"
	# setsid: the daemon outlives this script and the make that ran it. nice back to 0: the kind nodes
	# are dockerd's children and inherit its priority, and CI builds the images (which may start
	# dockerd) at nice 19 beside make test (.ci/run).
	setsid nice -n "$((-$(nice)))" dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
	# kind-down stops only a dockerd this script started.
	mkdir -p /run/capr-kind
	echo $! >/run/capr-kind/dockerd-started
	for _ in $(seq 1 60); do
		docker_answers && return 0
		sleep 1
	done
	tail -20 "$DOCKERD_LOG" >&2
	die "dockerd did not answer within 60 s"
}

stop_dockerd() {
	local pid
	pid=$(pidof dockerd || true)
	[ -n "$pid" ] || return 0
	kill $pid
	for _ in $(seq 1 30); do
		pidof dockerd >/dev/null || return 0
		sleep 1
	done
	die "dockerd did not stop"
}

# 1. The engine.
if docker_answers; then
	log "docker answers: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"
elif command -v dockerd >/dev/null && is_root; then
	start_dockerd
elif is_root && command -v apt-get >/dev/null && grep -qi debian /etc/os-release; then
	apt_install docker.io
	# docker.io's postinst cannot start the daemon where no init system runs it.
	docker_answers || start_dockerd
else
	die "no docker engine answers: install and start docker (or Docker Desktop), then run this again"
fi

# 2. Privileged containers. The probe is an empty image with no program in it: a host that can apply
# a privileged container's capabilities gets as far as exec and fails there ("no such file"); a host
# that cannot fails earlier, at "unable to apply caps". Nothing is pulled.
probe_privileged() {
	docker image inspect capr-kind/probe:empty >/dev/null 2>&1 ||
		tar -cf - -T /dev/null | docker import - capr-kind/probe:empty >/dev/null
	docker run --rm --privileged --entrypoint /probe capr-kind/probe:empty 2>&1 || true
}
out=$(probe_privileged)
if grep -q 'unable to apply caps' <<<"$out"; then
	is_root || die "privileged containers fail here (no CAP_SYS_RESOURCE in the bounding set); as root, this script installs a runtime wrapper"
	pgrep -x dockerd >/dev/null || die "privileged containers fail here, and dockerd is not a local process: fix the engine's runtime by hand (docs/developer/kind.md)"
	command -v jq >/dev/null || apt_install jq
	log "privileged containers fail (the capability bounding set lacks CAP_SYS_RESOURCE): installing $WRAPPER as docker's default runtime"
	install -D -m0755 runc-wrapper "$WRAPPER"
	mkdir -p /etc/docker
	conf=/etc/docker/daemon.json
	[ -s $conf ] || echo '{}' >$conf
	jq --arg n $RUNTIME_NAME --arg p "$WRAPPER" '.runtimes[$n] = {path: $p} | ."default-runtime" = $n' $conf >$conf.new
	mv $conf.new $conf
	stop_dockerd
	start_dockerd
	out=$(probe_privileged)
	grep -q 'unable to apply caps' <<<"$out" && die "privileged containers still fail with the wrapper: $out"
else
	log "privileged containers start"
fi
grep -q -e 'no such file' -e 'not found' <<<"$out" || die "the privileged probe failed in an unexpected way: $out"

# 3. Build tools.
missing=()
for tool in debootstrap jq; do command -v $tool >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi

# 4. inotify limits (see the header).
raise_limit() { # sysctl minimum
	local now
	now=$(sysctl -n "$1")
	if [ "$now" -ge "$2" ]; then return; fi
	is_root || die "$1 is $now, below the $2 that kind's nodes need: run 'sudo sysctl -w $1=$2'"
	sysctl -qw "$1=$2"
	log "raised $1 from $now to $2"
}
raise_limit fs.inotify.max_user_instances 512
raise_limit fs.inotify.max_user_watches 524288

# cgroup v1: kubelet >= 1.35 refuses it unless told (--fail-cgroupv1=false), and kubeadm's preflight
# refuses it (SystemVerification). The node image and the workload templates carry both settings;
# they are no-ops on cgroup v2. Reported here so a reader of the log knows which applies.
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then log "cgroup v2"; else log "cgroup v1: the node settings for cgroup v1 apply"; fi
log "ready"
