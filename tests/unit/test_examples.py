"""Every example a user can apply is valid: each file under examples/ is checked, whatever it holds.

An Eagle3Run is checked as the API server takes it (the generated CRD's openAPIV3Schema after structural
defaulting, then every CEL rule of the CRD on the stored object), as the operator reads it (the pydantic
model), and as the operator starts it (the planner's first step). Documents of other kinds (a GitOps tool's
objects) are checked for what that tool needs; a document of a kind this module does not know fails, so a new
example cannot go unvalidated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from celpy import celtypes

from eagle3_contract.api.base import GROUP, KIND, VERSION
from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.planner import plan_run
from tests.contract.api.api_support import (
    cel_program,
    crd_validator,
    defaulted,
    get_path,
    problem_path,
    root_schema,
    to_cel,
    walk_values,
)

ROOT = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(p for p in ROOT.rglob("*") if p.suffix in {".yaml", ".yml"})
NAMES = [str(p.relative_to(ROOT).with_suffix("")) for p in EXAMPLES]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
RULES_KEY = "x-kubernetes-validations"


def documents(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path.relative_to(ROOT)} holds no YAML document"
    return docs


def by_kind(kind: str) -> dict[str, list[dict[str, Any]]]:
    """The documents of one kind in each example file, by the file's name (as in NAMES)."""
    out = {}
    for name, path in zip(NAMES, EXAMPLES, strict=True):
        found = [d for d in documents(path) if isinstance(d, dict) and d.get("kind") == kind]
        if found:
            out[name] = found
    return out


# --- Eagle3Run: schema, CEL, model, planner ---------------------------------------------------------------


def schema_errors(stored: dict[str, Any]) -> list[str]:
    validator = crd_validator(root_schema())
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(stored)]


def broken_cel_rules(stored: dict[str, Any]) -> list[str]:
    """Each x-kubernetes-validations rule of the CRD, on every value it sits on, as the API server runs it."""
    schema = root_schema()
    broken = []
    for path, node in [((), schema), *walk_values(schema, stored)]:
        for rule in node.get(RULES_KEY, []):
            value = to_cel(node, get_path(stored, path))
            result = cel_program(rule["rule"]).evaluate({"self": value})
            assert isinstance(result, celtypes.BoolType), f"{rule['rule']!r} gave {result!r}"
            if not result:
                at = (problem_path(path[1:]) if path else "<root>") + rule.get("fieldPath", "")
                broken.append(f"{at}: {rule['message']}")
    return broken


def test_the_crd_carries_cel_rules():
    """broken_cel_rules finds the CRD's rules where they are (a vacuous pass would hide a moved rule)."""
    spec = root_schema()["properties"]["spec"]
    assert spec.get(RULES_KEY), "the CRD's spec has no x-kubernetes-validations"


def stored(doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """The object as the API server stores it (CRD defaults applied), with top-level spec fields replaced."""
    return {**doc, "spec": defaulted({**doc["spec"], **spec})}


def check_eagle3run(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == f"{GROUP}/{VERSION}"
    name = doc["metadata"]["name"]
    assert DNS_LABEL.match(name), f"metadata.name {name!r} is no DNS label"
    errors = schema_errors(stored(doc))
    assert not errors, f"{name}: the CRD schema rejects it: {errors}"
    broken = broken_cel_rules(stored(doc))
    assert not broken, f"{name}: the CRD's CEL rules reject it: {broken}"
    parse_spec(doc["spec"])  # the model: the same verdict the operator and `eagle3 run` reach
    check_first_step(doc)


def check_first_step(doc: dict[str, Any]) -> None:
    ref = RunRef(doc["metadata"]["name"], "default", "uid-1")
    plan = plan_run(ref, 1, doc["spec"], None, Observed(), "2026-12-02T00:00:00Z")
    assert plan.problems == ()
    kinds = [a.body["kind"] for a in plan.actions if a.verb == "create"]
    jobs = [a.body["metadata"]["labels"]["eagle3.dev/stage"] for a in plan.actions if a.body["kind"] == "Job"]
    serving = doc["spec"].get("serving", {})
    if serving.get("pinnedCheckpoint"):
        # a pinned draft is served, or first checked against its sha256 (stage verify); it trains nothing,
        # unless promotion is reviewed (the run trains its next candidate while the pin serves)
        training = ["prepare"] if serving.get("promotion") == "reviewed" else []
        assert jobs in (training, [*training, "verify"]) and (
            "Deployment" in kinds or jobs[-1:] == ["verify"]
        )
    else:
        assert jobs == ["prepare"]
        assert "ConfigMap" in kinds


# --- other kinds: what their controller needs -------------------------------------------------------------


def has(doc: dict[str, Any], dotted: str) -> bool:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node not in (None, "", [], {})


def required(*fields: str) -> Callable[[dict[str, Any], Path], None]:
    """Each of `fields` is set; `a|b` means one of them."""

    def check(doc: dict[str, Any], path: Path) -> None:
        missing = [f for f in fields if not any(has(doc, alt) for alt in f.split("|"))]
        assert not missing, f"{doc['kind']} {doc['metadata'].get('name')}: {missing} not set"

    return check


def kustomize_resources_exist(doc: dict[str, Any], path: Path) -> None:
    for entry in doc.get("resources", []):
        if "://" not in entry:
            assert (path.parent / entry).exists(), f"{path.name}: resource {entry} does not exist"


# (API group, kind) -> the check. Eagle3Run is handled above.
OTHER_KINDS: dict[tuple[str, str], Callable[[dict[str, Any], Path], None]] = {
    ("argoproj.io", "Application"): required("spec.project", "spec.destination", "spec.source|spec.sources"),
    ("source.toolkit.fluxcd.io", "GitRepository"): required("spec.url", "spec.interval"),
    ("source.toolkit.fluxcd.io", "HelmRepository"): required("spec.url", "spec.interval"),
    ("kustomize.toolkit.fluxcd.io", "Kustomization"): required(
        "spec.sourceRef", "spec.interval", "spec.prune"
    ),
    ("helm.toolkit.fluxcd.io", "HelmRelease"): required("spec.chart|spec.chartRef", "spec.interval"),
    ("kustomize.config.k8s.io", "Kustomization"): kustomize_resources_exist,
    ("", "ConfigMap"): required("data"),  # argocd-cm's health check (run by reconcile/test_argocd_health.py)
    # examples/tiny/models-job.yaml (dry-run on a real API server by operator/test_cpu_mode_server.py)
    ("", "PersistentVolumeClaim"): required("spec.accessModes", "spec.resources.requests.storage"),
    ("batch", "Job"): required(
        "spec.template.spec.containers",
        "spec.template.spec.securityContext.runAsNonRoot",
        "spec.template.spec.securityContext.seccompProfile",
    ),
}


def check_document(doc: Any, path: Path) -> None:
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    assert isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc, (
        f"{where}: a document without apiVersion/kind; teach tests/unit/test_examples.py how to validate it"
    )
    group = doc["apiVersion"].rpartition("/")[0]
    if doc["kind"] == KIND and group == GROUP:
        check_eagle3run(doc)
        return
    check = OTHER_KINDS.get((group, doc["kind"]))
    assert check is not None, (
        f"{where}: no validation for {doc['apiVersion']} {doc['kind']}; add one to OTHER_KINDS in "
        "tests/unit/test_examples.py"
    )
    if group != "kustomize.config.k8s.io":  # kustomize's own file has no metadata
        assert has(doc, "metadata.name"), f"{where}: {doc['kind']} without metadata.name"
    check(doc, path)


@pytest.mark.parametrize("path", EXAMPLES, ids=NAMES)
def test_every_document_of_an_example_validates(path: Path) -> None:
    for doc in documents(path):
        check_document(doc, path)


def test_a_broken_example_is_caught():
    """Each check rejects what it is there for: no vacuous pass."""
    doc = documents(ROOT / "llama-3.1-8b.yaml")[0]
    assert schema_errors(stored(doc, draft={"vocabSize": "32000"})) == [
        "spec.draft.vocabSize: '32000' is not of type 'integer'"
    ]
    assert broken_cel_rules(stored(doc, training={"gpus": 9})) == [
        "spec.training.gpus: training.gpus must be at most nodePool.gpusPerNode: "
        "it is the GPUs of one training node"
    ]
    with pytest.raises(AssertionError, match="no validation for v1 Secret"):
        check_document({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}, ROOT / "x.yaml")
    with pytest.raises(AssertionError, match=r"ConfigMap x: \['data'\] not set"):
        check_document({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, ROOT / "x.yaml")
    with pytest.raises(AssertionError, match="without apiVersion/kind"):
        check_document({"image": {"tag": "1"}}, ROOT / "values.yaml")
    with pytest.raises(AssertionError, match=r"\['spec.destination'\] not set"):
        app = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "a"}}
        check_document({**app, "spec": {"project": "default", "source": {"path": "."}}}, ROOT / "a.yaml")


# --- what each example promises ---------------------------------------------------------------------------


def run_spec(name: str) -> dict[str, Any]:
    runs = by_kind(KIND)[name]
    assert len(runs) == 1
    spec: dict[str, Any] = defaulted(runs[0]["spec"])
    return spec


def test_there_are_examples_from_cpu_to_kimi():
    assert set(by_kind(KIND)) >= {"tiny/eagle3run", "llama-3.1-8b", "kimi-k2.5-tp8", "promote-pinned"}


def test_the_tiny_run_needs_no_gpu():
    spec = run_spec("tiny/eagle3run")
    assert spec["extraction"]["backend"] == "transformers"
    assert spec["verifier"]["tensorParallelSize"] == 1 and spec["training"]["gpus"] == 1


def test_llama_runs_on_one_8_gpu_node():
    spec = run_spec("llama-3.1-8b")
    assert spec["nodePool"]["gpusPerNode"] == 8
    assert spec["training"]["gpus"] == 8 and spec["verifier"]["tensorParallelSize"] <= 8


KIMI_LAYERS = 61  # Kimi-K2.5's text model (DeepSeek-V3 layout): num_hidden_layers


def test_kimi_is_tp8_on_8_gpu_nodes_with_1000_regenerated_samples():
    spec = run_spec("kimi-k2.5-tp8")
    assert spec["verifier"]["tensorParallelSize"] == 8
    assert spec["nodePool"]["gpusPerNode"] == 8 and spec["training"]["gpus"] == 8
    # the sample count: prepare keeps the first dataset.maxSamples usable rows, generate answers each one
    assert spec["dataset"]["maxSamples"] == 1000 and spec["regeneration"]["enabled"] is True
    assert spec["draft"]["vocabSize"] == 32000
    # evaluation reads held-out rows: the validation split holds enough of them
    assert spec["evaluation"]["prompts"] <= int(1000 * spec["dataset"]["validationFraction"])


def test_kimi_extracts_low_middle_and_high_layers_of_its_61():
    """Layer ids as the extract stage reads them: id i = input of decoder layer i, valid ids 0..n-1."""
    layers = run_spec("kimi-k2.5-tp8")["extraction"]["layers"]
    n = KIMI_LAYERS
    assert layers == [2, n // 2, n - 3]  # speculators' default (eagle3_pipeline.data.hidden_states)
    assert all(0 <= i < n for i in layers)


def test_kimi_streams_hidden_states_through_mooncake_to_two_training_nodes():
    spec = run_spec("kimi-k2.5-tp8")
    extraction, training = spec["extraction"], spec["training"]
    assert (extraction["mode"], extraction["transfer"], extraction["servers"]) == ("online", "mooncake", 2)
    assert training["nodes"] == 2 and training["gpus"] == 8


def test_the_llama_online_example_shares_a_read_write_many_volume():
    spec = run_spec("llama-3.1-8b-online")
    assert (spec["extraction"]["mode"], spec["extraction"]["transfer"]) == ("online", "volume")
    assert spec["storage"]["artifacts"]["accessModes"] == ["ReadWriteMany"]
