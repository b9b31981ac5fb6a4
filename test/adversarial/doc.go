// Package adversarial runs CAPR's manager, as main.go sets it up and with the RBAC it ships, on a
// real kube-apiserver and etcd (test/envtest) beside two tenants of one management cluster: a hostile
// one, every object of which is written to stall, steer or mislead CAPR (health checks naming kinds
// CAPR may not read, a typo'd group or another tenant's template, unparsable selectors, overlapping
// health checks, hand-written requests that ask for less fencing, garbage in CAPR's annotations,
// forged fence objects, a Cluster whose annotation names etcd endpoints elsewhere), and an honest one
// whose Machine goes unhealthy. The honest Machine must be marked and remediated, fenced first; none
// of the hostile tenant's Machines may be deleted while a health check covering it requires a fence
// nobody confirmed; the hostile objects must be reported where CAPR promises a condition or event;
// and the manager must neither panic nor hang. A second test black-holes every node of a tenant's
// control-plane cluster under forty health checks reading its etcd, and times the honest tenant's mark. It needs the binaries built by `make envtest-assets`.
package adversarial
