"""What only a real API server can say: example manifests and built objects pass server-side validation,
and the CRD's schema keeps every field of a spec and applies the same defaults as the pydantic models."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api import parse_spec, spec_document
from eagle3_contract.api.base import API_VERSION, PLURAL
from eagle3_contract.quantity import quantity
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.planner import plan_run
from tests.contract.api.test_kubernetes_rules import CASES
from tests.harness.cluster import Cluster
from tests.tiny_spec import minimal
from tests.unit.builders.builder_cases import kimi_online_spec, online_objects

pytestmark = pytest.mark.apiserver
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
PATHS = {
    "Job": ("batch/v1", "jobs"),
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
    "PersistentVolumeClaim": ("v1", "persistentvolumeclaims"),
    "Deployment": ("apps/v1", "deployments"),
}


# What a Kubernetes 1.20 API server (the tier's) drops of what the operator writes: fields its Job API does
# not know yet. The operator reads the server's version and does without them there
# (reconcile/server_features.py; README, Limits); on 1.26+ none is dropped.
KNOWN_1_20_DROPS = frozenset({"Job spec.podFailurePolicy", "Job spec.suspend", "Job spec.completionMode"})


async def dry_run(cluster: Cluster, api: str, plural: str, body: dict) -> dict:
    return await cluster._call("POST", cluster.path(api, plural) + "?dryRun=All", body)


def lost(sent: Any, stored: Any, path: str = "") -> Iterator[str]:
    """Every field of `sent` that `stored` does not hold with the same value (what the server pruned or
    changed; what it added, its defaults, is not looked at): `<path>: <sent> -> <stored>`."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            yield f"{path}: an object -> {stored!r}"
            return
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            if key not in stored:
                yield f"{where}: dropped"
            else:
                yield from lost(value, stored[key], where)
    elif isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            yield f"{path}: {len(sent)} items -> {stored!r}"[:300]
            return
        for i, (a, b) in enumerate(zip(sent, stored, strict=True)):
            yield from lost(a, b, f"{path}[{i}]")
    elif sent != stored and not _same_quantity(path, sent, stored):
        yield f"{path}: {sent!r} -> {stored!r}"


def _same_quantity(path: str, sent: Any, stored: Any) -> bool:
    """A resource quantity the server wrote in its own form (8 -> "8", "1000m" -> "1"), the same amount."""
    resource = ".resources." in f".{path}"
    if not resource or not isinstance(sent, int | float | str) or not isinstance(stored, str):
        return False
    return quantity(str(sent)) == quantity(stored) is not None


def assert_kept(body: dict, stored: dict) -> None:
    """Every field the operator wrote, as the server stored it: the ones the operator depends on (command and
    args, env, resources, volumes, probes, security contexts, owner references, labels, ...) survive; only the
    fields a 1.20 server does not know are dropped, and those only where they are known."""
    kind = body["kind"]
    missing = [line for line in lost(body, stored) if not _known_drop(kind, line)]
    assert not missing, f"{kind} {body['metadata']['name']}: the server did not keep {missing[:8]}"


def _known_drop(kind: str, line: str) -> bool:
    field = line.split(":", 1)[0]
    return any(f"{kind} {field}".startswith(known) for known in KNOWN_1_20_DROPS) and "dropped" in line


@pytest.fixture
def real(backend):
    if not backend.real:
        pytest.skip("server-side validation needs a real API server")
    return backend


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
async def test_an_example_passes_a_server_side_dry_run_and_keeps_every_field(real, path):
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = real.cluster.ns
    stored = await dry_run(real.cluster, API_VERSION, PLURAL, doc)
    assert stored["spec"] == spec_document(parse_spec(doc["spec"])), "pruned or defaulted differently"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
async def test_the_objects_planned_for_an_example_pass_a_server_side_dry_run(real, path):
    doc = yaml.safe_load(path.read_text())
    ref = RunRef(doc["metadata"]["name"], real.cluster.ns, "00000000-0000-0000-0000-000000000001")
    plan = plan_run(ref, 1, doc["spec"], None, Observed(), "2026-12-02T00:00:00Z")
    creates = [a.body for a in plan.actions if a.verb == "create"]
    assert creates
    for body in creates:
        api, plural = PATHS[body["kind"]]
        stored = await dry_run(real.cluster, api, plural, body)
        assert stored["metadata"]["name"] == body["metadata"]["name"]
        assert_kept(body, stored)


async def test_the_online_and_multi_node_objects_pass_a_server_side_dry_run(real):
    """Producers and their Service, the Mooncake master and its Service, the Indexed train Job and its
    headless Service, as built for the Kimi run online (mooncake, 2 training nodes)."""
    ref = RunRef("kimi-k2-5", real.cluster.ns, "00000000-0000-0000-0000-000000000002")
    objects = online_objects(ref, kimi_online_spec())
    assert [o["kind"] for o in objects] == [
        "Deployment",
        "Service",
        "Deployment",
        "Service",
        "Job",
        "Service",
    ]
    for body in objects:
        api, plural = PATHS[body["kind"]]
        stored = await dry_run(real.cluster, api, plural, body)
        assert stored["metadata"]["name"] == body["metadata"]["name"]
        assert stored["metadata"]["ownerReferences"][0]["kind"] == "Eagle3Run"
        assert_kept(body, stored)
    headless = await dry_run(real.cluster, "v1", "services", objects[-1])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True


def test_the_comparison_finds_a_pruned_or_changed_field_and_allows_only_the_known_drops() -> None:
    """The check itself, with plain data: what it would miss, it could not report."""
    sent = {
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"suspend": False, "template": {"x": [1, {"a": "b"}]}},
    }
    kept = {
        "kind": "Job",
        "metadata": {"name": "j", "uid": "u"},
        "spec": {"template": {"x": [1, {"a": "b"}]}},
    }
    assert_kept(sent, kept)  # spec.suspend: a known 1.20 drop; the server's uid is its own
    pruned = {"kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"x": [1, {}]}}}
    assert list(lost(sent, pruned)) == ["spec.suspend: dropped", "spec.template.x[1].a: dropped"]
    with pytest.raises(AssertionError, match=r"x\[1\]\.a: dropped"):
        assert_kept(sent, pruned)
    changed = {**kept, "spec": {"template": {"x": [2, {"a": "b"}]}}}
    assert list(lost(sent, changed)) == ["spec.suspend: dropped", "spec.template.x[0]: 1 -> 2"]
    resources = {"resources": {"limits": {"cpu": "1000m", "nvidia.com/gpu": 8, "memory": "1Gi"}}}
    canonical = {"resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "8", "memory": "2Gi"}}}
    assert list(lost(resources, canonical)) == ["resources.limits.memory: '1Gi' -> '2Gi'"]


# The cases of tests/contract/api/test_kubernetes_rules.py that the CRD's structural schema refuses (the rest:
# CEL rules, or the operator's own check): a real server refuses each run outright, naming the field, so the
# rules are the server's too on Kubernetes 1.20, which has no CEL (the CRD is installed without its rules).
REFUSED_BY_SCHEMA = [(name, case) for name, case in CASES.items() if case[3]]


@pytest.mark.parametrize(("name", "case"), REFUSED_BY_SCHEMA, ids=[name for name, _ in REFUSED_BY_SCHEMA])
async def test_the_server_refuses_what_the_crds_schema_refuses(real, name, case) -> None:
    sections, field, _, _ = case
    doc = {
        "apiVersion": API_VERSION,
        "kind": "Eagle3Run",
        "metadata": {"name": "refused", "namespace": real.cluster.ns},
        "spec": minimal() | sections,
    }
    with pytest.raises(AssertionError, match="HTTP 422") as refused:
        await dry_run(real.cluster, API_VERSION, PLURAL, doc)
    # the server (1.20) names the field without the list indexes the spec checks write
    assert re.sub(r"\[\d+\]", "", field) in str(refused.value), refused.value
