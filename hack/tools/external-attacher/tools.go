//go:build tools

// Package tools pins the CSI external-attacher, built by `make storage-assets` from the Go module
// proxy for the storage-failover tests (test/storage): the real sidecar that turns VolumeAttachments
// into CSI ControllerPublish/ControllerUnpublish calls.
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
)
