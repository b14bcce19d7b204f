# Lease operator: the front door. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN_VERSION ?= v0.23.0
# golangci-lint comes with the Kubernetes API linter compiled in; both are pinned in
# hack/tools/go.mod (golangci-lint v2.15.0, kube-api-linter by pseudo-version).
BENCHSTAT_VERSION ?= v0.0.0-20260908200009-22c9c6c9d4da
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-kal
# openapi-gen is pinned to the kube-openapi version in go.mod.
OPENAPI_GEN_VERSION ?= $(shell go list -m -f '{{.Version}}' k8s.io/kube-openapi)
OPENAPI_GEN ?= $(LOCALBIN)/openapi-gen-$(OPENAPI_GEN_VERSION)
MONGODEV ?= $(LOCALBIN)/mongodev
IMG ?= vancetope/lease-operator:dev
# The agent's own image (Dockerfile target agent), for --agent-image (docs/operations.md).
AGENT_IMG ?= vancetope/lease-agent:dev
# Extra flags for go test, e.g. GOTEST_FLAGS=-v or GOTEST_FLAGS='-run Store'.
GOTEST_FLAGS ?=

.PHONY: all
all: build

##@ General
.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development
.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs, RBAC and webhook manifests into config/.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook

.PHONY: generate
generate: $(CONTROLLER_GEN) $(OPENAPI_GEN) ## Generate DeepCopy methods, the live API's OpenAPI definitions and the admission API's OpenAPI JSON.
	go generate ./api/openapi
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."
	$(OPENAPI_GEN) --go-header-file hack/boilerplate.go.txt --output-dir api/live/openapi \
		--output-pkg $(shell go list -m)/api/live/openapi --output-file zz_generated.openapi.go \
		--output-model-name-file zz_generated.model_name.go --report-filename hack/openapi-violations.list \
		./api/live/v1alpha1 k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## go vet both modules.
	go vet ./...
	go vet -tags robustness ./test/robustness/
	cd hack/mongodev && go vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (v2, with the Kubernetes API linter on api/) over both modules.
	$(GOLANGCI_LINT) run ./...
	cd hack/mongodev && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

.PHONY: fmt-check
fmt-check: ## Fail if gofmt would change a file.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: check-test-sleeps
check-test-sleeps: ## Fail on a time.Sleep in a test without a "// real time: <why>" comment.
	hack/check-test-sleeps.sh

.PHONY: tidy-check
tidy-check: ## Fail if go mod tidy would change a module.
	go mod tidy -diff
	cd hack/mongodev && go mod tidy -diff
	cd hack/tools && go mod tidy -diff

.PHONY: verify
verify: manifests generate fmt-check tidy-check check-test-sleeps vet lint ## What a reviewer runs: regenerate, format, tidy, test sleeps, vet, lint; then nothing may have changed or appeared.
	@git diff --exit-code || { echo "verify: generated or tracked files changed (see the diff above)"; exit 1; }
	@untracked=$$(git status --porcelain --untracked-files=all | grep '^??' || true); \
		if [ -n "$$untracked" ]; then echo "verify: untracked files after generation:"; echo "$$untracked"; exit 1; fi

.PHONY: envtest
envtest: ## Build (once, cached outside the repo) the envtest control plane; prints its directory.
	@hack/envtest-bins.sh

.PHONY: kwok
kwok: ## Build (once, cached outside the repo) kwok and its stage file, which make pods run on the local control plane; prints the binary's path.
	@hack/kwok-bin.sh

.PHONY: test
# The JSON of go test goes through hack/testsummary: go test's usual output (failures, the
# closing ok/FAIL line per package), then the ten slowest tests of the run.
# The vet prerequisite vets both modules with every analyzer, test files included, so the tests
# run with -vet=off: go test's own vet subset would check the same code again (84 s of a cold
# 582 s build of every test binary on 2 cores, docs/testing.md).
test: vet mongodev ## Run all tests: unit, store (dev server or $$MONGODB_URI), envtest integration.
	KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" KWOK_BIN="$$(hack/kwok-bin.sh)" MONGODEV_BIN=$(MONGODEV) \
		go test -count=1 -vet=off -json $(GOTEST_FLAGS) ./... | go run ./hack/testsummary -top 10
	cd hack/mongodev && go test -count=1 -vet=off $(GOTEST_FLAGS) ./...

.PHONY: test-e2e
test-e2e: mongodev ## Run the whole-system tests in test/e2e.
	KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" MONGODEV_BIN=$(MONGODEV) \
		go test -count=1 $(GOTEST_FLAGS) ./test/e2e/...

# The robustness suite (docs/robustness.md) is built only with the tag robustness, so that
# `go test ./...` leaves it out. ROBUSTNESS_SEED picks the first seed (a failing run prints
# the one that reproduces it); ROBUSTNESS_FAIRNESS, ROBUSTNESS_FAULTS, ROBUSTNESS_CHURN,
# ROBUSTNESS_ASSERT_RECOVERY=off and ROBUSTNESS_ASSERT_FALSE_503=off are passed on from the
# command line or the environment.
ROBUSTNESS_SEEDS ?= 20
ROBUSTNESS_GO_TEST = KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" MONGODEV_BIN=$(MONGODEV) \
	go test -tags robustness -count=1 -v $(GOTEST_FLAGS) -run TestRobustness ./test/robustness/

# The interleaving checker of the booking protocol (docs/robustness.md, "Interleaving checker"):
# make test runs a bounded part of it; test-robustness runs CHECKER_RUNS schedules per scenario.
CHECKER_RUNS ?= 200

.PHONY: test-robustness
test-robustness: mongodev ## The robustness suite: real processes, faults, a checked history; ROBUSTNESS_SEEDS seeds (default 20, about 18 minutes) per fairness policy; then CHECKER_RUNS schedules of the interleaving checker.
	ROBUSTNESS_SEEDS=$(ROBUSTNESS_SEEDS) $(ROBUSTNESS_GO_TEST) -timeout 4h
	CHECKER_RUNS=$(CHECKER_RUNS) MONGODEV_BIN=$(MONGODEV) go test -count=1 -v -timeout 2h \
		-run 'TestInterleavingsKeepTheCap|TestDeadWaiterRecoversWithinTheBound|TestRandomInterleavingsWithFaults|TestOppositeOrdersNeverDeadlock|TestPartsCrashAtEveryCommand|TestRandomPartsInterleavingsWithFaults' ./internal/leasestore/

.PHONY: test-robustness-short
test-robustness-short: mongodev ## The robustness suite's short run (CI): one seed per fairness policy, 3 s of churn per fault, under two minutes.
	ROBUSTNESS_SEEDS=1 ROBUSTNESS_CHURN=$${ROBUSTNESS_CHURN:-3s} $(ROBUSTNESS_GO_TEST) -timeout 10m

.PHONY: bench
bench: mongodev ## Run the benchmarks (store round trips per operation, contention) against the dev server or $$MONGODB_URI.
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench 'Uncontended|Contended' -benchtime 200x ./internal/leasestore/
	# The CPU of one store round trip, bare and through the driver, and of a command (docs/figures.md, "Agent footprint").
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench 'RoundTripCPU|CommandCPU' -benchtime 2000x ./internal/leasestore/
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench 'AgentFootprint|AgentFleet' -benchtime 1x -timeout 20m ./cmd/agent/
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench Scale -benchtime 3x -timeout 30m ./internal/leasestore/
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench 'ContendedWaiting' -benchtime 100x ./internal/leasing/
	# Waiting (docs/waiting.md): fixed-length runs, about two minutes.
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench 'PeerWorkload|Handoff|FullLevel' -benchtime 1x ./internal/leasing/
	# Borrowing (docs/borrowing.md): the burst of issue 21, about 20 s.
	MONGODEV_BIN=$(MONGODEV) go test -run '^$$' -bench 'Borrowing' -benchtime 1x ./internal/leasing/
	KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" MONGODEV_BIN=$(MONGODEV) \
		go test -run '^$$' -bench . -benchtime 20x ./internal/liveapi/
	# What callers that are no pod cost the API server (docs/operations.md, "Pod identity"), under a minute.
	KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" go test -run '^$$' -bench 'UnknownCallers$$' -benchtime 3x ./internal/podwatch/
	KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" go test -run '^$$' -bench UnknownCallerFlood -benchtime 1x ./internal/podwatch/
	# The peer workload on the deployed shape (docs/figures.md): the built manager and two agents, about a minute.
	KUBEBUILDER_ASSETS="$$(hack/envtest-bins.sh)" MONGODEV_BIN=$(MONGODEV) \
		go test -tags robustness -run '^$$' -bench PeerWorkloadDeployed -benchtime 1x -timeout 10m ./test/robustness/

##@ Build
.PHONY: build
build: ## Build the manager, the agent and the kubectl plugin into bin/.
	go build -o $(LOCALBIN)/ ./cmd/manager
	go build -tags nethttpomithttp2 -o $(LOCALBIN)/ ./cmd/agent
	go build -o $(LOCALBIN)/kubectl-lease ./cmd/kubectl-lease

.PHONY: mongodev
mongodev: $(MONGODEV) ## Build the MongoDB-compatible development server.

$(MONGODEV): $(shell find hack/mongodev -name '*.go' -o -name 'go.mod' -o -name 'go.sum' 2>/dev/null)
	go build -C hack/mongodev -o $(MONGODEV) .

.PHONY: mongo
mongo: $(MONGODEV) ## Run the development MongoDB server in the foreground on 127.0.0.1:27017.
	$(MONGODEV) --listen 127.0.0.1:27017

.PHONY: run
run: build $(MONGODEV) ## Run the dev store and the manager against the current kubeconfig (or an envtest control plane where pods run, by kwok; KWOK=off leaves them Pending).
	hack/run.sh

.PHONY: docker-build
docker-build: ## Build the container images, the manager's ($(IMG)) and the agent's alone ($(AGENT_IMG)) (needs a Docker engine).
	docker build -t $(IMG) .
	docker build --target agent -t $(AGENT_IMG) .

##@ Tools
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

$(CONTROLLER_GEN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(LOCALBIN)/controller-gen $(CONTROLLER_GEN)

$(OPENAPI_GEN): | $(LOCALBIN)
	cd $$(mktemp -d) && GOFLAGS=-mod=mod GOBIN=$(LOCALBIN) go install k8s.io/kube-openapi/cmd/openapi-gen@$(OPENAPI_GEN_VERSION)
	mv $(LOCALBIN)/openapi-gen $(OPENAPI_GEN)

$(GOLANGCI_LINT): hack/tools/go.mod hack/tools/go.sum | $(LOCALBIN)
	go build -C hack/tools -o $(GOLANGCI_LINT) sigs.k8s.io/kube-api-linter/cmd/golangci-lint-kube-api-linter
