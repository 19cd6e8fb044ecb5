"""The extract stage's vLLM backend: the `vllm serve` command, checked by vLLM's own parser and config
classes, and the request path with speculators' client against a fake server (vLLM extraction needs CUDA)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import hs_connectors
import pytest
import torch
from safetensors import safe_open

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.params import extract_tuning
from eagle3_contract.vllm_command import VllmEngine, hidden_states_speculative_config
from eagle3_pipeline.context import work_dir_of
from eagle3_pipeline.extract_vllm import concurrency_for, extract_options, kv_transfer_config
from eagle3_pipeline.hidden_states import Layout, file_name
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.vllm_server import build_serve_argv
from tests.pipeline.extract_support import (
    EXTRACT_OUT,
    HIDDEN,
    LAYERS,
    MAX_LEN,
    PREPARE_OUT,
    build_tiny_llama,
    random_rows,
    write_manifest,
    write_prepared,
)

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
FAKE_VLLM = Path(__file__).with_name("fake_vllm_hidden_states.py")
LAYOUT = Layout((1, 2), LAYERS, HIDDEN, "bfloat16")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("verifier") / "tiny-llama")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the serve command -----------------------------------------------------------------------------------


def test_speculative_config_is_what_speculators_launch_script_passes() -> None:
    assert hidden_states_speculative_config(LAYOUT.layer_ids) == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, LAYERS]}},
    }


def test_kv_transfer_config_comes_from_hs_connectors(tmp_path: Path) -> None:
    file_cfg = kv_transfer_config(LAYOUT, tmp_path)
    assert file_cfg == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    fp8 = kv_transfer_config(Layout((1, 2), LAYERS, HIDDEN, "fp8"), tmp_path)
    assert fp8["kv_connector"] == "FP8HiddenStatesConnector"
    assert fp8["kv_connector_module_path"] == "hs_connectors.fp8_hidden_states_connector"


def test_extract_options(tmp_path: Path, tiny_model: Path) -> None:
    spec = load_manifest(write_manifest(tmp_path / "run.yaml", tiny_model, layers=[1, 2])).spec
    args = extract_options(extract_tuning(spec), LAYOUT, longest_row=50)
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--gpu-memory-utilization"] == "0.9"
    assert options["--dtype"] == "bfloat16"  # the connector writes the model dtype
    assert options["--max-model-len"] == "51"  # longest row + the one generated token
    fp8 = extract_options(extract_tuning(spec), Layout((1, 2), LAYERS, HIDDEN, "fp8"), longest_row=50)
    assert "--dtype" not in fp8


def test_concurrency_fills_two_scheduler_steps() -> None:
    assert concurrency_for(8192, [512] * 10) == 32
    assert concurrency_for(64, [4096]) == 1
    assert concurrency_for(10**9, [1]) == 256


def vllm_python_or_skip() -> str:
    """The vLLM CPU env's python: next to $EAGLE3_VLLM, else where scripts/build-vllm-cpu.sh built it."""
    vllm = os.environ.get("EAGLE3_VLLM")
    if not vllm:
        check = ["bash", str(ROOT / "scripts/build-vllm-cpu.sh"), "--check"]
        proc = subprocess.run(check, capture_output=True, text=True, check=False)
        lines = proc.stdout.strip().splitlines()
        vllm = lines[-1] if proc.returncode == 0 and lines else None
    python = Path(vllm).with_name("python") if vllm else None
    if python is None or not python.exists():
        pytest.skip(
            "no vLLM CPU environment: run scripts/build-vllm-cpu.sh (make test builds it) or set $EAGLE3_VLLM"
        )
    return str(python)


# Parses each argv with `vllm serve`'s own parser (as vLLM 0.32's CLI builds it), validates it like the CLI,
# then builds vLLM's engine configuration: ModelConfig, SpeculativeConfig, KVTransferConfig, VllmConfig.
PARSE_SCRIPT = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

out = []
for argv in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser", required=True))
    args = parser.parse_args(argv[1:])
    ServeSubcommand().validate(args)
    args.model = args.model_tag
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    spec, kv = config.speculative_config, config.kv_transfer_config
    out.append({
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "layer_ids": list(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids),
        "draft_architectures": spec.draft_model_config.hf_config.architectures,
        "kv_connector": kv.kv_connector,
        "kv_role": kv.kv_role,
        "kv_module": kv.kv_connector_module_path,
        "storage": kv.kv_connector_extra_config["shared_storage_path"],
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "max_model_len": config.model_config.max_model_len,
        "dtype": str(config.model_config.dtype),
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "served_model_name": config.model_config.served_model_name,
    })
print(json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllm_accepts_the_serve_command(tmp_path: Path, tiny_model: Path) -> None:
    python = vllm_python_or_skip()
    argvs = []
    for dtype in ("bfloat16", "fp8"):
        manifest = write_manifest(tmp_path / f"{dtype}.yaml", tiny_model, layers=[1, 2], dtype=dtype)
        spec = load_manifest(manifest).spec
        layout = Layout((1, 2), LAYERS, HIDDEN, dtype)
        extra = extract_options(extract_tuning(spec), layout, longest_row=MAX_LEN)
        argvs.append(
            build_serve_argv(
                "vllm",
                VllmEngine.of(spec.verifier, model=str(tiny_model)),
                port=8000,
                seed=0,
                max_num_batched_tokens=256,
                enforce_eager=True,
                speculative_config=hidden_states_speculative_config(layout.layer_ids),
                kv_transfer_config=kv_transfer_config(layout, tmp_path / "staging"),
                options=extra,
            )
        )
    # vLLM imports the fp8 connector's module: hs_connectors (pure Python) must be in its environment too,
    # as in the pipeline image; here it is lent from this one.
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "hs_connectors").symlink_to(Path(hs_connectors.__file__).parent)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(lib)}
    proc = subprocess.run(
        [python, "-c", PARSE_SCRIPT, json.dumps(argvs)], capture_output=True, text=True, env=env, timeout=540
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    bf16, fp8 = json.loads(proc.stdout.strip().splitlines()[-1])
    for parsed in (bf16, fp8):
        assert parsed["method"] == "extract_hidden_states" and parsed["num_speculative_tokens"] == 1
        assert parsed["layer_ids"] == [1, 2, LAYERS]
        assert parsed["draft_architectures"] == ["ExtractHiddenStatesModel"]
        assert parsed["kv_role"] == "kv_producer" and parsed["storage"] == str(tmp_path / "staging")
        assert parsed["max_num_batched_tokens"] == 256 and parsed["max_model_len"] == MAX_LEN + 1
        assert parsed["gpu_memory_utilization"] == 0.9 and parsed["tensor_parallel_size"] == 1
        assert parsed["served_model_name"] == "verifier"
    assert bf16["kv_connector"] == "ExampleHiddenStatesConnector" and bf16["dtype"] == "torch.bfloat16"
    assert fp8["kv_connector"] == "FP8HiddenStatesConnector"
    assert fp8["kv_module"] == "hs_connectors.fp8_hidden_states_connector"


# --- the stage against a fake `vllm serve` ---------------------------------------------------------------


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `vllm` executable serving the fake; returns the file it logs request lengths to."""
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n" + FAKE_VLLM.read_text())
    exe.chmod(0o755)
    requests = tmp_path / "requests.log"
    monkeypatch.setenv("EAGLE3_VLLM", str(exe))
    monkeypatch.setenv("FAKE_VLLM_REQUESTS", str(requests))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return requests


def extract_vllm(tmp_path: Path, model: Path, artifacts: Path, **manifest: Any) -> tuple[int, dict[str, Any]]:
    spec = write_manifest(tmp_path / "run.yaml", model, backend="vllm", **manifest)
    code = run_stage("extract", str(spec), str(artifacts), EXTRACT_OUT, [f"prepare={PREPARE_OUT}"], 256)
    result_file = artifacts / EXTRACT_OUT / "result.json"
    return code, json.loads(result_file.read_text()) if result_file.exists() else {}


@pytest.mark.timeout(300)
def test_vllm_backend_files_match_the_transformers_backend(
    tmp_path: Path, tiny_model: Path, fake_vllm: Path
) -> None:
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    rows = random_rows(12, seed=2)
    artifacts = tmp_path / "artifacts"
    write_prepared(artifacts, rows)
    code, result = extract_vllm(tmp_path, tiny_model, artifacts, layers=[2, 1])
    assert code == 0, result
    assert (
        result["backend"] == "vllm" and result["layers"] == [1, 2, LAYERS] and result["samples"] == len(rows)
    )
    out = artifacts / EXTRACT_OUT
    assert not (out / "staging").exists() and (out / "vllm.log").exists()
    assert sorted(map(int, fake_vllm.read_text().split())) == sorted(map(len, rows))

    reference = tmp_path / "reference"
    write_prepared(reference, rows)
    spec = write_manifest(tmp_path / "tf.yaml", tiny_model, layers=[1, 2])
    assert run_stage("extract", str(spec), str(reference), EXTRACT_OUT, [f"prepare={PREPARE_OUT}"], 256) == 0
    for i in range(len(rows)):
        with (
            safe_open(str(out / file_name(i)), "pt") as a,
            safe_open(str(reference / EXTRACT_OUT / file_name(i)), "pt") as b,
        ):
            assert a.get_tensor("token_ids").tolist() == rows[i]
            torch.testing.assert_close(
                a.get_tensor("hidden_states"), b.get_tensor("hidden_states"), atol=2e-2, rtol=2e-2
            )
    dataset = ArrowDataset(
        MAX_LEN, datapath=artifacts / "prepare/h/data", transfer=FileTransfer(out), on_missing="raise"
    )
    assert dataset[4]["hidden_states"].shape == (len(rows[4]), 2 * HIDDEN)


@pytest.mark.timeout(300)
def test_vllm_backend_fp8_and_resume(tmp_path: Path, tiny_model: Path, fake_vllm: Path) -> None:
    from hs_connectors import FP8Transfer

    rows = random_rows(10, seed=4)
    artifacts = tmp_path / "artifacts"
    write_prepared(artifacts, rows)
    # a killed attempt left rows 0-3
    spec = write_manifest(tmp_path / "tf.yaml", tiny_model, layers=[1, 2], dtype="fp8")
    assert run_stage("extract", str(spec), str(artifacts), EXTRACT_OUT, [f"prepare={PREPARE_OUT}"], 256) == 0
    done = artifacts / EXTRACT_OUT
    work = work_dir_of(done)
    work.mkdir()
    for i in range(4):
        (done / file_name(i)).rename(work / file_name(i))
    for leftover in done.iterdir():
        leftover.unlink()
    done.rmdir()
    (work / "staging").mkdir()
    (work / "staging" / "cmpl-old.safetensors").write_bytes(b"half")

    code, result = extract_vllm(tmp_path, tiny_model, artifacts, layers=[1, 2], dtype="fp8")
    assert code == 0, result
    assert result["resumed"] == 4 and result["extractedSamples"] == len(rows) - 4
    assert sorted(map(int, fake_vllm.read_text().split())) == sorted(len(r) for r in rows[4:])
    sample = FP8Transfer(done).get_cached(7)
    assert sample is not None and sample["hidden_states"].shape == (len(rows[7]), 3, HIDDEN)


@pytest.mark.timeout(300)
def test_a_wrong_answer_fails_the_stage_and_keeps_the_files(
    tmp_path: Path,
    tiny_model: Path,
    fake_vllm: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = random_rows(8, seed=6)
    rows[5][0] = 127  # the fake answers this prompt with the wrong prompt_token_ids
    for r in rows[:5] + rows[6:]:
        r[:] = [t % 127 for t in r]
    artifacts = tmp_path / "artifacts"
    write_prepared(artifacts, rows)
    monkeypatch.setenv("FAKE_VLLM_POISON", "127")
    code, _ = extract_vllm(tmp_path, tiny_model, artifacts, layers=[1, 2])
    assert code == 1
    assert re.search(r"row 5 .*Prompt token IDs mismatch.*finished work is kept", capsys.readouterr().err)
    assert not (artifacts / EXTRACT_OUT).exists()
    assert work_dir_of(artifacts / EXTRACT_OUT).is_dir()  # kept for the next attempt


@pytest.mark.timeout(300)
def test_vllm_out_of_memory_at_start_exits_86(
    tmp_path: Path, tiny_model: Path, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifacts = tmp_path / "artifacts"
    write_prepared(artifacts, random_rows(4, seed=8))
    monkeypatch.setenv("FAKE_VLLM_OOM", "1")
    code, _ = extract_vllm(tmp_path, tiny_model, artifacts, layers=[1, 2])
    assert code == 86


def test_rows_that_leave_no_room_for_the_generated_token_are_a_clear_error(
    tmp_path: Path, tiny_model: Path, fake_vllm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifacts = tmp_path / "artifacts"
    write_prepared(artifacts, random_rows(3, seed=9, lengths=(128, 128)))
    spec = write_manifest(
        tmp_path / "run.yaml", tiny_model, backend="vllm", layers=[1, 2], max_len=128, max_model_len=128
    )
    code = run_stage("extract", str(spec), str(artifacts), EXTRACT_OUT, [f"prepare={PREPARE_OUT}"], 256)
    assert code == 1
    assert "spec.verifier.maxModelLen 128 leaves no room" in capsys.readouterr().err
    assert not fake_vllm.exists()  # no server was started
