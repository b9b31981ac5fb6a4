// Package api holds the admission tests of CAPR's API (api/v1alpha1): bad specs are applied to a real
// kube-apiserver with CAPR's CRDs installed (test/envtest) and must be refused naming the field. They
// need the binaries built by `make envtest-assets`.
package api
