"""Multi-node training: each node's torchrun command, worker mode, and two CPU nodes (gloo) training one draft
through the local executor, also when a worker process of node 1 is killed mid-training."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.manifest import Manifest, load_manifest
from eagle3_contract.online import ENV_NODE_RANK, ENV_NODES, ENV_RENDEZVOUS
from eagle3_contract.stages import Stage, StagePlan, plan_stages, stage_argv
from eagle3_pipeline.local import run as local
from eagle3_pipeline.runtime.context import work_dir_of
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.process_group import stop_group
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.train.draft import torchrun_argv
from eagle3_pipeline.stages.train.metrics import read_epochs
from eagle3_pipeline.stages.train.nodes import Nodes, local_nodes, nodes_of
from tests.pipeline.test_train import REPO, manifest, upstream  # noqa: F401  (upstream: the module fixture)

pytestmark = [pytest.mark.pipeline, pytest.mark.usefixtures("one_torch_thread")]

# the fixture's upstream outputs, by the train stage's input names
MADE = {"prepare": "prepare/p", "extract": "extract/x", "vocab": "vocab/v"}


def env(rank: int | None = None, nodes: str = "2", rendezvous: str = "node-0.train:29500") -> dict[str, str]:
    out = {ENV_NODES: nodes, ENV_RENDEZVOUS: rendezvous}
    return out | ({ENV_NODE_RANK: str(rank)} if rank is not None else {})


# --- each node's command ---------------------------------------------------------------------------------


def test_every_node_runs_torchrun_against_node_0s_rendezvous(tmp_path: Path) -> None:
    nodes = Nodes(count=2, rank=1, rendezvous="node-0.train:29500", run_id="abc123")
    argv = torchrun_argv(4, tmp_path / "run.yaml", tmp_path / "m.jsonl", tmp_path / "t.json", "py", nodes)
    assert argv == [
        "py", "-m", "torch.distributed.run",
        "--nnodes", "2", "--node-rank", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "node-0.train:29500",
        "--rdzv-id", "abc123", "--rdzv-conf", "is_host=0", "--nproc-per-node", "4", "--max-restarts", "3",
        "-m", "eagle3_pipeline.stages.train.draft",
        "--config", str(tmp_path / "run.yaml"), "--metrics", str(tmp_path / "m.jsonl"),
        "--info", str(tmp_path / "t.json"), "--node-rank", "1",
    ]  # fmt: skip
    node0 = torchrun_argv(
        4,
        tmp_path / "run.yaml",
        tmp_path / "m.jsonl",
        tmp_path / "t.json",
        "py",
        nodes_of(2, "abc123", env(0)),
    )
    assert node0[node0.index("--rdzv-conf") + 1] == "is_host=1", "node 0 hosts the rendezvous store"
    assert "--standalone" not in argv + node0
    single = torchrun_argv(4, tmp_path / "run.yaml", tmp_path / "m.jsonl", tmp_path / "t.json", "py")
    assert single[3:9] == ["--standalone", "--nnodes", "1", "--nproc-per-node", "4", "-m"]


def test_the_node_settings_come_from_the_environment() -> None:
    assert nodes_of(1, "h", {}) is None
    assert nodes_of(1, "h", env(0)) is None
    assert nodes_of(3, "h", env(2, "3", "10.0.0.5:29500")) == Nodes(3, 2, "10.0.0.5:29500", "h")
    with pytest.raises(StageError, match=r"training\.nodes is 1: there is no node 1"):
        nodes_of(1, "h", env(1))
    with pytest.raises(StageError, match=f"{ENV_NODE_RANK}, {ENV_NODES}"):
        nodes_of(2, "h", {ENV_RENDEZVOUS: "x:1"})
    with pytest.raises(StageError, match=r"do not fit training\.nodes 2"):
        nodes_of(2, "h", env(0, nodes="3"))
    with pytest.raises(StageError, match=r"do not fit training\.nodes 2"):
        nodes_of(2, "h", env(2))
    with pytest.raises(StageError, match="expected host:port"):
        nodes_of(2, "h", env(1, rendezvous="node-0"))
    with pytest.raises(StageError, match="expected a node rank"):
        nodes_of(2, "h", env(rank=-1))


def test_a_worker_node_of_a_single_node_stage_fails_without_touching_the_output(
    upstream: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_NODE_RANK, "1")
    art = upstream / "art"
    assert run_stage("train", manifest(upstream, "run"), str(art), "train/w1", list(inputs())) == 1
    assert "training.nodes is 1: there is no node 1" in capsys.readouterr().err
    assert not (art / "train" / "w1").exists() and not work_dir_of(art / "train" / "w1").exists()


def test_a_worker_node_finds_a_finished_output_and_has_nothing_to_join(
    upstream: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node 0 committed (or had nothing left to train) before this node came up: it exits 0 at once."""
    art = upstream / "art"
    (art / "train" / "done").mkdir(parents=True)
    (art / "train" / "done" / "result.json").write_text('{"x": 1}\n')
    for name, value in env(1, rendezvous="127.0.0.1:9").items():  # port 9: nobody answers
        monkeypatch.setenv(name, value)
    spec = manifest(upstream, "nodes", nodes=2)
    assert run_stage("train", spec, str(art), "train/done", list(inputs())) == 0
    assert (art / "train" / "done" / "result.json").read_text() == '{"x": 1}\n', "untouched"
    assert not work_dir_of(art / "train" / "done").exists()


# --- two CPU nodes ---------------------------------------------------------------------------------------


def inputs() -> list[str]:
    return [f"{name}={path}" for name, path in MADE.items()]


def train_plan(root: Path, name: str, **training: Any) -> tuple[Manifest, StagePlan]:
    """The train stage of a manifest, with the fixture's upstream outputs where the plan looks for them."""
    run = load_manifest(manifest(root, name, **training))
    plan = next(p for p in plan_stages(run.spec) if p.stage is Stage.TRAIN)
    for name_, path in plan.inputs.items():
        link = root / "art" / path
        if not link.exists():
            link.symlink_to(Path(MADE[name_]).name, target_is_directory=True)
    return run, plan


def stage_env() -> dict[str, str]:
    return local.stage_env(local.LocalOptions(artifacts=Path("."))) | {"OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(600)
def test_two_cpu_nodes_train_one_draft_through_the_local_executor(
    upstream: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    epochs = 2
    run, plan = train_plan(upstream, "nodes", nodes=2, epochs=epochs)
    art = upstream / "art"
    options = local.LocalOptions(artifacts=art)
    with caplog.at_level(logging.WARNING, logger="eagle3_pipeline.stages.train.nodes"):
        outcome = local.run_stage_with_retries(plan, run.path, options, run.spec, stage_env())
    assert outcome.status == "done", outcome.note
    assert not caplog.records, "worker node 1 exited 0 on its own"
    result = json.loads((art / plan.output_dir / "result.json").read_text())
    assert result["worldSize"] == 2 and result["device"] == "cpu" and result["resumedFromEpoch"] is None
    assert [e["epoch"] for e in result["epochs"]] == list(range(epochs))
    assert all(e["trainSteps"] > 0 and e["valLoss"] > 0 for e in result["epochs"])
    out = art / plan.output_dir
    assert (out / "checkpoints" / "checkpoint_best" / "model.safetensors").is_file()
    assert not work_dir_of(out).exists(), "node 0 committed the one work directory"


def node_workers(node: int, config: Path) -> list[int]:
    """The torchrun worker processes (not the agent) of `node` training from `config`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        worker = "eagle3_pipeline.stages.train.draft" in argv and "torch.distributed.run" not in argv
        if worker and str(config) in argv and argv[argv.index("--node-rank") + 1] == str(node):
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(600)
def test_a_killed_worker_of_node_1_is_restarted_and_training_resumes_after_the_complete_epochs(
    upstream: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The Done-means check: SIGKILL node 1's training process after an epoch; torchrun restarts every node's
    workers, which resume after the last complete epoch, and node 0's one stage attempt finishes."""
    epochs = 3
    run, plan = train_plan(upstream, "killed", nodes=2, epochs=epochs)
    art = upstream / "art"
    work = work_dir_of(art / plan.output_dir)
    command = [sys.executable, "-m", "eagle3_cli", *stage_argv(plan, str(run.path), str(art))[1:]]
    log = tmp_path / "node0.log"
    with local_nodes(command, stage_env(), 2) as node_env, log.open("wb") as sink:
        node0 = subprocess.Popen(
            command, cwd=REPO, env=node_env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 400
            while not (before := read_epochs(work / "metrics.jsonl")):
                assert node0.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no epoch finished in time"
                time.sleep(0.05)
            victims = node_workers(1, work / "checkpoints" / "run.yaml")
            assert len(victims) == 1, victims
            os.kill(victims[0], signal.SIGKILL)
            assert node0.wait(timeout=400) == 0, log.read_text()[-3000:]
        finally:
            if node0.poll() is None:  # a failed test leaves nothing training
                stop_group(node0, signal.SIGTERM, 30.0)
    assert 1 <= len(before) < epochs
    result = json.loads((art / plan.output_dir / "result.json").read_text())
    assert result["resumedFromEpoch"] is not None and result["resumedFromEpoch"] >= len(before)
    assert [e["epoch"] for e in result["epochs"]] == list(range(epochs)) and result["worldSize"] == 2
    kept = read_epochs(art / plan.output_dir / "metrics.jsonl")
    assert kept[: len(before)] == before, "the epochs done before the kill were kept, not trained again"
