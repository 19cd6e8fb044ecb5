"""How `make test` spreads the suite over xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`).

Most of the suite waits rather than computes (the operator on the API mock and on a real kube-apiserver,
vLLM servers starting, Prometheus scraping), so two workers on two cores finish it in far less time than one.
Each test gets an xdist group, and a group runs on one worker, in order:
- every test marked `apiserver` is in one group, so the session starts one kube-apiserver, not one per worker;
- every test marked `cluster` is in one group too: one real node (tests/cluster) for all of them;
- every other test is grouped with its module, so a module-scoped fixture (the tiny pipeline's run, the
  Prometheus tier's stack, a vLLM server) is set up once.

The groups are handed out in the order of `FIRST` (the longest first, so the last group to finish is a short
one), then in collection order. The order is a schedule only: every test passes in any order and alone.
Without xdist (a plain `pytest`, `make check`) nothing here changes the run.

The session's real API server (the `server` fixture) is defined here, so that the tiers that need one
(tests/operator, tests/chart) share it rather than start one each.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.operator.apiserver import ServerAccess

# vLLM CPU runs its model worker in a process of its own (a third, beside the API server and the engine core)
# unless V1 multiprocessing is off; each process imports torch and vLLM. The suite starts about 20 servers on
# the tiny verifier, and without that third process a start costs about 31 CPU-s instead of 44 to 50
# (benchmarks/vllm_start.sh; docs/benchmarks.md, "One process fewer per vLLM server"). The stages' servers
# inherit it; a user's environment (and the demo's) keeps vLLM's default, which binds the worker's OpenMP
# threads (vllm/platforms/cpu.py).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

APISERVER_GROUP = "apiserver"
CLUSTER_GROUP = "cluster"  # the real node's tests (tests/cluster): one node for all of them
# The longest groups, measured with `--durations` (docs/benchmarks.md, "The suite's time"): started first.
FIRST = (
    CLUSTER_GROUP,
    "tests/pipeline/test_main_job.py",
    APISERVER_GROUP,
    "tests/observability/test_prometheus_tier.py",
    "tests/pipeline/test_evaluate.py",
    "tests/pipeline/test_generate.py",
    "tests/pipeline/test_predict.py",
    "tests/pipeline/test_export.py",
    "tests/pipeline/test_local.py",
    "tests/pipeline/test_train_nodes.py",
    "tests/pipeline/test_mooncake.py",
    "tests/pipeline/test_extract_vllm.py",
)


def xdist_group(item: pytest.Item) -> str:
    """The group an item runs in: the API server's, else its module's."""
    if item.get_closest_marker("apiserver") is not None:
        return APISERVER_GROUP
    if item.get_closest_marker("cluster") is not None:
        return CLUSTER_GROUP
    return item.nodeid.split("::", 1)[0]


def schedule_rank(group: str) -> int:
    return FIRST.index(group) if group in FIRST else len(FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a worker runs with dist "no" and xdist's own `loadgroup` flag; the controller with dist "loadgroup"
    if not (getattr(config.option, "loadgroup", False) or config.getoption("dist", "no") == "loadgroup"):
        return
    groups = {}
    for item in items:
        groups[item.nodeid] = xdist_group(item)
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: schedule_rank(groups[item.nodeid]))  # stable: collection order otherwise


@pytest.fixture(scope="session")
def server() -> ServerAccess:
    """The session's one real API server (tests/operator, tests/chart): an external cluster if configured
    (EAGLE3_TEST_KUBECONFIG), else one started here (tests/operator/apiserver.py), on first use."""
    from tests.operator.apiserver import (
        external_cluster,
        start_server,
    )  # the operator's stack: only when used

    external = external_cluster(os.environ.get("EAGLE3_TEST_KUBECONFIG"))
    if external is not None:
        return external
    return start_server()
