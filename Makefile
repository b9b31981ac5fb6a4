# CAPR — quorum-safe Machine remediation for Cluster API.
#
# Quick start:  make demo   (the sandbox: real kube-apiserver, real etcd, a broken Machine)
#               make unit   (the tests that need no binaries: every package not under test/, seconds)
#               make test   (lint, generated-file check, unit + envtest + real-etcd tests)
#
# Everything is built from the Go module proxy into bin/ (git-ignored) on first use and reused after.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
export GOFLAGS ?= -buildvcs=false

# Versions (pinned).
KUBERNETES_VERSION := v1.36.3
ETCD_VERSION := v3.6.14
EXTERNAL_ATTACHER_VERSION := v4.12.0
CSI_ADDONS_VERSION := v0.14.0
CONTROLLER_GEN_VERSION := v0.21.0
CRD_REF_DOCS_VERSION := v0.3.0
GOLANGCI_LINT_VERSION := v2.12.2

CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
CRD_REF_DOCS := $(BIN)/crd-ref-docs-$(CRD_REF_DOCS_VERSION)
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
ENVTEST_DIR := $(BIN)/k8s
KUBE_APISERVER := $(ENVTEST_DIR)/kube-apiserver
KUBE_CONTROLLER_MANAGER := $(ENVTEST_DIR)/kube-controller-manager
ETCD := $(ENVTEST_DIR)/etcd
APISERVER_STAMP := $(ENVTEST_DIR)/.versions-$(KUBERNETES_VERSION)-$(ETCD_VERSION)
KCM_STAMP := $(ENVTEST_DIR)/.versions-kcm-$(KUBERNETES_VERSION)
CSI_ATTACHER := $(ENVTEST_DIR)/csi-attacher-$(EXTERNAL_ATTACHER_VERSION)
CSI_ADDONS := $(ENVTEST_DIR)/csi-addons-manager-$(CSI_ADDONS_VERSION)
TEST_ASSETS_STAMP := $(ENVTEST_DIR)/.versions-all-$(KUBERNETES_VERSION)-$(ETCD_VERSION)-$(EXTERNAL_ATTACHER_VERSION)-$(CSI_ADDONS_VERSION)
K8S_VERSION_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBERNETES_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 \
	-X k8s.io/component-base/version.gitTreeState=clean

# Release: the manager image and the clusterctl components (out/ is git-ignored).
IMG ?= ghcr.io/capr-io/capr:dev
RELEASE_DIR := $(ROOT)/out
# The version directory of the clusterctl local repository; it must fall in a release series of
# metadata.yaml (0.1 today), or clusterctl refuses the provider.
RELEASE_VERSION ?= v0.1.0
GO_VERSION := $(shell sed -n 's/^go //p' go.mod)
DOCKER ?= docker

TEST_TIMEOUT ?= 60m
GO_TEST_FLAGS ?=

##@ Main

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

.PHONY: demo
# The default demo runs on kube-apiserver and etcd only; the full stack (PROVIDER=kubeadm) and the
# stateful worker also need kube-controller-manager, and the latter the CSI components: a first
# `make demo` builds only what it runs.
demo: apiserver-assets $(if $(filter kubeadm,$(PROVIDER))$(filter worker-stateful,$(SCENARIO)),$(KCM_STAMP)) $(if $(filter worker-stateful,$(SCENARIO)),storage-assets) ## Run the sandbox: a cluster on a real API server and real etcd, one Machine broken and remediated (PROVIDER=kubeadm: on CAPI's own KCP; SCENARIO=worker-stateful: storage fencing and failover).
	go run ./test/sandbox/cmd/demo $(if $(SCENARIO),--scenario=$(SCENARIO)) $(if $(PROVIDER),--provider=$(PROVIDER) --timeout=15m)

# The randomized fault suite: `make chaos RUNS=n SEED=s` runs n scenarios with seeds s, s+1, ...
# (default seed: the clock); PARALLEL=p runs p at a time; PROVIDER=kubeadm runs them on the full stack
# (CAPI's core, KCP, kubeadm bootstrap, webhooks, kube-controller-manager), and with TOPOLOGY=1 builds
# every cluster from a ClusterClass (CAPI's topology controllers run too). `make test` runs
# TEST_CHAOS_RUNS of them on the lightweight providers from a fixed seed, beside the heavy test
# packages: 9 runs (three waves of three, about 3 minutes) keep make test within its 30 minutes on
# 2 cores; `make chaos` keeps 20 (`make chaos SEED=1`: seeds 1-20, what make test ran before).
RUNS ?= 20
SEED ?=
SEEDS ?=
# FIRST_FAULT=alarm: every seed's first fault raises etcd's NOSPACE alarm for its Machine's member.
FIRST_FAULT ?=
PARALLEL ?= 1
TEST_CHAOS_RUNS ?= 9
TEST_CHAOS_SEED ?= 1
# Three scenarios at a time (each in its own namespace with its own manager): the campaigns ran at
# 4 and 5 on 2 cores.
TEST_CHAOS_PARALLEL ?= 3
# `make test` also runs the seeds that once found a defect (TestChaosKnownSeeds in test/chaos).
CHAOS_TESTS ?= ^TestChaos$$

# Every package's tests run in two lanes side by side (hack/test-levels.sh): the heavy packages that
# start workload clusters or the full stack one at a time, everything else beside them, then the
# fault suite in the same lane as everything else; a third lane at low priority builds the fuzz
# binaries and runs golangci-lint and verify-tools beside them. Generated files are checked before
# (make generate rewrites the CRDs that the envtest suites load).
.PHONY: test
test: test-assets vet verify-generate ## Lint, check generated files, run every test (envtest and real etcd) and the fault suite.
	TEST_CHAOS_RUNS=$(TEST_CHAOS_RUNS) TEST_CHAOS_SEED=$(TEST_CHAOS_SEED) TEST_CHAOS_PARALLEL=$(TEST_CHAOS_PARALLEL) \
		TEST_FUZZTIME=$(TEST_FUZZTIME) TEST_CHECKS='$(MAKE) --no-print-directory lint-golangci' \
		hack/test-levels.sh $(TEST_TIMEOUT) $(GO_TEST_FLAGS)

.PHONY: chaos
chaos: apiserver-assets $(if $(filter kubeadm,$(PROVIDER)),$(KCM_STAMP)) ## Randomized fault suite on the sandbox: RUNS=n scenarios from SEED=s, or the seeds SEEDS=a,b lists (PROVIDER=kubeadm: on KCP; with TOPOLOGY=1 every cluster built from a ClusterClass; FIRST_FAULT=alarm: every first fault an etcd NOSPACE alarm); prints the seed of any violation.
	CHAOS_RUNS=$(RUNS) CHAOS_SEED=$(SEED) CHAOS_SEEDS=$(SEEDS) CHAOS_PARALLEL=$(PARALLEL) CHAOS_PROVIDER=$(PROVIDER) CHAOS_TOPOLOGY=$(TOPOLOGY) CHAOS_FIRST_FAULT=$(FIRST_FAULT) go test ./test/chaos -run '$(CHAOS_TESTS)' -count=1 -v -parallel $(PARALLEL) -timeout 1200m $(GO_TEST_FLAGS)

# Tests that need binaries (envtest's kube-apiserver and etcd, the sandbox) are either a package's
# envtest suite, next to its code in *_envtest_test.go files behind the build tag envtest (which
# `make test` and `make lint` pass), or live under test/ (sandbox, scenarios, full stack, chaos,
# storage, e2e, bench, test/integration). Without the tag every package outside test/ is pure: that
# is `make unit`.
UNIT_PACKAGES = $$(go list ./... | grep -v '/test/')
UNIT_TIMEOUT ?= 5m

.PHONY: unit
unit: ## Run the tests that need no binaries (every package not under test/, without the envtest tag): no kube-apiserver, no etcd, bin/ not used.
	go test $(UNIT_PACKAGES) -count=1 -timeout $(UNIT_TIMEOUT) $(GO_TEST_FLAGS)

FUZZTIME ?= 30s
# `make test` fuzzes every target for TEST_FUZZTIME (0: not at all), one worker each, at the end of
# the heavy lane (hack/test-levels.sh).
TEST_FUZZTIME ?= 3s

.PHONY: fuzz
fuzz: ## Run every Go fuzz target (func FuzzXxx outside test/) for FUZZTIME each (default 30s), one after another; a crash's input lands in the package's testdata/fuzz.
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh

.PHONY: test-kcp
test-kcp: envtest-assets ## Every control-plane scenario on the full stack (CAPI core, CABPK, KCP, webhooks, kube-controller-manager); make test runs a subset.
	go test ./test/kubeadm/... -count=1 -v -timeout 60m $(GO_TEST_FLAGS)

.PHONY: test-scenarios
test-scenarios: envtest-assets storage-assets ## Every control-plane scenario on the sandbox (test/scenarios); make test leaves out the few that hack/test-levels.sh names.
	go test ./test/scenarios -count=1 -v -timeout 60m $(GO_TEST_FLAGS)

.PHONY: e2e
e2e: ## The end-to-end suite on a management cluster with CAPD (E2E_KUBECONFIG; E2E_CLUSTER_TEMPLATE, default test/kind/templates; clusterctl from make kind-images); make test runs it on the sandbox, make e2e-kind on kind.
	@test -n "$(E2E_KUBECONFIG)" || { echo "E2E_KUBECONFIG must name the management cluster's kubeconfig (make test runs the suite on the sandbox, make e2e-kind on kind)"; exit 2; }
	E2E_KUBECONFIG=$(E2E_KUBECONFIG) E2E_CLUSTER_TEMPLATE=$(E2E_CLUSTER_TEMPLATE) go test ./test/e2e -count=1 -v -timeout 90m $(GO_TEST_FLAGS)

.PHONY: compare-kcp
compare-kcp: envtest-assets ## Each control-plane fault on the full stack, RUNS times (default 3) with CAPI MHC + KCP's own remediation and with CAPR; medians and ranges per scenario, written to test/bench/results/ (UPDATE_DOCS=1: and into docs/design/kcp-comparison.md; KCP_LOG=file: KCP's own log there; TIMEOUT=d: a run not whole after d is stalled, default 6m).
	go run ./test/sandbox/cmd/compare-kcp $(if $(filter command line,$(origin RUNS)),--runs=$(RUNS)) $(if $(SCENARIO),--scenario="$(SCENARIO)") $(if $(UPDATE_DOCS),--docs=docs/design/kcp-comparison.md) $(if $(KCP_LOG),--kcp-log=$(KCP_LOG)) $(if $(TIMEOUT),--timeout=$(TIMEOUT))

# make bench: fleet sizes and shapes ("one": one health check over all Machines; "many": N/100
# health checks). The defaults take under 20 minutes on 2 cores from an empty machine (docs/performance.md).
BENCH_SIZES ?= 500,2000,10000
BENCH_SHAPES ?= one

.PHONY: bench
bench: apiserver-assets ## Side-by-side health-check benchmark, CAPR vs CAPI's MachineHealthCheck (BENCH_SIZES, BENCH_SHAPES); writes test/bench/results/.
	cd test/bench && BENCH_SIZES=$(BENCH_SIZES) BENCH_SHAPES=$(BENCH_SHAPES) go test . -run '^$$' -bench '^BenchmarkHealthCheck$$' -benchtime 1x -count 1 -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS)

# make bench-steps: RUNS=n remediations, each reported on its own line (default 1 on the sandbox, 3 on
# the full stack, where one takes about two minutes).
.PHONY: bench-steps
bench-steps: envtest-assets ## The control-plane remediator's own latency per step, RUNS times: on the sandbox, or with PROVIDER=kubeadm on the full stack (KCP).
	go test $(if $(filter kubeadm,$(PROVIDER)),./test/kubeadm,./test/scenarios) -run '^$$' \
		-bench '^$(if $(filter kubeadm,$(PROVIDER)),BenchmarkKCPStepLatency,BenchmarkControlPlaneStepLatency)$$' \
		-benchtime 1x -count $(if $(filter command line,$(origin RUNS)),$(RUNS),$(if $(filter kubeadm,$(PROVIDER)),3,1)) -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS)

##@ The kind platform (docs/developer/kind.md)

# A kind management cluster with Cluster API, CAPD and CAPR installed by clusterctl, every image
# built offline into a cache outside the clone (CAPR_CACHE, default ~/.cache/capr).
E2E_KIND_RUN ?= .
E2E_KIND_TIMEOUT ?= 60m
# Each run of the kind faults appends its observer's figures here (docs/developer/kind.md).
E2E_KIND_RESULTS ?= $(ROOT)/test/e2e/results/kind.jsonl

.PHONY: kind-images
kind-images: ## Build every image the kind platform runs, offline (the node image, CAPD's load balancer, CAPI's managers, CAPR), reusing the cache.
	hack/kind/host.sh
	hack/kind/images.sh

.PHONY: kind-up
kind-up: ## Prepare the host if it must be, build the images, and bring up the kind management cluster with CAPI, CAPD and CAPR installed by clusterctl.
	hack/kind/up.sh

.PHONY: kind-down
kind-down: ## Delete every workload cluster, the management cluster and what kind-up started, then fail if a container, network or process is left.
	hack/kind/down.sh

.PHONY: e2e-kind
e2e-kind: kind-up ## The end-to-end suite on kind: real CAPD nodes, real faults injected in them, an observer independent of CAPR (E2E_KIND_RUN selects tests).
	E2E_KUBECONFIG=$$(hack/kind/env.sh MGMT_KUBECONFIG) E2E_KIND_RESULTS=$(E2E_KIND_RESULTS) \
		go test -tags kind ./test/e2e -run '$(E2E_KIND_RUN)' -skip '^TestKindCompare$$' -count=1 -v -timeout $(E2E_KIND_TIMEOUT) $(GO_TEST_FLAGS)

# A comparison campaign writes a results file of its own, named when make starts.
COMPARE_KIND_RESULTS ?= $(ROOT)/test/e2e/results/compare-kind-$(shell date -u +%Y%m%dT%H%M%SZ).jsonl
COMPARE_KIND_TIMEOUT ?= 12h

.PHONY: compare-kind
compare-kind: kind-up ## Each control-plane fault on kind, RUNS times (default 5, fixed before the campaign) with CAPI MHC + KCP's own remediation and with CAPR, judged by the observer; every run in COMPARE_KIND_RESULTS (FAULTS selects rows; docs/design/kcp-comparison.md).
	E2E_KUBECONFIG=$$(hack/kind/env.sh MGMT_KUBECONFIG) E2E_KIND_COMPARE=$(COMPARE_KIND_RESULTS) \
		E2E_KIND_COMPARE_RUNS=$(if $(filter command line,$(origin RUNS)),$(RUNS)) E2E_KIND_COMPARE_FAULTS=$(FAULTS) \
		go test -tags kind ./test/e2e -run '^TestKindCompare$$' -count=1 -v -timeout $(COMPARE_KIND_TIMEOUT) $(GO_TEST_FLAGS)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) $(CRD_REF_DOCS) ## Generate deepcopy code, CRDs, RBAC and the API reference (docs/reference/api.md) from the API types and markers.
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=. paths=./controllers/... paths=./remediation/... output:rbac:dir=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=secret-reader paths=./etcdutil/... output:rbac:dir=config/rbac/secret_reader
	$(CONTROLLER_GEN) object paths=./test/sandbox/api/...
	$(CONTROLLER_GEN) crd paths=./test/sandbox/api/... output:crd:artifacts:config=test/sandbox/config/crd
	$(CRD_REF_DOCS) --source-path=./api/v1alpha1 --config=docs/reference/crd-ref-docs.yaml --renderer=markdown --output-path=docs/reference/api.md --log-level=ERROR

.PHONY: verify-generate
verify-generate: generate ## Fail if generated files are not up to date.
	@if [ -n "$$(git status --porcelain -- api config test/sandbox/api test/sandbox/config docs/reference 2>/dev/null)" ]; then \
		git --no-pager diff -- api config test/sandbox/api test/sandbox/config docs/reference; \
		echo "Generated files are out of date: run 'make generate' and commit the result."; exit 1; fi

# golangci-lint's shared cache keys results by package content and stores them with absolute paths,
# so a second checkout of the same code replays the first one's findings (and stale ones); each
# checkout keeps its own cache.
.PHONY: lint
lint: vet lint-golangci ## gofmt, go vet and golangci-lint (pinned).

.PHONY: vet
vet: ## gofmt and go vet (make test runs them first: go vet compiles what every test package imports).
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^hack/tools/')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed on: $$unformatted"; exit 1; fi
	go vet -tags envtest ./...

.PHONY: lint-golangci
lint-golangci: $(GOLANGCI_LINT) ## golangci-lint (pinned; make test runs it beside the tests, at low priority).
	GOLANGCI_LINT_CACHE=$(CURDIR)/.cache/golangci-lint $(GOLANGCI_LINT) run ./...

.PHONY: verify-tools
verify-tools: ## Fail if hack/tools and CAPR's module compile different versions of a module they share.
	hack/verify-tools.sh

.PHONY: build
build: ## Build the manager binary into bin/capr.
	go build -o $(BIN)/capr .

.PHONY: run
run: ## Run the manager against the current kubeconfig's cluster (CAPI and CAPR CRDs installed).
	go run . $(ARGS)

.PHONY: install
install: ## Install CAPR's CRDs into the current kubeconfig's cluster.
	kubectl apply -k config/crd

.PHONY: uninstall
uninstall: ## Remove CAPR's CRDs from the current kubeconfig's cluster.
	kubectl delete -k config/crd

.PHONY: clean
clean: ## Remove built binaries (bin/).
	rm -rf $(BIN)

##@ Release

.PHONY: release-manifests
release-manifests: ## Render the clusterctl components (config/default) into out/addon-components.yaml and copy out/metadata.yaml (IMG sets the image).
	go run ./hack/release-manifests --out=$(RELEASE_DIR) --image=$(IMG)

.PHONY: local-repository
local-repository: release-manifests ## Lay out the release as a clusterctl local repository (out/repository/addon-capr/RELEASE_VERSION) and write out/clusterctl.yaml pointing at it.
	@mkdir -p $(RELEASE_DIR)/repository/addon-capr/$(RELEASE_VERSION)
	cp $(RELEASE_DIR)/addon-components.yaml $(RELEASE_DIR)/metadata.yaml $(RELEASE_DIR)/repository/addon-capr/$(RELEASE_VERSION)/
	sed -e 's|/path/to/capr/out|$(RELEASE_DIR)|' -e 's|/v0.1.0/|/$(RELEASE_VERSION)/|' config/clusterctl/clusterctl.yaml > $(RELEASE_DIR)/clusterctl.yaml
	@echo "clusterctl init --config $(RELEASE_DIR)/clusterctl.yaml --addon capr:$(RELEASE_VERSION)"

# make docker-build needs no registry and no BuildKit: the static binary of this checkout on a base
# of users, /tmp and CA certificates assembled here, as distroless/static is (hack/kind/images.sh,
# stage capr). make docker-build-dockerfile is the conventional build from the Dockerfile (golang and
# distroless bases, BuildKit); both images run /capr as 65532.
.PHONY: docker-build
docker-build: ## Build the manager image IMG offline (docker; no registry, no BuildKit).
	CAPR_IMAGE=$(IMG) hack/kind/images.sh capr

.PHONY: docker-build-dockerfile
docker-build-dockerfile: ## Build the manager image IMG from the Dockerfile (needs BuildKit and the golang and distroless bases; Go version from go.mod).
	$(DOCKER) build --build-arg GO_VERSION=$(GO_VERSION) -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the manager image IMG.
	$(DOCKER) push $(IMG)

##@ Tools and test binaries (built from the Go module proxy)

.PHONY: envtest-assets
envtest-assets: apiserver-assets $(KCM_STAMP) ## Build kube-apiserver, kube-controller-manager and etcd for envtest into bin/k8s.

.PHONY: test-assets
test-assets: $(TEST_ASSETS_STAMP) ## Build every binary make test runs (envtest-assets and storage-assets) into bin/k8s, in one go build.

# One go build for all five, as make test needs them: one build graph keeps both cores busy where
# five builds one after another left one idle for most of their time (the chains of
# k8s.io/kubernetes' packages, the links), and compiles what they share once.
$(TEST_ASSETS_STAMP): hack/tools/go.mod hack/tools/etcd/main.go
	@mkdir -p $(ENVTEST_DIR)/.build
	@echo "Building kube-apiserver and kube-controller-manager $(KUBERNETES_VERSION), etcd $(ETCD_VERSION), the CSI external-attacher $(EXTERNAL_ATTACHER_VERSION) and csi-addons $(CSI_ADDONS_VERSION) (several minutes the first time)"
	cd hack/tools && go build -o $(ENVTEST_DIR)/.build/ -ldflags "-s -w $(K8S_VERSION_LDFLAGS)" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager ./etcd \
		github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher github.com/csi-addons/kubernetes-csi-addons/cmd/manager
	mv $(ENVTEST_DIR)/.build/kube-apiserver $(KUBE_APISERVER)
	mv $(ENVTEST_DIR)/.build/kube-controller-manager $(KUBE_CONTROLLER_MANAGER)
	mv $(ENVTEST_DIR)/.build/etcd $(ETCD)
	mv $(ENVTEST_DIR)/.build/csi-attacher $(CSI_ATTACHER)
	mv $(ENVTEST_DIR)/.build/manager $(CSI_ADDONS)
	ln -sf $(notdir $(CSI_ATTACHER)) $(ENVTEST_DIR)/csi-attacher
	ln -sf $(notdir $(CSI_ADDONS)) $(ENVTEST_DIR)/csi-addons-manager
	@touch $(APISERVER_STAMP) $(KCM_STAMP) $(CSI_ATTACHER) $(CSI_ADDONS) $@

.PHONY: apiserver-assets
apiserver-assets: $(APISERVER_STAMP) ## Build kube-apiserver and etcd only (what make bench needs) into bin/k8s.

# hack/tools is one module for every binary below (its go.mod says why).
$(APISERVER_STAMP): hack/tools/go.mod hack/tools/etcd/main.go
	@mkdir -p $(ENVTEST_DIR)
	@echo "Building kube-apiserver $(KUBERNETES_VERSION) from the k8s.io/kubernetes module (a few minutes the first time)"
	cd hack/tools && go build -o $(KUBE_APISERVER) -ldflags "-s -w $(K8S_VERSION_LDFLAGS)" k8s.io/kubernetes/cmd/kube-apiserver
	@echo "Building etcd $(ETCD_VERSION) from go.etcd.io/etcd/server/v3"
	cd hack/tools && go build -o $(ETCD) -ldflags "-s -w" ./etcd
	@touch $@

$(KCM_STAMP): hack/tools/go.mod
	@mkdir -p $(ENVTEST_DIR)
	@echo "Building kube-controller-manager $(KUBERNETES_VERSION) from the k8s.io/kubernetes module"
	cd hack/tools && go build -o $(KUBE_CONTROLLER_MANAGER) -ldflags "-s -w $(K8S_VERSION_LDFLAGS)" k8s.io/kubernetes/cmd/kube-controller-manager
	@touch $@

.PHONY: compare-storage
compare-storage: envtest-assets storage-assets ## One storage failover on the real kube-controller-manager and CSI external-attacher, Kubernetes' default vs CAPR's out-of-service taint (about 8 minutes).
	go run ./test/storage/cmd/compare-storage

.PHONY: storage-assets
storage-assets: $(CSI_ATTACHER) $(CSI_ADDONS) ## Build the CSI external-attacher and csi-addons' controller for the storage-failover tests (test/storage) into bin/k8s.

$(CSI_ATTACHER): hack/tools/go.mod
	@mkdir -p $(ENVTEST_DIR)
	@echo "Building the CSI external-attacher $(EXTERNAL_ATTACHER_VERSION) from its Go module"
	cd hack/tools && go build -o $(CSI_ATTACHER) -ldflags "-s -w" github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
	ln -sf $(notdir $(CSI_ATTACHER)) $(ENVTEST_DIR)/csi-attacher

$(CSI_ADDONS): hack/tools/go.mod
	@mkdir -p $(ENVTEST_DIR)
	@echo "Building csi-addons' controller manager $(CSI_ADDONS_VERSION) from its Go module"
	cd hack/tools && go build -o $(CSI_ADDONS) -ldflags "-s -w" github.com/csi-addons/kubernetes-csi-addons/cmd/manager
	ln -sf $(notdir $(CSI_ADDONS)) $(ENVTEST_DIR)/csi-addons-manager

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)/.tmp
	GOBIN=$(BIN)/.tmp go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/.tmp/controller-gen $@

$(CRD_REF_DOCS):
	@mkdir -p $(BIN)/.tmp
	GOBIN=$(BIN)/.tmp go install github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION)
	mv $(BIN)/.tmp/crd-ref-docs $@

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)/.tmp
	GOBIN=$(BIN)/.tmp go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.tmp/golangci-lint $@
