#!/usr/bin/env bash
# make kind-down: removes everything make kind-up and the kind e2e suite created, and checks that
# nothing is left (docs/developer/kind.md):
#
#   1. every workload Cluster deleted through the management cluster, so that CAPD removes its
#      machines and load balancer (bounded: a stuck deletion does not stop the rest);
#   2. any container CAPD left of those clusters, or of a cluster the e2e suite recorded, removed;
#   3. the kind management cluster deleted, and the docker network "kind" if kind-up created it;
#   4. the dockerd that hack/kind/host.sh started, stopped (a docker that was running before is left).
#
# Then it fails if a container, network or process of the platform remains. The images and the
# cache stay: they are what makes the next kind-up fast (make kind-clean removes the images).
set -uo pipefail
# shellcheck source=versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
cd "$KIND_ROOT"
log() { echo "kind-down: $*"; }

docker_up() { timeout 20 docker info >/dev/null 2>&1; }
K=("$KUBECTL" --kubeconfig "$MGMT_KUBECONFIG" --request-timeout=20s)
clusters_file=$KIND_STATE/workload-clusters
mkdir -p "$KIND_STATE"
touch "$clusters_file"

if docker_up; then
	if [ -x "$KIND_BINARY" ] && "$KIND_BINARY" get clusters 2>/dev/null | grep -qx "$MGMT_CLUSTER"; then
		if "${K[@]}" get clusters.cluster.x-k8s.io -A -o name >/dev/null 2>&1; then
			"${K[@]}" get clusters.cluster.x-k8s.io -A -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' >>"$clusters_file"
			log "deleting the workload clusters: $(sort -u "$clusters_file" | tr '\n' ' ')"
			"${K[@]}" delete clusters.cluster.x-k8s.io --all -A --wait=true --timeout=5m >/dev/null 2>&1 ||
				log "not every Cluster was deleted within 5 minutes; removing their containers"
		fi
	fi
	# CAPD labels each container it creates with the name of its workload cluster.
	for c in $(sort -u "$clusters_file"); do
		ids=$(docker ps -aq --filter "label=io.x-k8s.kind.cluster=$c")
		[ -z "$ids" ] || { log "removing the containers of $c"; docker rm -f -v $ids >/dev/null; }
	done
	if [ -x "$KIND_BINARY" ]; then
		"$KIND_BINARY" delete cluster --name "$MGMT_CLUSTER" >/dev/null 2>&1 && log "deleted the kind cluster $MGMT_CLUSTER"
	fi
	if [ -e "$KIND_STATE/created-kind-network" ] && [ -z "$(docker network inspect kind -f '{{range .Containers}}x{{end}}' 2>/dev/null)" ]; then
		docker network rm kind >/dev/null 2>&1 && log "removed the docker network kind"
		rm -f "$KIND_STATE/created-kind-network"
	fi
fi

# What must not remain.
left=()
if docker_up; then
	for c in "$MGMT_CLUSTER" $(sort -u "$clusters_file"); do
		[ -z "$(docker ps -aq --filter "label=io.x-k8s.kind.cluster=$c")" ] || left+=("containers of $c")
	done
	if [ -e "$KIND_STATE/created-kind-network" ]; then left+=("the docker network kind"); fi
fi
for p in kind clusterctl kubectl; do
	pgrep -f "$KIND_BIN/$p-" >/dev/null && left+=("a $p process")
done
pgrep -f "port-forward" >/dev/null && left+=("a port-forward")
if [ ${#left[@]} -gt 0 ]; then
	log "left behind: ${left[*]}" >&2
	exit 1
fi
: >"$clusters_file"
rm -f "$MGMT_KUBECONFIG"

# 4. The engine, if host.sh started it: nothing of the platform runs after kind-down.
if [ -e /run/capr-kind/dockerd-started ] && docker_up; then
	pid=$(cat /run/capr-kind/dockerd-started)
	if kill "$pid" 2>/dev/null; then
		for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
		kill -0 "$pid" 2>/dev/null && { log "dockerd $pid did not stop" >&2; exit 1; }
		log "stopped the dockerd that hack/kind/host.sh started"
	fi
	rm -f /run/capr-kind/dockerd-started
fi
log "nothing left"
