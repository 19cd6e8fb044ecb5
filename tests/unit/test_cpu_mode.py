"""nodePool.device cpu: no stage needs a GPU, the estimates say so, and the train stage runs training.gpus
CPU processes (torchrun, gloo) where a GPU spec on a machine without GPUs trains in one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from eagle3_contract.api.spec import Device, Eagle3RunSpec
from eagle3_contract.estimates import run_estimates
from eagle3_contract.params import train_tuning
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.stages.train import program as train
from tests.tiny_spec import tiny


def spec(device: str, **sections: Any) -> Eagle3RunSpec:
    return Eagle3RunSpec.model_validate(
        tiny(nodePool={"device": device}, verifier={"tensorParallelSize": 2}, **sections)
    )


def test_no_stage_needs_a_gpu_in_cpu_mode() -> None:
    gpu = {p.stage: p.gpus for p in plan_stages(spec("gpu", training={"gpus": 4}))}
    assert gpu[Stage.GENERATE] == gpu[Stage.EVALUATE] == 2 and gpu[Stage.TRAIN] == 4
    assert all(p.gpus == 0 for p in plan_stages(spec("cpu", training={"gpus": 4})))


def test_the_estimates_count_no_gpus_in_cpu_mode() -> None:
    online = {"mode": "online", "servers": 2}
    gpu = run_estimates(spec("gpu", extraction=online))
    cpu = run_estimates(spec("cpu", extraction=online))
    train_gpu = next(s for s in gpu.stages if s.stage == "train")
    train_cpu = next(s for s in cpu.stages if s.stage == "train")
    assert train_gpu.producer_gpus == 4 and train_cpu.producer_gpus == 0
    assert sum(s.gpus for s in gpu.stages) > 0 and all(s.gpus == 0 for s in cpu.stages)


def test_gpus_per_node_bounds_gpu_runs_only() -> None:
    big = {"training": {"gpus": 16}, "verifier": {"tensorParallelSize": 16}}
    with pytest.raises(ValueError, match=r"training\.gpus must be at most nodePool\.gpusPerNode"):
        Eagle3RunSpec.model_validate(tiny(nodePool={"device": "gpu"}, **big))
    cpu = Eagle3RunSpec.model_validate(tiny(nodePool={"device": "cpu"}, **big))
    assert cpu.training.gpus == 16 and all(p.gpus == 0 for p in plan_stages(cpu))


def ctx(device: Device, gpus: int) -> Any:
    return SimpleNamespace(
        params=SimpleNamespace(training=SimpleNamespace(gpus=gpus)), tuning=SimpleNamespace(device=device)
    )


def test_the_train_stage_runs_training_gpus_cpu_processes_in_cpu_mode() -> None:
    assert train_tuning(spec("cpu")).device is Device.CPU and train_tuning(spec("gpu")).device is Device.GPU
    assert train.processes(ctx(Device.CPU, 3), on_cpu=True) == 3
    assert train.processes(ctx(Device.GPU, 3), on_cpu=True) == 1  # a GPU spec on a laptop: one process
    assert train.processes(ctx(Device.GPU, 3), on_cpu=False) == 3
    assert train.processes(ctx(Device.CPU, 1), on_cpu=True) == 1


def test_cpu_workers_share_the_pods_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(train.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert train.worker_env(2, on_cpu=True)["OMP_NUM_THREADS"] == "4"
    assert train.worker_env(16, on_cpu=True)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in train.worker_env(2, on_cpu=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert train.worker_env(2, on_cpu=True)["OMP_NUM_THREADS"] == "3"
