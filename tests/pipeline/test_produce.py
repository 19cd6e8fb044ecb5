"""`eagle3 produce`: the producer's `vllm serve` command (hs_connectors' own KV transfer configs).

Real producers run elsewhere, sharing the vLLM servers those modules start anyway: `eagle3 produce` with the
volume transfer under `eagle3 run` in test_main_job.py (a whole online training, the producer killed midway),
with the mooncake transfer in test_mooncake.py (samples read back through hs_connectors' MooncakeTransfer).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from eagle3_cli.main import main as eagle3_main
from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.online import staging_dir
from eagle3_contract.stages import Stage, plan_stages
from eagle3_contract.vllm_command import hidden_states_speculative_config
from eagle3_pipeline.data.hidden_states import Layout
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.kv_transfer import CPU_CONNECTOR, CPU_CONNECTOR_MODULE
from eagle3_pipeline.stages.extract.producer import producer_argv
from tests.pipeline.manifests import write_manifest

pytestmark = pytest.mark.pipeline

LAYOUT = Layout((1, 2), 4, 128, "bfloat16")


def online_spec(model: str = "/models/tiny-llama", **extraction: Any) -> dict[str, Any]:
    return {
        "verifier": {"model": model, "tensorParallelSize": 1, "vllmArgs": ["--max-num-seqs", "8"]},
        "dataset": {"source": "unused", "maxSequenceLength": 64},
        "extraction": {"mode": "online", "layers": [2, 1], "tokenBudget": 256, **extraction},
        "draft": {"vocabSize": 32},
        "training": {"sequenceLength": 64},
    }


def spec_of(tmp_path: Path, spec: dict[str, Any]) -> Eagle3RunSpec:
    return load_manifest(write_manifest(tmp_path / "run.yaml", spec)).spec


def train_staging(spec: Eagle3RunSpec, artifacts: Path) -> Path:
    train = next(plan for plan in plan_stages(spec) if plan.stage == Stage.TRAIN)
    return artifacts / staging_dir(train.hash)


def options(argv: list[str]) -> dict[str, str]:
    """The last value of each `--option value` (vLLM keeps the last)."""
    found: dict[str, str] = {}
    for key, value in itertools.pairwise(argv):
        if key.startswith("--") and not value.startswith("--"):
            found[key] = value
    return found


# --- the command line ------------------------------------------------------------------------------------


def test_the_volume_transfer_writes_to_the_train_stages_staging_dir(tmp_path: Path) -> None:
    from hs_connectors import FileBackend

    spec = spec_of(tmp_path, online_spec())
    artifacts = tmp_path / "artifacts"
    argv = producer_argv(spec, artifacts, 8000, LAYOUT, executable="/opt/vllm/bin/vllm")
    assert argv[:3] == ["/opt/vllm/bin/vllm", "serve", "/models/tiny-llama"]
    opts = options(argv)
    staging = train_staging(spec, artifacts)
    assert json.loads(opts["--kv-transfer-config"]) == FileBackend.build_kv_transfer_config(
        argparse.Namespace(hidden_states_path=str(staging))
    )
    assert json.loads(opts["--speculative-config"]) == hidden_states_speculative_config([1, 2, 4])
    assert opts["--host"] == "0.0.0.0" and opts["--port"] == "8000"
    assert opts["--served-model-name"] == "verifier" and opts["--tensor-parallel-size"] == "1"
    assert opts["--max-num-batched-tokens"] == "256"  # extraction.tokenBudget
    assert opts["--gpu-memory-utilization"] == "0.9" and opts["--dtype"] == "bfloat16"
    assert opts["--max-model-len"] == "65"  # dataset.maxSequenceLength + the generated token
    assert argv[-2:] == ["--max-num-seqs", "8"]  # verifier.vllmArgs last: they override ours
    assert "--enforce-eager" not in argv


def test_on_vllm_cpu_the_cpu_connector_replaces_vllms(tmp_path: Path) -> None:
    from hs_connectors import FileBackend

    spec = spec_of(tmp_path, online_spec())
    artifacts = tmp_path / "artifacts"
    argv = producer_argv(spec, artifacts, 8000, LAYOUT, cpu=True)
    own = FileBackend.build_kv_transfer_config(
        argparse.Namespace(hidden_states_path=str(train_staging(spec, artifacts)))
    )
    assert json.loads(options(argv)["--kv-transfer-config"]) == own | {
        "kv_connector": CPU_CONNECTOR,
        "kv_connector_module_path": CPU_CONNECTOR_MODULE,
    }
    assert "--enforce-eager" in argv


def test_fp8_uses_the_fp8_connector_on_gpus_only(tmp_path: Path) -> None:
    from hs_connectors import FP8Backend

    spec = spec_of(tmp_path, online_spec(dtype="fp8"))
    layout = Layout((1, 2), 4, 128, "fp8")
    argv = producer_argv(spec, tmp_path, 8000, layout)
    own = FP8Backend.build_kv_transfer_config(
        argparse.Namespace(hidden_states_path=str(train_staging(spec, tmp_path)))
    )
    assert json.loads(options(argv)["--kv-transfer-config"]) == own
    assert "--dtype" not in argv  # the connector quantizes from the model's dtype
    with pytest.raises(StageError, match="fp8 need vLLM with an accelerator"):
        producer_argv(spec, tmp_path, 8000, layout, cpu=True)


def test_mooncake_stores_through_the_master(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hs_connectors import MooncakeBackend

    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "10.1.2.3")  # the pod's address, in a cluster
    spec = spec_of(tmp_path, online_spec(transfer="mooncake"))
    argv = producer_argv(spec, tmp_path, 8000, LAYOUT, mooncake_master="mooncake-master:50051")
    # speculators' scripts/launch_vllm.py defaults for the other Mooncake options
    own = MooncakeBackend.build_kv_transfer_config(
        argparse.Namespace(
            mooncake_master="mooncake-master:50051",
            mooncake_metadata_server="P2PHANDSHAKE",
            mooncake_protocol="tcp",
            mooncake_device="",
            mooncake_global_segment_gib=4.0,
            mooncake_local_buffer_gib=2.0,
            mooncake_writer_threads=4,
        )
    )
    assert json.loads(options(argv)["--kv-transfer-config"]) == own
    with pytest.raises(StageError, match="EAGLE3_MOONCAKE_MASTER"):
        producer_argv(spec, tmp_path, 8000, LAYOUT)
    # vLLM CPU: hs_connectors' connector on torch.cpu's streams, each client lending less memory
    on_cpu = json.loads(
        options(producer_argv(spec, tmp_path, 8000, LAYOUT, cpu=True, mooncake_master="m:1"))[
            "--kv-transfer-config"
        ]
    )
    assert (on_cpu["kv_connector"], on_cpu["kv_connector_module_path"]) == (
        "CpuMooncakeHiddenStatesConnector",
        "cpu_mooncake_connector",
    )
    store = on_cpu["kv_connector_extra_config"]["mooncake"]
    assert store["master_server_address"] == "m:1" and store["local_hostname"] == "10.1.2.3"
    assert store["global_segment_size"] == 2**28


def test_an_offline_spec_has_no_producer(tmp_path: Path) -> None:
    offline = online_spec()
    offline["extraction"]["mode"] = "offline"
    with pytest.raises(StageError, match="offline"):
        producer_argv(spec_of(tmp_path, offline), tmp_path, 8000, LAYOUT)


def test_print_shows_the_command_with_the_verifiers_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import LlamaConfig

    models = tmp_path / "models"
    LlamaConfig(num_hidden_layers=8, hidden_size=64, num_attention_heads=4).save_pretrained(models / "m")
    monkeypatch.setenv("EAGLE3_MODELS_ROOT", str(models))
    monkeypatch.delenv("EAGLE3_VLLM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # --print needs no vLLM
    spec = online_spec(model="/models/m")
    del spec["extraction"]["layers"]  # speculators' default [2, n/2, n-3] of the verifier's 8 layers
    manifest = write_manifest(tmp_path / "run.yaml", spec)
    args = ["produce", "--spec", str(manifest), "--artifacts", str(tmp_path), "--port", "8123", "--print"]
    assert eagle3_main(args) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert argv[:3] == ["vllm", "serve", str(models / "m")] and options(argv)["--port"] == "8123"
    speculative = json.loads(options(argv)["--speculative-config"])
    assert speculative == hidden_states_speculative_config([2, 4, 5, 8])
    assert "--enforce-eager" in argv  # no accelerator here
