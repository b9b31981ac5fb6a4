// Package packaging tests what CAPR ships for clusterctl: the components rendered from config/default
// (the code behind `make release-manifests`) are installed onto a real kube-apiserver by clusterctl's
// own library (`clusterctl init --addon capr`, offline, from a local repository laid out like
// config/clusterctl/clusterctl.yaml says), the aggregated ClusterRoles are filled by a real
// kube-controller-manager, and every sample in config/samples is accepted by the installed CRDs.
// They need the binaries built by `make envtest-assets`.
package packaging
