//go:build tools

// Package tools pins k8s.io/kubernetes so that `go build k8s.io/kubernetes/cmd/kube-apiserver` and
// `go build k8s.io/kubernetes/cmd/kube-controller-manager` resolve in this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)
