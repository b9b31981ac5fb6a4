// Package storage runs the parts of Kubernetes that decide storage failover, for real, next to a
// stand-in storage system: kube-controller-manager (attach/detach, taint eviction, pod GC, the
// PersistentVolume binder) and the CSI external-attacher, built from their Go modules, and
// Driver, a small CSI controller plugin that stands in for a storage system (no upstream CSI driver
// with ControllerPublish can run here, see docs/research/storage-failover-components.md). Its
// tests prove what CAPR's out-of-service taint backend does on that real stack: the volume of a
// dead node is detached and attached elsewhere only after the taint, with no second writer.
package storage
