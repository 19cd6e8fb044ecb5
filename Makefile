# eagle3-operator: `make demo` runs the main job, `make test` runs every test tier that can run here.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo test lint typecheck unit operator apiserver kube crds bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

## demo: the operator at work against the API mock: the tiny run from creation to a serving Deployment
demo: $(STAMP)
	$(PY) -m eagle3_operator.testing.demo examples/tiny-cpu.yaml

## test: lint, types, unit tests, the operator against the API mock and against a real kube-apiserver
test: $(STAMP) lint typecheck kube
	$(PY) -m pytest -q -p no:cacheprovider

## kube: build kube-apiserver and kube-controller-manager once per machine (cached outside the repo)
kube:
	bash scripts/build-kube.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check operator pipeline tests benchmarks
	$(VENV)/bin/ruff format --check operator pipeline tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

operator: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "operator and not apiserver"

apiserver: $(STAMP) kube
	$(PY) -m pytest -q -p no:cacheprovider -m apiserver

## crds: regenerate the committed CRD from the pydantic models
crds: $(STAMP)
	$(VENV)/bin/eagle3 crd > crds/eagle3runs.eagle3.dev.yaml

## bench: the operator scale benchmark (figures go to docs/benchmarks.md)
bench: $(STAMP)
	$(PY) benchmarks/operator_scale.py --runs 10 100 500

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
