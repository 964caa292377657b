# koord-py: every target does its own set-up (virtual environment + install) on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all demo test test-unit test-1.37 fuzz bench bench-b2 bench-b3 bench-b3-models bench-b4 lint proto kube-apiserver kube-scheduler kube-1.37 helm image clean chaos chaos-soak mutation

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,dev,trace,bound,dask,mutation]'
	@touch $(STAMP)

## demo: schedule the demo cluster in the embedded simulator and print the placement table,
## then the preemption demo, the RDMA demo (GPUs with SR-IOV VFs) and the interconnect demo
## (partition tables, NVLink, a gang)
demo: $(STAMP)
	$(BIN)/koord-scheduler simulate config/examples/demo-cluster.yaml
	$(BIN)/koord-scheduler simulate config/examples/demo-preemption.yaml
	$(BIN)/koord-scheduler simulate config/examples/demo-rdma.yaml
	$(BIN)/koord-scheduler simulate config/examples/demo-topology.yaml \
		--config config/examples/demo-topology-config.yaml

## test: every test (unit, integration, and the real kube-apiserver tier on both control planes,
## v1.20.2 and v1.37.2; KOORD_KUBE_VERSIONS=1.37 narrows the matrix). Both are built once and
## cached, in the background while the unit tiers run (hack/control-planes.sh), so the e2e
## tier runs last.
test: $(STAMP)
	bash hack/control-planes.sh
	$(BIN)/pytest $(PYTEST_ARGS) tests/unit tests/integration tests/fuzz tests/e2e

## test-1.37: the real kube-apiserver tier on the v1.37.2 control plane only
test-1.37: $(STAMP)
	KOORD_KUBE_VERSIONS=1.37 $(BIN)/pytest tests/e2e $(PYTEST_ARGS)

## test-unit: the fast tiers only (no kube-apiserver)
test-unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

## fuzz: every decoder of outside input under atheris for FUZZ_SECONDS each (TARGET=name: one);
## crashes go to .fuzz/crashes/<target>/, one line each, and fail the run (docs/fuzzing.md)
FUZZ_SECONDS ?= 60
TARGET ?=
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.driver --seconds $(FUZZ_SECONDS) $(if $(TARGET),--target $(TARGET))

## chaos: the chaos tier (B5) with a longer fault schedule; CHAOS_SEED=N replays a schedule
CHAOS_MINUTES ?= 30
chaos: $(STAMP) kube-1.37
	CHAOS_MINUTES=$(CHAOS_MINUTES) $(BIN)/pytest tests/e2e/chaos/test_chaos.py $(PYTEST_ARGS)

## chaos-soak: the chaos tier for N random seeds back to back (SEEDS=a,b replays), one row each,
## on the control plane KUBE (1.20 or 1.37; default: the newest)
N ?= 50
SEEDS ?=
KUBE ?=
chaos-soak: $(STAMP) $(if $(filter 1.20 v1.20%,$(KUBE)),,kube-1.37)
	$(BIN)/python -m tests.e2e.chaos.soak -n $(N) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(KUBE),--kube-version $(KUBE)) --out chaos-soak.md

## mutation: mutation testing (mutmut), one module at a time against the tests that cover it
## (hack/mutation.py); MODULE=scheduler/devices/ledger.py picks one (default: all four),
## MUTATION_ARGS=--rerun-survivors retests only the survivors, MUTATION_JOBS=N workers (default 1)
MODULE ?=
MUTATION_ARGS ?=
mutation: $(STAMP)
	$(BIN)/python hack/mutation.py $(MUTATION_ARGS) $(MODULE)

## bench: benchmark B1 (in-process scheduling throughput)
bench: $(STAMP)
	$(BIN)/python bench/b1_throughput.py

## bench-b2: benchmark B2, koord-scheduler and Go kube-scheduler side by side on a real kube-apiserver
bench-b2: $(STAMP)
	$(BIN)/python bench/b2_e2e.py

## bench-b3: benchmark B3, every policy on every openb variant, seeds 42-51 then held-out 52-61 (~2.5 h on 2 cores;
## B3_EXECUTOR=dask://HOST:PORT runs the replays on a Dask cluster)
B3_TRACES ?= default,gpushare20,gpushare40,gpushare60,gpushare80,gpushare100
B3_PROFILES ?= random,dotprod,clustering,packing,bestfit,binpack,fgd,fragmentation
B3_EXECUTOR ?= local
B3_ARGS = --trace-dir ../shared/traces/alibaba-openb --profiles $(B3_PROFILES) --jobs 2 --bound --executor $(B3_EXECUTOR)
bench-b3: $(STAMP)
	$(BIN)/python bench/b3_fragmentation.py $(B3_ARGS) --traces $(B3_TRACES) --seeds 42-51 --out b3-results/in-sample
	$(BIN)/python bench/b3_fragmentation.py $(B3_ARGS) --traces $(B3_TRACES) --seeds 52-61 --out b3-results/held-out

## bench-b3-models: benchmark B3's constrained-model family (0-80 % of GPU tasks tied to GPU models; ~20 min)
bench-b3-models: $(STAMP)
	$(BIN)/python bench/b3_fragmentation.py --trace-dir ../shared/traces/alibaba-openb --models 0,20,40,60,80 --profiles fgd,fragmentation --seeds 52-61 --jobs 2 --out b3-results/models

## bench-b4: benchmark B4 (fair-share GPU time slicing, synthetic Gemini clients; ~4 min)
bench-b4: $(STAMP)
	$(BIN)/python bench/b4_fairshare.py --duration 60 --plot docs/img/b4-fairshare.png

## lint: ruff, mypy (strict) on the packages, import-linter layer contracts
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## proto: regenerate the runtime-hook gRPC modules from runtimehooks/api/api.proto
proto: $(STAMP)
	$(BIN)/python -m runtimehooks.api.generate
	$(BIN)/python -m koordlet.deviceplugin.api.generate

## kube-apiserver: build (or reuse from the cache) kube-apiserver v1.20.2 and etcd
kube-apiserver:
	bash hack/kube-apiserver.sh

## image: the OCI image of both commands (Debian debootstrap + the wheel + podman), dist/*.oci.tar
image: $(STAMP)
	bash hack/image.sh

## kube-scheduler: build (once, cached) Go kube-scheduler v1.20.2, B2's reference
kube-scheduler:
	bash hack/kube-scheduler.sh

## kube-1.37: build (once, cached) kube-apiserver, kube-controller-manager, kube-scheduler v1.37.2 and etcd v3.7.3 from Go modules
kube-1.37:
	bash hack/kube-1.37.sh

## helm: build (once, cached) helm v3.22.0 from its Go module
helm:
	bash hack/helm.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks
