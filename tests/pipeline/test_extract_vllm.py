"""The extract stage's vLLM backend: the `vllm serve` command, checked by vLLM's own parser and config
classes, and the stage on a real vLLM CPU server (the CPU hidden-states connector) against the transformers
backend on the same rows: one server for the module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hs_connectors
import pytest
import torch
from safetensors import safe_open

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.params import extract_tuning
from eagle3_contract.vllm_command import VllmEngine, hidden_states_speculative_config
from eagle3_pipeline.data.hidden_states import Layout, file_name
from eagle3_pipeline.runtime.context import work_dir_of
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.kv_transfer import CPU_CONNECTOR, CPU_CONNECTOR_MODULE
from eagle3_pipeline.serving.vllm_server import build_serve_argv
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.extract.vllm_backend import (
    CPU_CONNECTOR_DIR,
    STAGING_DIR,
    concurrency_for,
    extract_options,
    kv_transfer_config,
)
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
from tests.pipeline.test_vllm_server import vllm_or_skip

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parents[2]
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
    # vLLM CPU: the same config, with the CPU connector loaded from its own module
    assert kv_transfer_config(LAYOUT, tmp_path, cpu=True) == file_cfg | {
        "kv_connector": CPU_CONNECTOR,
        "kv_connector_module_path": CPU_CONNECTOR_MODULE,
    }
    with pytest.raises(StageError, match="fp8 need vLLM with an accelerator"):
        kv_transfer_config(Layout((1, 2), LAYERS, HIDDEN, "fp8"), tmp_path, cpu=True)


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
    return str(Path(vllm_or_skip()).with_name("python"))


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


# --- the stage on vLLM CPU, against the transformers backend ----------------------------------------------

VERIFIER = "tiny-llama"  # tiny_models' verifier (4 layers, hidden 128, a tokenizer), as vLLM loads it
TINY_HIDDEN = 128
ROWS = 12
RESUMED = 3  # rows a killed attempt finished: the stage keeps them and asks vLLM for the rest
# bf16 vLLM (bf16 weights and arithmetic through 4 layers) against the transformers backend's float32 forward
# rounded to bf16. The tiny verifier's residual stream reaches |x| ~ 80 (median 9), so errors scale with each
# token's norm, not with each element: measured on this module's rows, the max |diff| is 1.0 (2 bf16 ulps at
# 64-128) and the worst token's relative error ||vllm - tf|| / ||tf|| is 0.015 (bf16's eps is 0.0078).
# 0.04 leaves room for other kernels, while the adjacent layer's states are 0.12 away and a token shifted
# by one position 0.93.
TOKEN_RTOL = 0.04


@dataclass(frozen=True)
class Extracted:
    code: int
    result: dict[str, Any]
    rows: list[list[int]]
    vllm_out: Path
    reference_out: Path
    artifacts: Path


@pytest.fixture(scope="module")
def extracted(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Extracted:
    """The rows extracted by the transformers backend, then by the vLLM backend resuming a killed attempt."""
    vllm = vllm_or_skip()
    model = tiny_models / VERIFIER
    base = tmp_path_factory.mktemp("extract-vllm")
    rows = random_rows(ROWS, seed=2)
    reference = base / "reference"
    write_prepared(reference, rows)
    tf_spec = write_manifest(base / "tf.yaml", model, layers=[1, 2])
    inputs = [f"prepare={PREPARE_OUT}"]
    assert run_stage("extract", str(tf_spec), str(reference), EXTRACT_OUT, inputs) == 0

    artifacts = base / "artifacts"
    write_prepared(artifacts, rows)
    work = work_dir_of(artifacts / EXTRACT_OUT)
    (work / STAGING_DIR).mkdir(parents=True)
    (work / STAGING_DIR / "cmpl-old.safetensors").write_bytes(b"half")  # a killed server's file
    for i in range(RESUMED):
        shutil.copy(reference / EXTRACT_OUT / file_name(i), work / file_name(i))
    spec = write_manifest(base / "vllm.yaml", model, backend="vllm", layers=[2, 1])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE3_VLLM", vllm)
        code = run_stage("extract", str(spec), str(artifacts), EXTRACT_OUT, inputs, 256)
    out = artifacts / EXTRACT_OUT
    result = json.loads((out / "result.json").read_text()) if code == 0 else {}
    return Extracted(code, result, rows, out, reference / EXTRACT_OUT, artifacts)


@pytest.mark.vllm
def test_the_vllm_backend_extracts_on_vllm_cpu(extracted: Extracted) -> None:
    result = extracted.result
    assert extracted.code == 0
    assert result["backend"] == "vllm" and result["layers"] == [1, 2, LAYERS]
    assert result["samples"] == ROWS and result["resumed"] == RESUMED
    assert result["extractedSamples"] == ROWS - RESUMED
    out = extracted.vllm_out
    assert not (out / STAGING_DIR).exists() and not (out / CPU_CONNECTOR_DIR).exists()
    log = (out / "vllm.log").read_text()
    assert f'"kv_connector": "{CPU_CONNECTOR}"' in log  # the command line the server ran
    assert sorted(p.name for p in out.glob("hs_*")) == sorted(file_name(i) for i in range(ROWS))


@pytest.mark.vllm
def test_vllm_hidden_states_match_the_transformers_backend(extracted: Extracted) -> None:
    largest = worst = 0.0
    for i in range(RESUMED, ROWS):
        with (
            safe_open(str(extracted.vllm_out / file_name(i)), "pt") as a,
            safe_open(str(extracted.reference_out / file_name(i)), "pt") as b,
        ):
            ids = a.get_tensor("token_ids").tolist()
            assert ids == b.get_tensor("token_ids").tolist() == extracted.rows[i]
            got, want = a.get_tensor("hidden_states"), b.get_tensor("hidden_states")
            assert got.dtype == want.dtype == torch.bfloat16
            assert got.shape == want.shape == (len(extracted.rows[i]), 3, TINY_HIDDEN)
            diff = got.float() - want.float()
            largest = max(largest, diff.abs().max().item())
            worst = max(worst, (diff.norm(dim=-1) / want.float().norm(dim=-1)).max().item())
    print(f"vLLM CPU vs transformers, rows {RESUMED}-{ROWS - 1}: max |diff| {largest}, token rel {worst:.4f}")
    assert 0.0 < worst <= TOKEN_RTOL  # 0: the files were copied, not computed by vLLM


@pytest.mark.vllm
def test_speculators_reads_the_vllm_files(extracted: Extracted) -> None:
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    dataset = ArrowDataset(
        MAX_LEN,
        datapath=extracted.artifacts / PREPARE_OUT / "data",
        transfer=FileTransfer(extracted.vllm_out),
        on_missing="raise",
    )
    assert dataset[4]["hidden_states"].shape == (len(extracted.rows[4]), 2 * TINY_HIDDEN)


def test_rows_that_leave_no_room_for_the_generated_token_are_a_clear_error(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started = tmp_path / "started"
    vllm = tmp_path / "vllm"  # a `vllm` that only says it was started
    vllm.write_text(f"#!{sys.executable}\nimport pathlib\npathlib.Path({str(started)!r}).touch()\n")
    vllm.chmod(0o755)
    monkeypatch.setenv("EAGLE3_VLLM", str(vllm))
    artifacts = tmp_path / "artifacts"
    write_prepared(artifacts, random_rows(3, seed=9, lengths=(128, 128)))
    spec = write_manifest(
        tmp_path / "run.yaml", tiny_model, backend="vllm", layers=[1, 2], max_len=128, max_model_len=128
    )
    code = run_stage("extract", str(spec), str(artifacts), EXTRACT_OUT, [f"prepare={PREPARE_OUT}"], 256)
    assert code == 1
    assert "spec.verifier.maxModelLen 128 leaves no room" in capsys.readouterr().err
    assert not started.exists()  # no server was started
