#!/usr/bin/env bash
# Checks that hack/tools (the module that builds kube-apiserver, kube-controller-manager, etcd and
# the CSI components for the tests) uses CAPR's versions of every module both builds compile. Where
# they agree, a package is compiled once for the tools and the tests; where they differ, it and
# everything above it is compiled twice, which made an empty-cache `make test` about ten minutes
# longer (docs/developer/testing.md#ci). Exits 1 naming each module whose versions differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fmt='{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}'
main=$(go list -tags envtest -test -deps -f "$fmt" ./... | sort -u)
tools=$(cd hack/tools && go list -deps -f "$fmt" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager ./etcd \
	github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher \
	github.com/csi-addons/kubernetes-csi-addons/cmd/manager | sort -u)
differ=$(join <(echo "$main") <(echo "$tools") | awk '$2 != $3 { printf "  %s: CAPR %s, hack/tools %s\n", $1, $2, $3 }')
if [ -n "$differ" ]; then
	echo "hack/tools and CAPR's module compile different versions of:"
	echo "$differ"
	echo "Raise the lower one (go get <module>@<version> in that module, then go mod tidy)."
	exit 1
fi

# The kind platform builds Cluster API's managers (hack/kind/capi) at the version CAPR requires: the
# platform runs the providers CAPR is built and tested against.
want=$(go list -m -f '{{.Version}}' sigs.k8s.io/cluster-api)
got=$(cd hack/kind/capi && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' sigs.k8s.io/cluster-api)
if [ "$want" != "$got" ]; then
	echo "hack/kind/capi builds Cluster API $got, CAPR requires $want: set both require and replace in hack/kind/capi/go.mod to $want"
	exit 1
fi
