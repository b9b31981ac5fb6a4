// Package fencing holds the tests of the storage-fencing backends (remediation/fencing) against a
// real kube-apiserver and etcd (envtest) playing the workload cluster, with csi-addons' own
// NetworkFence and NetworkFenceClass CRDs installed (test/crds/csiaddons). csi-addons' controller does
// not run here: the tests write the status it would write (its result and message strings), which is
// the whole contract the backend reads. The External backend runs against a stand-in power-fencing
// kind (test/crds/externalfencing) whose Fenced condition the tests set, as a provider would.
package fencing
