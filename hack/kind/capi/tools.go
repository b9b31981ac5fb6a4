//go:build tools

// Package capi pins the programs of Cluster API that the kind platform runs (hack/kind/images.sh),
// at the version CAPR's own go.mod requires: the managers of the core, the kubeadm bootstrap and
// control-plane providers and CAPD (the docker infrastructure provider, in the cluster-api/test
// module), and clusterctl, which installs them all.
package capi

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
	_ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
)
