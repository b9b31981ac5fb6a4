#!/usr/bin/env bash
# make kind-up: a kind management cluster the way a user makes one (docs/developer/kind.md):
#
#   1. the host checked and, where needed, prepared (hack/kind/host.sh);
#   2. every image built offline, or taken from the cache (hack/kind/images.sh);
#   3. clusterctl's local repositories: Cluster API's core, kubeadm bootstrap and control plane and
#      CAPD rendered from their modules' config/default as their releases render them, CAPR's from
#      this checkout (make release-manifests), and cert-manager's CRDs with the offline stand-in for
#      its controllers (test/kind/certissuer);
#   4. a kind cluster that mounts the host's docker socket (CAPD creates its machines beside it);
#   5. clusterctl init --core cluster-api --bootstrap kubeadm --control-plane kubeadm
#      --infrastructure docker --addon capr, from those repositories, with ClusterTopology on;
#   6. every provider's Deployment available, or a clear error naming what keeps it from starting.
#
# The kubeconfig is written to $KIND_STATE/kubeconfig (make kind-up prints it). A second run reuses
# a management cluster that already exists and answers, and re-installs nothing.
set -euo pipefail
# shellcheck source=versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
cd "$KIND_ROOT"
log() { echo "kind-up: $*"; }
die() { echo "kind-up: $*" >&2; exit 1; }
start=$SECONDS

hack/kind/host.sh
hack/kind/images.sh

mkdir -p "$KIND_STATE"
K=("$KUBECTL" --kubeconfig "$MGMT_KUBECONFIG")
GOMODCACHE=$(go env GOMODCACHE)
CAPI=$GOMODCACHE/sigs.k8s.io/cluster-api@$CAPI_VERSION
CAPD=$GOMODCACHE/sigs.k8s.io/cluster-api/test@$CAPI_VERSION/infrastructure/docker
CERT_MANAGER=$GOMODCACHE/github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION
[ -d "$CERT_MANAGER" ] || (cd hack/kind/capi && GOFLAGS= go mod download "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")

# 3. The local repositories, laid out as clusterctl reads them: {provider}/{version}/{components}.
REPO=$KIND_STATE/repository
rm -rf "$REPO"
provider() { # directory, components file, kustomize dir, metadata.yaml
	local dir=$REPO/$1/$CAPI_VERSION
	mkdir -p "$dir"
	# As CAPI's release does (make release-manifests): the manager images under registry.k8s.io/cluster-api
	# at the release's tag, pulled only if not present.
	"$KUBECTL" kustomize "$3" |
		sed -E -e "s#image: .*/(cluster-api-controller|kubeadm-bootstrap-controller|kubeadm-control-plane-controller|capd-manager):.*#image: registry.k8s.io/cluster-api/\1:$CAPI_VERSION#" \
			-e 's#imagePullPolicy: Always#imagePullPolicy: IfNotPresent#' >"$dir/$2"
	cp "$4" "$dir/metadata.yaml"
	grep -q "image: registry.k8s.io/cluster-api/" "$dir/$2" || die "no manager image found in $3"
}
provider cluster-api core-components.yaml "$CAPI/core/config/default" "$CAPI/metadata.yaml"
provider bootstrap-kubeadm bootstrap-components.yaml "$CAPI/bootstrap/kubeadm/config/default" "$CAPI/metadata.yaml"
provider control-plane-kubeadm control-plane-components.yaml "$CAPI/controlplane/kubeadm/config/default" "$CAPI/metadata.yaml"
# CAPD is released with Cluster API, in its release series (CAPI's own e2e gives it CAPI's metadata).
provider infrastructure-docker infrastructure-components.yaml "$CAPD/config/default" "$CAPI/metadata.yaml"
# CAPR: its release assets, with the image this checkout built.
make --no-print-directory release-manifests IMG="$CAPR_IMAGE" RELEASE_DIR="$KIND_STATE/capr-release" >/dev/null
mkdir -p "$REPO/addon-capr/v0.1.0"
cp "$KIND_STATE"/capr-release/{addon-components.yaml,metadata.yaml} "$REPO/addon-capr/v0.1.0/"
# cert-manager: its own CRDs, and the stand-in for its controllers.
mkdir -p "$REPO/cert-manager/$CERT_MANAGER_VERSION"
{
	for crd in "$CERT_MANAGER"/deploy/crds/*.yaml; do
		echo "---"
		cat "$crd"
	done
	sed "s|@CERT_ISSUER_IMAGE@|$CERT_ISSUER_IMAGE|" test/kind/manifests/cert-manager.yaml
} >"$REPO/cert-manager/$CERT_MANAGER_VERSION/cert-manager.yaml"
cat >"$KIND_STATE/clusterctl.yaml" <<EOF
# Written by hack/kind/up.sh: every provider from a local repository.
providers:
- name: cluster-api
  type: CoreProvider
  url: file://$REPO/cluster-api/$CAPI_VERSION/core-components.yaml
- name: kubeadm
  type: BootstrapProvider
  url: file://$REPO/bootstrap-kubeadm/$CAPI_VERSION/bootstrap-components.yaml
- name: kubeadm
  type: ControlPlaneProvider
  url: file://$REPO/control-plane-kubeadm/$CAPI_VERSION/control-plane-components.yaml
- name: docker
  type: InfrastructureProvider
  url: file://$REPO/infrastructure-docker/$CAPI_VERSION/infrastructure-components.yaml
- name: capr
  type: AddonProvider
  url: file://$REPO/addon-capr/v0.1.0/addon-components.yaml
cert-manager:
  url: file://$REPO/cert-manager/$CERT_MANAGER_VERSION/cert-manager.yaml
  version: $CERT_MANAGER_VERSION
EOF

# 4. The kind cluster.
if "$KIND_BINARY" get clusters 2>/dev/null | grep -qx "$MGMT_CLUSTER" && "${K[@]}" get --raw /readyz >/dev/null 2>&1; then
	log "management cluster $MGMT_CLUSTER exists"
else
	docker network inspect kind >/dev/null 2>&1 || touch "$KIND_STATE/created-kind-network"
	cat >"$KIND_STATE/kind.yaml" <<-EOF
		kind: Cluster
		apiVersion: kind.x-k8s.io/v1alpha4
		nodes:
		- role: control-plane
		  extraMounts:
		  - hostPath: /var/run/docker.sock
		    containerPath: /var/run/docker.sock
	EOF
	"$KIND_BINARY" create cluster --name "$MGMT_CLUSTER" --image "$NODE_IMAGE" --config "$KIND_STATE/kind.yaml" \
		--kubeconfig "$MGMT_KUBECONFIG" --wait 2m
fi

# Every image the providers run, loaded into the management cluster's node (nothing can be pulled).
images=("$CAPR_IMAGE" "$CERT_ISSUER_IMAGE")
for name in cluster-api-controller kubeadm-bootstrap-controller kubeadm-control-plane-controller capd-manager; do
	images+=("$(capi_image $name)")
done
loaded=$("$KIND_BINARY" load docker-image --name "$MGMT_CLUSTER" "${images[@]}" 2>&1) || { echo "$loaded" >&2; exit 1; }

# 5. clusterctl init, unless the providers are installed already.
export CLUSTERCTL_DISABLE_VERSIONCHECK=true CLUSTER_TOPOLOGY=true
if "${K[@]}" get providers.clusterctl.cluster.x-k8s.io -A -o name 2>/dev/null | grep -q addon-capr; then
	log "providers installed already"
	# A new CAPR image under the same tag (this checkout changed) is loaded, but a running Pod keeps
	# the old one: restart the Deployment.
	if grep -q "\"$CAPR_IMAGE\" .*loading" <<<"$loaded"; then
		log "CAPR's image changed: restarting its Deployment"
		"${K[@]}" -n capr-system rollout restart deployment capr-controller-manager
		"${K[@]}" -n capr-system rollout status deployment capr-controller-manager --timeout=3m
	fi
else
	"$CLUSTERCTL" init --config "$KIND_STATE/clusterctl.yaml" --kubeconfig "$MGMT_KUBECONFIG" \
		--core cluster-api --bootstrap kubeadm --control-plane kubeadm --infrastructure docker --addon capr
fi

# 6. Every provider running. A pod that cannot get its image fails this at once, naming the image:
# nothing can be pulled here, so it was not loaded.
deadline=$((SECONDS + 300))
while true; do
	pulls=$("${K[@]}" get pods -A -o jsonpath='{range .items[*]}{range .status.containerStatuses[*]}{.state.waiting.reason}{" "}{.image}{"\n"}{end}{end}' |
		awk '$1 ~ /ErrImagePull|ImagePullBackOff|ErrImageNeverPull|InvalidImageName/ {print $2}' | sort -u)
	[ -z "$pulls" ] || die "these images are not in the management cluster (build and load them: make kind-up builds and loads every image it installs): $pulls"
	notready=$("${K[@]}" get deployments -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.status.availableReplicas}/{.spec.replicas}{"\n"}{end}' |
		awk '{split($2, r, "/"); if (r[1] != r[2]) print $1}')
	[ -z "$notready" ] && break
	[ $SECONDS -lt $deadline ] || die "not available after 5 minutes: $notready"
	sleep 3
done
log "management cluster $MGMT_CLUSTER ready in $((SECONDS - start)) s; kubeconfig: $MGMT_KUBECONFIG"
