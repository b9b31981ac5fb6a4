// Package csiaddonsproto is the wire format csi-addons' controller speaks to a driver's csi-addons
// sidecar for network fencing (service proto.NetworkFence): networkfence.pb.go and
// networkfence_grpc.pb.go are copied unchanged but for the Go package name from
// github.com/csi-addons/kubernetes-csi-addons v0.14.0 internal/proto (Apache-2.0), which Go's
// internal rule keeps from being imported. The proto package and service names are untouched, so
// the stand-in sidecar (test/storage) answers exactly the calls the real controller makes.
package csiaddonsproto
