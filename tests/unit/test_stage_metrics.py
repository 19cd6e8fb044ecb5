"""The operator's reading of running stage pods' progress: targets, rounds, what counts as news."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from eagle3_contract.api.status import StageProgress
from eagle3_contract.stage_metrics import UNITS, UNITS_DONE
from eagle3_operator.stage_metrics import Reader, read_round, remember, round_seconds, targets

KEY = ("eagle3", "tiny")


def pod(
    phase: str, ip: str | None, stage: str = "train", attempt: str = "0", **labels: str
) -> dict[str, Any]:
    meta = {
        "uid": f"uid-{stage}-{attempt}-{ip}",
        "labels": {
            "eagle3.dev/stage": stage,
            "eagle3.dev/hash": "h",
            "eagle3.dev/attempt": attempt,
            **labels,
        },
    }
    return {"metadata": meta, "status": {"phase": phase, **({"podIP": ip} if ip else {})}}  # fmt: skip


def test_targets_are_the_running_pods_with_an_ip_node_0_of_a_multi_node_stage() -> None:
    rank = "batch.kubernetes.io/job-completion-index"
    pods = {
        KEY: [
            pod("Running", "10.0.0.1"),
            pod("Pending", None, "extract"),
            pod("Succeeded", "10.0.0.2", "prepare"),
            pod("Running", None, "vocab"),  # no IP yet
            pod("Running", "10.0.0.3", "train", "1", **{rank: "0"}),
            pod("Running", "10.0.0.4", "train", "1", **{rank: "1"}),
        ],
        ("other", "gone"): [pod("Running", "10.0.0.9")],  # its run is not in the index
    }
    found = targets({KEY: [{}]}, pods, gone={"uid-train-0-10.0.0.1"})
    assert found == [(KEY, "train/h/1", "10.0.0.3")]
    assert targets({KEY: [{}]}, pods, gone=set())[0] == (KEY, "train/h/0", "10.0.0.1")


def test_a_round_lasts_longer_when_many_stages_run_so_writes_stay_bounded() -> None:
    assert round_seconds(None, 10) == 30.0
    assert round_seconds(1.0, 2) == 1.0
    assert round_seconds(None, 500) == 100.0  # 5 progress writes a second over all runs


def test_only_moved_figures_are_news_and_an_unmoved_reading_keeps_the_written_one() -> None:
    memo: dict[Any, dict[str, StageProgress]] = {}
    first = StageProgress(unit="steps", done=10, total=100, eta_seconds=90.0, updated="t1")
    assert remember(memo, {KEY: {"train/h/0": first}}) == {KEY}
    ticked = first.model_copy(update={"eta_seconds": 80.0, "updated": "t2"})
    assert remember(memo, {KEY: {"train/h/0": ticked}}) == set()
    assert memo[KEY]["train/h/0"].updated == "t1"  # a reconcile for another cause writes nothing new
    advanced = first.model_copy(update={"done": 11, "updated": "t3"})
    assert remember(memo, {KEY: {"train/h/0": advanced}}) == {KEY}
    assert remember(memo, {}) == set() and memo == {}  # ended or silent: the status keeps its figures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def endpoint() -> Any:
    registry = CollectorRegistry()
    Gauge(UNITS_DONE, "done", ["unit"], registry=registry).labels("rows").set(30)
    Gauge(UNITS, "total", ["unit"], registry=registry).labels("rows").set(120)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port
    server.shutdown()
    thread.join(5)


async def test_a_round_reads_a_real_endpoint_and_leaves_out_one_that_does_not_answer(endpoint: int) -> None:
    reader = Reader.open(endpoint)
    try:
        found = [(KEY, "prepare/h/0", "127.0.0.1"), (("ns", "other"), "prepare/h/0", "127.0.0.2")]
        out = await read_round(reader, found)
    finally:
        await reader.close()
    [(key, jobs)] = out.items()
    progress = jobs["prepare/h/0"]
    assert key == KEY and (progress.unit, progress.done, progress.total) == ("rows", 30, 120)
    assert progress.updated is not None and progress.eta is None
