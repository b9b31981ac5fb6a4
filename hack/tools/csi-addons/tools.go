//go:build tools

// Package tools pins csi-addons' controller manager, built by `make storage-assets` from the Go
// module proxy for the storage-failover tests (test/storage): the real controller that turns
// NetworkFence objects into fence calls on a driver's csi-addons sidecar.
package tools

import (
	_ "github.com/csi-addons/kubernetes-csi-addons/cmd/manager"
)
