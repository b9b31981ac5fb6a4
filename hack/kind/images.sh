#!/usr/bin/env bash
# Builds every image the kind platform runs, offline: from the Go module proxy and Debian's packages
# only, nothing pulled from a registry (docs/developer/kind.md). Usage: hack/kind/images.sh [stage...]
# with the stages, in order (default: all of them):
#
#   bins    the Go programs, each into the cache under its version: Kubernetes' (kubelet, kubeadm,
#           kubectl, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy), etcd and
#           etcdctl, coredns, crictl, kind, Cluster API's managers and clusterctl, and this
#           checkout's own: the pause program, the CNI and the certificate issuer (test/kind).
#   rootfs  two Debian root filesystems (debootstrap), cached as tarballs keyed by the suite and the
#           package list: the node's, and a small one that every other image is based on.
#   images  the images: Kubernetes' components under the names kubeadm asks for, CAPD's load
#           balancer, the CNI, Cluster API's four managers, the certificate issuer, then the node
#           image (kindest/node) with the images a node runs preloaded into its containerd.
#   capr    CAPR's own manager image CAPR_IMAGE from this checkout (make docker-build).
#
# An image is rebuilt only if its inputs changed: each carries a label with the hash of what it was
# built from. Prints each stage's time.
set -euo pipefail
# shellcheck source=versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
cd "$KIND_ROOT"

export GOFLAGS=-buildvcs=false
GOMODCACHE=$(go env GOMODCACHE)
KIND_MODULE=$GOMODCACHE/sigs.k8s.io/kind@$KIND_VERSION
CAPI_TEST_MODULE=$GOMODCACHE/sigs.k8s.io/cluster-api/test@$CAPI_VERSION
mkdir -p "$KIND_BIN" "$KIND_CACHE/rootfs"
log() { echo "images: $*"; }

K8S_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$KUBERNETES_VERSION") \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
CAPI_LDFLAGS="-X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION \
-X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=$(cut -d. -f2 <<<"$CAPI_VERSION") \
-X sigs.k8s.io/cluster-api/version.gitTreeState=clean"

K8S_PROGRAMS=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
# CAPI's programs: cache name, package.
CAPI_PROGRAMS=(
	"cluster-api-controller sigs.k8s.io/cluster-api/core"
	"kubeadm-bootstrap-controller sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	"kubeadm-control-plane-controller sigs.k8s.io/cluster-api/controlplane/kubeadm"
	"capd-manager sigs.k8s.io/cluster-api/test/infrastructure/docker"
	"clusterctl sigs.k8s.io/cluster-api/cmd/clusterctl"
)

bins() {
	local missing=() p
	for p in "${K8S_PROGRAMS[@]}"; do [ -x "$KIND_BIN/$p-$KUBERNETES_VERSION" ] || missing+=("k8s.io/kubernetes/cmd/$p"); done
	[ -x "$KIND_BIN/etcd-$ETCD_VERSION" ] || missing+=(./etcd)
	[ -x "$KIND_BIN/etcdctl-$ETCD_VERSION" ] || missing+=(go.etcd.io/etcd/etcdctl/v3)
	if [ ${#missing[@]} -gt 0 ]; then
		# One build graph for all of them, with make test-assets' flags: the packages they share with
		# kube-apiserver and kube-controller-manager for envtest come from the Go build cache. They
		# link against glibc, which the node image (Debian) and the component images (built on the
		# same Debian) carry.
		log "building ${#missing[@]} programs (Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION)"
		local out
		out=$(mktemp -d "$KIND_BIN/.build.XXXXXX")
		(cd hack/tools && go build -o "$out/" -ldflags "-s -w $K8S_LDFLAGS" "${missing[@]}")
		for p in "${K8S_PROGRAMS[@]}"; do [ -e "$out/$p" ] && mv "$out/$p" "$KIND_BIN/$p-$KUBERNETES_VERSION"; done
		for p in etcd etcdctl; do [ -e "$out/$p" ] && mv "$out/$p" "$KIND_BIN/$p-$ETCD_VERSION"; done
		rm -rf "$out"
	fi
	local entry name pkg
	for entry in "${CAPI_PROGRAMS[@]}"; do
		read -r name pkg <<<"$entry"
		[ -x "$KIND_BIN/$name-$CAPI_VERSION" ] && continue
		log "building $name (Cluster API $CAPI_VERSION)"
		(cd hack/kind/capi && CGO_ENABLED=0 go build -o "$KIND_BIN/.$name" -ldflags "-s -w $CAPI_LDFLAGS" "$pkg")
		mv "$KIND_BIN/.$name" "$KIND_BIN/$name-$CAPI_VERSION"
	done
	gobin kind "$KIND_VERSION" sigs.k8s.io/kind
	gobin coredns "$COREDNS_VERSION" github.com/coredns/coredns
	gobin crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl
}

gobin() { # name, version, package: go install at that version, outside any module
	local name=$1 version=$2 pkg=$3 dir
	[ -x "$KIND_BIN/$name-$version" ] && return 0
	log "building $name $version"
	dir=$(mktemp -d "$KIND_BIN/.gobin.XXXXXX")
	(cd "$dir" && GOBIN=$dir CGO_ENABLED=0 GOFLAGS= go install -ldflags "-s -w" "$pkg@$version")
	mv "$dir/$name" "$KIND_BIN/$name-$version"
	rm -rf "$dir"
}

# Debian's mirror: the one apt uses here.
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# The node: what kind v0.33.0's images/base installs, from Debian (containerd and runc included).
NODE_PACKAGES=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,fuse-overlayfs,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins,socat,ebtables,less
# Every other image: kube-proxy needs iptables and conntrack, the CNI iproute2 and iptables, CAPD's
# load balancer haproxy.
BASE_PACKAGES=iptables,iproute2,conntrack,ca-certificates,kmod,ipset,ebtables,haproxy
rootfs_tar() { # name, packages: the cached tarball's path
	echo "$KIND_CACHE/rootfs/$1-$DEBIAN_SUITE-$(sha256sum <<<"$2" | cut -c1-12).tar"
}

rootfs() {
	debootstrap_tar node "$NODE_PACKAGES"
	debootstrap_tar base "$BASE_PACKAGES"
}

debootstrap_tar() { # name, packages
	local tar dir
	tar=$(rootfs_tar "$1" "$2")
	[ -s "$tar" ] && return 0
	log "debootstrap $DEBIAN_SUITE for the $1 image ($MIRROR)"
	dir=$(mktemp -d "$KIND_CACHE/rootfs/.$1.XXXXXX")
	debootstrap --variant=minbase --include="$2" "$DEBIAN_SUITE" "$dir" "$MIRROR" >"$dir.log" 2>&1 ||
		{ tail -20 "$dir.log" >&2; return 1; }
	rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
	tar -C "$dir" --numeric-owner -cf "$tar.tmp" .
	mv "$tar.tmp" "$tar"
	rm -rf "$dir" "$dir.log"
}

# label is the image label that carries the hash of an image's inputs.
label=io.capr.kind.inputs
current() { # image, inputs hash: whether the image exists and was built from those inputs
	[ "$(docker image inspect -f "{{ index .Config.Labels \"$label\" }}" "$1" 2>/dev/null)" = "$2" ]
}
hash() { sha256sum | cut -c1-16; }
files_hash() { # files or directories...
	find "$@" -type f -print0 | sort -z | xargs -0 sha256sum | hash
}

# dockerfile_image builds image from a context directory holding a Dockerfile, without BuildKit
# (Debian's docker has no buildx), labelled with its inputs' hash.
dockerfile_image() { # image, inputs hash, context dir
	echo "LABEL $label=$2" >>"$3/Dockerfile"
	DOCKER_BUILDKIT=0 docker build -t "$1" "$3" >"$3.log" 2>&1 || { cat "$3.log" >&2; rm -f "$3.log"; return 1; }
	rm -f "$3.log"
	log "image $1"
}

# imported_image turns a root filesystem tarball into an image.
imported_image() { # image, inputs hash, tarball, docker import --change options...
	local image=$1 h=$2 tar=$3
	shift 3
	current "$image" "$h" && return 0
	docker import --change "LABEL $label=$h" "$@" "$tar" "$image" >/dev/null
	log "image $image"
}

# static_base: what a static Go program needs and distroless/static carries (users, /tmp, CA
# certificates), for the managers, the cert-manager stand-in and CAPR.
STATIC_BASE=$IMAGE_PREFIX/static:1
static_base() {
	local d h
	h=$(cat /etc/ssl/certs/ca-certificates.crt | hash)
	current $STATIC_BASE "$h" && return 0
	d=$(mktemp -d)
	mkdir -p "$d/etc/ssl/certs" "$d/tmp" "$d/home/nonroot"
	chmod 1777 "$d/tmp"
	cp /etc/ssl/certs/ca-certificates.crt "$d/etc/ssl/certs/"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$d/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/etc/group"
	chown 65532:65532 "$d/home/nonroot"
	tar -C "$d" --numeric-owner -cf "$d.tar" .
	imported_image $STATIC_BASE "$h" "$d.tar"
	rm -rf "$d" "$d.tar"
}

# static_image: one static program on the static base, as its entrypoint.
static_image() { # image, binary, user, [entrypoint path]
	local image=$1 bin=$2 user=$3 path=${4:-/manager} h d
	h=$( (docker image inspect -f '{{.Id}}' $STATIC_BASE; sha256sum <"$bin"; echo "$user $path") | hash)
	current "$image" "$h" && return 0
	d=$(mktemp -d)
	cp "$bin" "$d/program"
	printf 'FROM %s\nCOPY program %s\nUSER %s\nENTRYPOINT ["%s"]\n' $STATIC_BASE "$path" "$user" "$path" >"$d/Dockerfile"
	dockerfile_image "$image" "$h" "$d"
	rm -rf "$d"
}

BASE_IMAGE=$IMAGE_PREFIX/base:$DEBIAN_SUITE
# base_image: programs that need a Debian userland (kube-proxy: iptables; the CNI: ip, iptables;
# CAPD's load balancer: haproxy) or link against glibc (Kubernetes' and etcd's, built with cgo like
# make test-assets builds them) run on this one image, so a node's containerd stores it once.
base_image() {
	local tar
	tar=$(rootfs_tar base "$BASE_PACKAGES")
	imported_image $BASE_IMAGE "$(basename "$tar")" "$tar" --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
}

# base_program_image: programs copied onto the base image.
base_program_image() { # image, "entrypoint json or -", user, file=dest...
	local image=$1 entry=$2 user=$3 h d f
	shift 3
	h=$( (docker image inspect -f '{{.Id}}' $BASE_IMAGE; echo "$entry $user $*"; for f in "$@"; do sha256sum <"${f%%=*}"; done) | hash)
	current "$image" "$h" && return 0
	d=$(mktemp -d)
	echo "FROM $BASE_IMAGE" >"$d/Dockerfile"
	local i=0
	for f in "$@"; do
		cp "${f%%=*}" "$d/f$i"
		echo "COPY f$i ${f#*=}" >>"$d/Dockerfile"
		i=$((i + 1))
	done
	[ "$entry" = - ] || echo "ENTRYPOINT $entry" >>"$d/Dockerfile"
	echo "USER $user" >>"$d/Dockerfile"
	dockerfile_image "$image" "$h" "$d"
	rm -rf "$d"
}

# This checkout's programs for the platform (test/kind/cmd), static.
own_bins() {
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$KIND_CACHE/own/" ./test/kind/cmd/...
}

# The images a node preloads, under the names kubeadm asks for (kubeadm config images list).
COMPONENT_IMAGES=()
component_images() {
	local b=$KIND_BIN v=$KUBERNETES_VERSION name image
	while read -r image; do
		name=${image##*/}
		name=${name%%:*}
		case $name in
		kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy)
			base_program_image "$image" - 0 "$b/$name-$v=/usr/local/bin/$name" ;;
		etcd)
			base_program_image "$image" - 0 "$b/etcd-$ETCD_VERSION=/usr/local/bin/etcd" "$b/etcdctl-$ETCD_VERSION=/usr/local/bin/etcdctl" ;;
		coredns)
			static_image "$image" "$b/coredns-$COREDNS_VERSION" 65532 /coredns ;;
		pause)
			static_image "$image" "$KIND_CACHE/own/pause" 65535 /pause ;;
		*)
			echo "images: kubeadm asks for $image, which this script does not build" >&2
			return 1 ;;
		esac
		COMPONENT_IMAGES+=("$image")
	done < <("$b/kubeadm-$v" config images list --kubernetes-version "$v")
	# kind's containerd configuration names its own pause image for pod sandboxes.
	local pause sandbox
	sandbox=$(sed -n 's/.*sandbox_image = "\(.*\)"/\1/p' "$KIND_MODULE/images/base/files/etc/containerd/config.toml")
	for image in "${COMPONENT_IMAGES[@]}"; do [[ $image == */pause:* ]] && pause=$image; done
	if [ -n "$sandbox" ] && [ "$sandbox" != "$pause" ]; then
		docker tag "$pause" "$sandbox"
		COMPONENT_IMAGES+=("$sandbox")
	fi
	base_program_image "$CNI_IMAGE" '["/usr/local/bin/cni"]' 0 "$KIND_CACHE/own/cni=/usr/local/bin/cni"
	COMPONENT_IMAGES+=("$CNI_IMAGE")
}

# CAPD's load balancer: haproxy under CAPD's default image name, read from CAPD's source.
lb_image() {
	local consts image h d
	consts=$CAPI_TEST_MODULE/infrastructure/docker/internal/loadbalancer/const.go
	image=$(awk -F'"' '/DefaultImageRepository =/ {r=$2} /Image =/ && !/Default/ {n=$2} /DefaultImageTag =/ {t=$2} END {print r "/" n ":" t}' "$consts")
	h=$( (docker image inspect -f '{{.Id}}' $BASE_IMAGE; cat hack/kind/haproxy/*) | hash)
	current "$image" "$h" && return 0
	d=$(mktemp -d)
	cp hack/kind/haproxy/* "$d/"
	cat >"$d/Dockerfile" <<-EOF
		FROM $BASE_IMAGE
		COPY haproxy.cfg limits.cfg /usr/local/etc/haproxy/
		COPY haproxy /usr/local/sbin/haproxy
		STOPSIGNAL SIGUSR1
		ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
	EOF
	dockerfile_image "$image" "$h" "$d"
	rm -rf "$d"
}

# Cluster API's managers under the names their released components use; CAPD runs as root, as its
# own image does: it talks to the host's docker socket.
capi_images() {
	local name user
	for name in cluster-api-controller kubeadm-bootstrap-controller kubeadm-control-plane-controller capd-manager; do
		user=65532
		[ $name = capd-manager ] && user=0
		static_image "$(capi_image $name)" "$KIND_BIN/$name-$CAPI_VERSION" $user
	done
	static_image "$CERT_ISSUER_IMAGE" "$KIND_CACHE/own/certissuer" 65532
}

# node_image: kind's base image (kind's images/base, on Debian's containerd and runc), the
# Kubernetes binaries, and every component image imported into the node's containerd.
node_image() {
	local rootfs h raw base cid image
	rootfs=$(rootfs_tar node "$NODE_PACKAGES")
	raw=$IMAGE_PREFIX/node-rootfs:$DEBIAN_SUITE
	imported_image $raw "$(basename "$rootfs")" "$rootfs"
	base=$IMAGE_PREFIX/node-base:$DEBIAN_SUITE
	h=$( (docker image inspect -f '{{.Id}}' $raw; files_hash "$KIND_MODULE/images/base/files" hack/kind/node) | hash)
	if ! current $base "$h"; then
		local d
		d=$(mktemp -d)
		cp -r "$KIND_MODULE/images/base/files" "$d/files"
		chmod -R u+w "$d/files"
		cp hack/kind/node/* "$d/"
		sed "s|@BASE@|$raw|" hack/kind/node/Dockerfile >"$d/Dockerfile"
		dockerfile_image $base "$h" "$d"
		rm -rf "$d"
	fi
	h=$( (docker image inspect -f '{{.Id}}' $base; for image in "${COMPONENT_IMAGES[@]}"; do docker image inspect -f '{{.Id}}' "$image"; done
		sha256sum "$KIND_BIN"/{kubelet,kubeadm,kubectl}-$KUBERNETES_VERSION "$KIND_BIN/crictl-$CRICTL_VERSION" test/kind/manifests/cni.yaml) | hash)
	current "$NODE_IMAGE" "$h" && return 0
	cid=$(docker run -d --entrypoint=sleep $base infinity)
	# shellcheck disable=SC2064
	trap "docker rm -f -v $cid >/dev/null; trap - RETURN" RETURN
	for p in kubelet kubeadm kubectl; do docker cp "$KIND_BIN/$p-$KUBERNETES_VERSION" "$cid:/usr/bin/$p"; done
	docker cp "$KIND_BIN/crictl-$CRICTL_VERSION" "$cid:/usr/local/bin/crictl"
	printf '%s' "$KUBERNETES_VERSION" | docker exec -i "$cid" sh -c 'cat >/kind/version'
	# kind applies /kind/manifests/default-cni.yaml in new kind clusters, its pod subnet filled in.
	docker exec "$cid" mkdir -p /kind/manifests
	sed "s|@CNI_IMAGE@|$CNI_IMAGE|" test/kind/manifests/cni.yaml | docker exec -i "$cid" sh -c 'cat >/kind/manifests/default-cni.yaml'
	docker exec "$cid" sh -c 'containerd >/var/log/containerd-build.log 2>&1 &'
	for _ in $(seq 1 30); do docker exec "$cid" ctr version >/dev/null 2>&1 && break; sleep 1; done
	docker save "${COMPONENT_IMAGES[@]}" | docker exec -i "$cid" ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests - >/dev/null
	# sleep, the build container's PID 1, reaps nothing: wait for containerd to be a zombie, not gone.
	docker exec "$cid" sh -c 'pkill containerd; while ps -C containerd -o stat= | grep -qv Z; do sleep 0.2; done'
	docker commit --change "LABEL $label=$h" --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
		--change 'CMD []' "$cid" "$NODE_IMAGE" >/dev/null
	log "image $NODE_IMAGE"
}

images() {
	own_bins
	static_base
	base_image
	component_images
	lb_image
	capi_images
	node_image
}

# CAPR's own image (make docker-build): the static manager binary of this checkout, built like the
# Dockerfile builds it, on the static base, as 65532 (config/manager's securityContext).
capr() {
	static_base
	local out
	out=$(mktemp -d)
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/capr" .
	static_image "$CAPR_IMAGE" "$out/capr" 65532:65532 /capr
	rm -rf "$out"
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(bins rootfs images capr)
for stage in "${stages[@]}"; do
	start=$SECONDS
	"$stage"
	log "$stage done in $((SECONDS - start)) s"
done
