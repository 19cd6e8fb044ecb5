"""Prometheus's own tools on the rules and the queries: `promtool check rules`, and `promtool test rules` on
the hand-written cases of tests/observability/eagle3-rules.test.yaml (each alert fires when it should, and not
when healthy). Debian's promtool 2.42, from scripts/install-prometheus.sh (`make test` installs it first)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from devtools import observability as generate
from devtools.generated import REPO_ROOT

from eagle3_operator.observability import queries as q
from eagle3_operator.observability import stage_metrics_queries as pq
from eagle3_operator.observability.alerts import build_prometheus_rule
from tests import tiers
from tests.unit.observability.obs_support import all_queries

ROOT = REPO_ROOT
RULES = ROOT / generate.RULES_PATH
UNIT_TESTS = ROOT / "tests/observability/eagle3-rules.test.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    check = subprocess.run(
        ["bash", str(ROOT / "scripts/install-prometheus.sh"), "--check"], capture_output=True, text=True
    )
    if check.returncode != 0:
        tiers.missing(
            "promtool",
            "promtool is not installed: scripts/install-prometheus.sh --check says "
            f"{check.stderr.strip()!r} (run `make prometheus`; `make test` does)",
        )
    return Path(check.stdout.strip().splitlines()[-1]) / "promtool"


def run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=60)


def test_check_rules(promtool: Path) -> None:
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_rule_unit_tests(promtool: Path) -> None:
    result = run(promtool, "test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_rule_groups_check(promtool: Path, tmp_path: Path) -> None:
    path = tmp_path / "rule.yaml"
    path.write_text(yaml.safe_dump(build_prometheus_rule("monitoring", {})["spec"]))
    result = run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_parses_in_prometheus(promtool: Path, tmp_path: Path) -> None:
    """Prometheus's own parser on every query (as recording rules, $__rate_interval as 5m)."""
    rules = [{"record": f"eagle3:query_{i}", "expr": x.concrete} for i, x in enumerate(all_queries())]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    result = run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def unit_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    return tests


def test_expression_cases_are_the_dashboards_queries() -> None:
    """The promql_expr_test cases evaluate the dashboard's own queries (alert scope: 5m, no variables)."""
    s = q.scoped("5m")
    known = {
        q.acceptance_rate(s),
        q.mean_acceptance_length(s),
        q.acceptance_by_position(s),
        q.accepted_tokens_per_second(s),
        q.live_over_evaluated(s),
        q.ttft_quantile(0.5, s),
        q.ttft_quantile(0.95, s),
        q.stage_elapsed_fraction(s),
        pq.stage_progress(s),
        pq.stage_tokens_per_second(s),
    }
    cases = [case["expr"] for test in unit_tests() for case in test.get("promql_expr_test", [])]
    assert cases and set(cases) <= known, set(cases) - known
    assert {q.acceptance_rate(s), q.mean_acceptance_length(s), q.acceptance_by_position(s)} <= set(cases)


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = [case for test in unit_tests() for case in test.get("alert_rule_test", [])]
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    for alert in alerts:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"no case where {alert} fires"
        assert any(not c["exp_alerts"] for c in mine), f"no case where {alert} stays quiet"
