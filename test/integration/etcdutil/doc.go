// Package etcdutil holds the tests of etcdutil against real etcd clusters (one process per member,
// test/sandbox): inspection, membership changes, leadership moves, unreachable members and shared
// clients. They need the etcd binary built by `make envtest-assets`.
package etcdutil
