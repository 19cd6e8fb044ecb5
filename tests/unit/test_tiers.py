"""Issue 42: no tier but gpu is skipped in CI. Each tier's gate, its tool made missing, skips here and fails
under CI=true, naming the tier and what is missing."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests import tiers


def _refused(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(args, 1, stdout="", stderr="not installed")


def _vllm(mp: pytest.MonkeyPatch) -> Callable[[], Any]:
    from tests.pipeline import test_vllm_server

    mp.setattr(test_vllm_server, "built_vllm", lambda: None)
    return test_vllm_server.vllm_or_skip


def _prometheus(mp: pytest.MonkeyPatch) -> Callable[[], Any]:
    from tests.observability import prometheus

    mp.setattr(prometheus, "installed_bin_dir", lambda: None)
    return prometheus.prometheus_or_skip


def _helm(mp: pytest.MonkeyPatch) -> Callable[[], Any]:
    from tests.chart import helm

    mp.setattr(helm.subprocess, "run", _refused)
    return helm.helm_or_skip


def _promtool(mp: pytest.MonkeyPatch) -> Callable[[], Any]:
    from tests.unit.observability import test_promtool

    mp.setattr(test_promtool.subprocess, "run", _refused)
    return test_promtool.promtool.__wrapped__  # type: ignore[attr-defined]  (the fixture's function)


def _real_node(mp: pytest.MonkeyPatch) -> Callable[[], Any]:
    from tests.cluster import conftest, node

    mp.setattr(node, "missing_requirements", lambda: ["root", "cgroup v1 mounted read-write"])
    fixture = conftest.cluster.__wrapped__  # type: ignore[attr-defined]
    return lambda: next(fixture())


GATES = {
    "vLLM CPU": _vllm,
    "Prometheus": _prometheus,
    "Helm": _helm,
    "promtool": _promtool,
    "real-node": _real_node,
}


@pytest.mark.parametrize("tier", list(GATES))
def test_a_missing_tool_skips_here_and_fails_under_ci(tier: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = GATES[tier](monkeypatch)
    monkeypatch.delenv(tiers.CI_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"the {tier} tier is not run"):
        gate()
    monkeypatch.setenv(tiers.CI_ENV, "true")
    with pytest.raises(pytest.fail.Exception, match=f"the {tier} tier is not run: .*CI=true"):
        gate()
