# Plinth — build, generate and test. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

export GOFLAGS := -buildvcs=false -trimpath
export GOTOOLCHAIN := local

ROOT := $(abspath .)
BIN := $(ROOT)/bin
TOOLS := $(BIN)/tools

CONTROLLER_GEN_VERSION := v0.23.0
CUE_VERSION := v0.17.1
CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_GEN_VERSION)
CUE := $(TOOLS)/cue-$(CUE_VERSION)

.DEFAULT_GOAL := help

##@ General
help: ## Show this help.
	@awk 'BEGIN{FS=":.*##"} /^[a-zA-Z0-9_.-]+:.*##/ {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2} /^##@/ {printf "\n%s\n", substr($$0,5)}' $(MAKEFILE_LIST)

##@ Build
build: ## Build the plinth binary into bin/.
	go build -o $(BIN)/plinth ./cmd/plinth

$(CONTROLLER_GEN):
	GOBIN=$(TOOLS) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(TOOLS)/controller-gen $@

$(CUE):
	GOBIN=$(TOOLS) go install cuelang.org/go/cmd/cue@$(CUE_VERSION)
	mv $(TOOLS)/cue $@

tools: $(CONTROLLER_GEN) $(CUE) ## Install the pinned code generators (controller-gen, cue) into bin/tools.

generate: $(CONTROLLER_GEN) ## Regenerate deepcopy code and CRD YAML (committed).
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./schema/...
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./schema/... output:crd:artifacts:config=schema/crd/bases
	go run ./hack/crdkustomization schema/crd

manifests: generate ## Alias of generate (CRDs are the manifests generated from code).

verify-generate: generate ## Fail when generated files differ from the committed ones.
	@git diff --exit-code -- schema/ || { echo "generated files are stale: run make generate and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- schema/)" || { git status --porcelain -- schema/; echo "untracked generated files: run make generate and commit" >&2; exit 1; }

fmt: ## gofmt the tree.
	gofmt -l -w $$(git ls-files '*.go')

vet: ## go vet every package of the main module.
	go vet ./...

lint: vet ## Static checks: gofmt cleanliness and go vet.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

##@ Test
testbin: ## Build the pinned test peers (Kubernetes, CSI sidecars, csi-sanity, cue) into bin/.
	test/tools/build.sh

kernel-assets: ## Fetch the Debian kernel and build the guest initramfs for kernel tests.
	test/kernel/setup.sh

test-unit: $(CUE) ## Unit tests (no servers).
	PLINTH_CUE=$(CUE) go test ./...

test-integration: testbin ## Tests against the real control plane built by testbin.
	PLINTH_TESTBIN=$(BIN) PLINTH_INTEGRATION=1 go test -count=1 ./test/... ./controllers/...

test-kernel: kernel-assets ## Kernel suite in the qemu guest (LVM, nvmet, nvme-tcp).
	test/kernel/run.sh

test-e2e: testbin ## End-to-end suites.
	PLINTH_TESTBIN=$(BIN) PLINTH_E2E=1 go test -count=1 ./test/e2e/...

test: lint verify-generate test-unit test-integration test-kernel vet-policies ## Everything CI runs.

bench: ## Benchmarks (vet/render at fleet scale, parsers).
	go test -run '^$$' -bench . -benchmem ./schema/... ./controllers/...

vet-policies: build $(CUE) ## Vet the policy repository and examples with plinth vet and plain cue vet.
	$(BIN)/plinth vet policies/clusters/staging
	$(BIN)/plinth vet policies/clusters/production
	$(BIN)/plinth vet examples/quickstart

##@ Run
dev: build ## The whole GitOps storage loop on this machine (plinth dev up).
	$(BIN)/plinth dev up

clean: ## Remove built binaries and test scratch.
	rm -rf $(BIN) test/kernel/.work

.PHONY: help build tools generate manifests verify-generate fmt vet lint testbin kernel-assets test-unit test-integration test-kernel test-e2e test bench vet-policies dev clean
