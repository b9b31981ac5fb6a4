// Package kubeadm runs CAPR on the full stack: CAPI's own core, kubeadm bootstrap and
// KubeadmControlPlane reconcilers and admission webhooks, in-process against the sandbox's real
// kube-apiserver, with real etcd members played by the sandbox infrastructure provider.
package kubeadm
