"""docs/troubleshooting.md is the alerts' runbook: every alert's `runbook_url` lands on a section of it, and
every condition reason the operator sets has a section too, so a new alert or reason cannot be forgotten.

The reasons are read from where they are defined: the constants of eagle3_contract.reasons, and the string
literals the planner (`cond(...)`, `set_condition(...)`) and the gate (`GateVerdict(...)`) pass as reasons.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from devtools.generated import REPO_ROOT

from eagle3_contract import gate, reasons
from eagle3_operator.observability import alerts
from eagle3_operator.observability.alerts import ALL_ALERTS, RUNBOOK_BASE_URL, build_rule_groups
from eagle3_operator.reconcile import canary, planner, run_conditions

ROOT = REPO_ROOT
DOC = ROOT / "docs" / "troubleshooting.md"
TEMPLATE = ROOT / "charts" / "eagle3-operator" / "templates" / "prometheusrule.yaml"
REASON = re.compile(r"^[A-Z][A-Za-z0-9]+$")
# Job failure reasons the planner passes on from Kubernetes or names itself (reconcile/progress.py)
JOB_REASONS = {"JobFailed", "BackoffLimitExceeded", "PodFailurePolicy"}


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors() -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", DOC.read_text(), flags=re.MULTILINE)}


def literal_reasons(module: ModuleType, calls: set[str]) -> set[str]:
    """CamelCase string literals passed to `calls` in `module`'s source."""
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in calls:
                found |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and REASON.match(a.value)
                }
    return found


def condition_reasons() -> set[str]:
    constants = {v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str)}
    return (
        constants
        | literal_reasons(planner, {"cond", "set_condition"})
        | literal_reasons(run_conditions, {"cond", "set_condition"})
        | {canary.PROMOTED, canary.ROLLED_BACK, canary.INCONCLUSIVE, canary.OBSERVING}
        | {canary.EXTENDED, canary.NOT_DISTINGUISHABLE, canary.CATEGORY_REGRESSED}
        | {run_conditions.POD_SECURITY_RESTRICTED, run_conditions.POD_SECURITY_BELOW_RESTRICTED}
        | literal_reasons(gate, {"GateVerdict"})
        | JOB_REASONS
    )


def test_the_reasons_are_found() -> None:
    found = condition_reasons()
    assert {"InvalidSpec", "StageRunning", "AcceptanceBelowGate", "ChecksumMismatch", "OutOfMemory"} <= found
    assert len(found) > 20


@pytest.mark.parametrize("reason", sorted(condition_reasons()))
def test_every_condition_reason_has_a_section(reason: str) -> None:
    assert reason.lower() in anchors(), f"docs/troubleshooting.md has no '### {reason}' section"


@pytest.mark.parametrize("alert", [a.name for a in ALL_ALERTS])
def test_every_alerts_runbook_url_lands_on_its_section(alert: str) -> None:
    rule = next(r for g in build_rule_groups()["groups"] for r in g["rules"] if r["alert"] == alert)
    base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
    assert base == RUNBOOK_BASE_URL and base.endswith("/docs/troubleshooting.md")
    assert anchor == alert.lower() and anchor in anchors(), f"docs/troubleshooting.md has no '### {alert}'"


def test_in_page_links_land() -> None:
    links = set(re.findall(r"\]\(#([^)]+)\)", DOC.read_text()))
    assert links and links <= anchors(), links - anchors()


def test_the_chart_template_names_the_default_base() -> None:
    """The template swaps the default base, written in it literally, for prometheusRule.runbookBaseUrl."""
    template = TEMPLATE.read_text()
    assert f'"{RUNBOOK_BASE_URL}"' in template and ".runbookBaseUrl" in template
    values = yaml.safe_load((TEMPLATE.parents[1] / "values.yaml").read_text())
    assert values["prometheusRule"]["runbookBaseUrl"] == ""
    assert alerts.RUNBOOK_BASE_URL.startswith("https://")


def rendered_urls(sets: list[str]) -> dict[str, str]:
    from tests.chart.helm import helm_or_skip, only, template

    docs = template(helm_or_skip(), sets=["prometheusRule.enabled=true", *sets], include_crds=False)
    groups = only(docs, "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r["annotations"]["runbook_url"] for g in groups for r in g["rules"]}


def test_the_chart_renders_the_runbook_urls_with_the_base_it_is_given() -> None:
    assert rendered_urls([]) == {a.name: a.runbook_url for a in ALL_ALERTS}
    mirror = rendered_urls(["prometheusRule.runbookBaseUrl=https://wiki.example/eagle3/troubleshooting/"])
    assert mirror == {
        a.name: f"https://wiki.example/eagle3/troubleshooting#{a.name.lower()}" for a in ALL_ALERTS
    }


def test_the_doc_is_linked_as_the_rules_say() -> None:
    assert Path(RUNBOOK_BASE_URL).name == DOC.name
