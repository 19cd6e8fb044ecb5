"""Every example manifest is a valid run that the planner starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.planner import plan_run

ROOT = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(ROOT.rglob("*.yaml"))
NAMES = [str(p.relative_to(ROOT).with_suffix("")) for p in EXAMPLES]


@pytest.mark.parametrize("path", EXAMPLES, ids=NAMES)
def test_an_example_plans_its_first_step(path):
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "eagle3.dev/v1alpha1" and doc["kind"] == "Eagle3Run"
    ref = RunRef(doc["metadata"]["name"], "default", "uid-1")
    plan = plan_run(ref, 1, doc["spec"], None, Observed(), "2026-12-02T00:00:00Z")
    assert plan.problems == ()
    kinds = [a.body["kind"] for a in plan.actions if a.verb == "create"]
    if doc["spec"].get("serving", {}).get("pinnedCheckpoint"):
        assert "Deployment" in kinds and "Job" not in kinds
    else:
        jobs = [a.body for a in plan.actions if a.body["kind"] == "Job"]
        assert [j["metadata"]["labels"]["eagle3.dev/stage"] for j in jobs] == ["prepare"]
        assert "ConfigMap" in kinds


def test_there_are_examples_from_cpu_to_kimi():
    assert set(NAMES) >= {"tiny/eagle3run", "kimi-k2.5-tp8", "promote-pinned"}
