# Sourced by the kind platform's scripts: every version they build or run, and the cache they keep
# it in. Kubernetes, etcd and Cluster API come from the go.mod files that pin them for the tests, so
# the kind platform runs what the envtest suites and the full stack run.
# shellcheck shell=bash

KIND_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

modver() { # go.mod file, module path
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$1"
}
KUBERNETES_VERSION=$(modver "$KIND_ROOT/hack/tools/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(modver "$KIND_ROOT/hack/tools/go.mod" go.etcd.io/etcd/server/v3)
CAPI_VERSION=$(modver "$KIND_ROOT/go.mod" sigs.k8s.io/cluster-api)
KIND_VERSION=v0.33.0
COREDNS_VERSION=v1.14.2
CRICTL_VERSION=v1.37.0
# cert-manager's version is clusterctl's default (its config.CertManagerDefaultVersion); its CRDs come
# from this module version (hack/kind/clusterctl.sh).
CERT_MANAGER_VERSION=v1.21.2
DEBIAN_SUITE=bookworm

# The machine-level cache, outside the clone: every binary and root filesystem under a name that
# carries its version, so a second run on the same machine rebuilds nothing (docs/developer/kind.md).
CAPR_CACHE=${CAPR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capr}
KIND_CACHE=$CAPR_CACHE/kind
KIND_BIN=$KIND_CACHE/bin
KIND_BINARY=$KIND_BIN/kind-$KIND_VERSION
KUBECTL=$KIND_BIN/kubectl-$KUBERNETES_VERSION
CLUSTERCTL=$KIND_BIN/clusterctl-$CAPI_VERSION

# The node image and the names of the images the platform builds.
NODE_IMAGE=kindest/node:$KUBERNETES_VERSION
# Images of the platform's own, local only: clusterctl wants canonical names (a registry host).
IMAGE_PREFIX=localhost/capr-kind
CNI_IMAGE=$IMAGE_PREFIX/cni:dev
CERT_ISSUER_IMAGE=$IMAGE_PREFIX/cert-issuer:dev
# CAPR: the image config/manager names, so the shipped components run unchanged.
CAPR_IMAGE=${CAPR_IMAGE:-ghcr.io/capr-io/capr:dev}
capi_image() { echo "registry.k8s.io/cluster-api/$1:$CAPI_VERSION"; }
# The management cluster, its kubeconfig and the state kind-up leaves for kind-down (outside the
# clone, so that a second checkout sees the same cluster).
MGMT_CLUSTER=${MGMT_CLUSTER:-capr-mgmt}
KIND_STATE=${KIND_STATE:-$CAPR_CACHE/state/$MGMT_CLUSTER}
MGMT_KUBECONFIG=$KIND_STATE/kubeconfig
