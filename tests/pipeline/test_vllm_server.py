"""The vLLM server a stage starts: its command line (read by vLLM's parser), start-up failures, cleanup."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.spec import Eagle3RunSpec, Verifier
from eagle3_contract.api.speculation import (
    SpeculationTable,
    SweepCell,
    plan_schedule,
    tuned_speculative_config,
)
from eagle3_contract.stages import Stage
from eagle3_contract.vllm_command import VllmEngine, draft_speculative_config
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import OutOfMemory, StageError
from eagle3_pipeline.serving.vllm_server import (
    ENV_VLLM,
    VllmServer,
    build_serve_argv,
    cpu_dtype_options,
    find_vllm,
    group_members,
    looks_out_of_memory,
)
from tests import tiers

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-vllm-cpu.sh"
SUFFIX_BUILD_SCRIPT = ROOT / "scripts" / "build-vllm-suffix.sh"


def built_vllm() -> str | None:
    """$EAGLE3_VLLM, else the env `scripts/build-vllm-cpu.sh` built (asked with --check: nothing is built)."""
    configured = os.environ.get(ENV_VLLM)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else None


def vllm_or_skip() -> str:
    path = built_vllm()
    if path is None:
        tiers.missing(
            "vLLM CPU",
            "no vLLM CPU environment: run scripts/build-vllm-cpu.sh (make test builds it) "
            "or set $EAGLE3_VLLM",
        )
    return path


def suffix_vllm_or_skip() -> str:
    """The `vllm` of the environment scripts/build-vllm-suffix.sh built (vLLM CPU with arctic-inference
    beside it: vLLM's suffix decoding; asked with --check: nothing is built)."""
    proc = subprocess.run(
        ["bash", str(SUFFIX_BUILD_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tiers.missing(
            "vLLM CPU with suffix decoding",
            "no vLLM environment with arctic-inference: run scripts/build-vllm-suffix.sh "
            "(make test builds it)",
        )
    return lines[-1]


# One vLLM 0.32 process reads every command line below: it builds `vllm serve`'s parser as vLLM's CLI does,
# parses and validates each argv after `vllm` and prints chosen fields; for the tuned one it also gives the
# speculative config's schedule to vLLM's own dynamic speculative decoding
# (vllm/v1/spec_decode/dynamic/utils.py): its normalized ranges and the k it looks up at every batch size up
# to max-num-seqs. One process, because importing vLLM costs ~15 CPU-s.
READ_SCRIPT = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.spec_decode.dynamic.utils import (
    build_dynamic_sd_schedule_lookup, validate_and_normalize_dynamic_sd_schedule,
)

FIELDS = ("model", "tensor_parallel_size", "max_model_len", "max_num_batched_tokens", "served_model_name",
          "seed", "port", "host", "enforce_eager", "revision", "trust_remote_code", "speculative_config",
          "dtype")


def parse(argv):
    parser = FlexibleArgumentParser(prog="vllm")
    make_arg_parser(parser.add_subparsers(dest="subparser").add_parser("serve"))
    args = parser.parse_args(argv)
    args.model = args.model_tag or args.model
    validate_parsed_serve_args(args)
    return args


asked = json.loads(sys.argv[1])
fields = [{f: getattr(parse(argv), f) for f in FIELDS} for argv in asked["argvs"]]
argv, max_num_seqs = asked["tuned"]
config = parse(argv).speculative_config
schedule = config["num_speculative_tokens_per_batch_size"]
ranges = validate_and_normalize_dynamic_sd_schedule(schedule)
lookup = build_dynamic_sd_schedule_lookup(schedule, max_num_seqs, config["num_speculative_tokens"])
print(json.dumps({"fields": fields, "tuned": {"config": config, "ranges": ranges, "lookup": lookup}}))
"""

SPECULATIVE = {"method": "eagle3", "model": "/artifacts/train/abc", "num_speculative_tokens": 3}
MAX_NUM_SEQS = 64


def our_command_lines(vllm: str) -> list[list[str]]:
    """The full command line (every field the spec sets, vllmArgs overriding ours) and the plain one."""
    full = Verifier(
        model="/models/big",
        revision="0123abcd",
        trust_remote_code=True,
        tensor_parallel_size=8,
        max_model_len=4096,
        vllm_args=["--dtype", "float32", "--max-model-len", "2048"],
    )
    return [
        build_serve_argv(
            vllm,
            VllmEngine.of(full, model="/local/big"),
            port=8123,
            seed=7,
            max_num_batched_tokens=8192,
            served_model_name="verifier",
            enforce_eager=True,
            speculative_config=SPECULATIVE,
        ),
        build_serve_argv(vllm, VllmEngine.of(Verifier(model="m"), model="/local/m"), port=9000, seed=0),
    ]


def sweep_cell(k: int, concurrency: int, speedup: float) -> SweepCell:
    return SweepCell(
        num_speculative_tokens=k,
        concurrency=concurrency,
        output_tokens_per_second=100 * speedup,
        speedup=speedup,
    )


SPEEDUPS = {1: (1.4, 1.9, 1.7), 8: (1.3, 1.2, 1.1), 32: (0.9, 0.8, 0.7)}  # k = 1, 2, 3 at each concurrency
TUNED_CELLS = [sweep_cell(k, c, s) for c, row in SPEEDUPS.items() for k, s in enumerate(row, start=1)]
TUNED_TABLE = SpeculationTable(cells=TUNED_CELLS, schedule=plan_schedule(TUNED_CELLS))
TUNED_CONFIG = tuned_speculative_config(
    draft_speculative_config("/artifacts/export/abc", 3), TUNED_TABLE.schedule
)


@pytest.fixture(scope="module")
def vllm_read() -> dict[str, Any]:
    """What vLLM's own parser (and its dynamic speculative decoding) made of our command lines."""
    vllm = vllm_or_skip()
    tuned = build_serve_argv(
        vllm, VllmEngine.of(Verifier(model="m"), model="/local/m"), port=9000, seed=0,
        speculative_config=TUNED_CONFIG, options=["--max-num-seqs", str(MAX_NUM_SEQS)],
    )  # fmt: skip
    asked = {"argvs": [a[1:] for a in our_command_lines(vllm)], "tuned": [tuned[1:], MAX_NUM_SEQS]}
    proc = subprocess.run(
        [str(Path(vllm).with_name("python")), "-c", READ_SCRIPT, json.dumps(asked)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    read: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return read


@pytest.mark.vllm
@pytest.mark.timeout(360)
def test_vllms_own_parser_reads_our_command_line(vllm_read: dict[str, Any]) -> None:
    full_args, plain = vllm_read["fields"]
    assert full_args == {
        "model": "/local/big",
        "tensor_parallel_size": 8,
        "max_model_len": 2048,  # verifier.vllmArgs come last: they override ours
        "max_num_batched_tokens": 8192,
        "served_model_name": ["verifier"],
        "seed": 7,
        "port": 8123,
        "host": "127.0.0.1",
        "enforce_eager": True,
        "revision": "0123abcd",
        "trust_remote_code": True,
        "speculative_config": SPECULATIVE,
        "dtype": "float32",
    }
    assert plain["model"] == "/local/m" and plain["tensor_parallel_size"] == 1
    assert plain["max_model_len"] is None and plain["max_num_batched_tokens"] is None
    assert (plain["trust_remote_code"], plain["enforce_eager"], plain["revision"]) == (False, False, None)
    assert plain["speculative_config"] is None


@pytest.mark.vllm
@pytest.mark.timeout(360)
def test_vllm_accepts_the_tuned_schedule_and_looks_up_the_tables_k(vllm_read: dict[str, Any]) -> None:
    """serving.speculationLength tuned: the speculative config with num_speculative_tokens_per_batch_size from
    a sweep table is one vLLM 0.32's parser reads and its dynamic speculative decoding expands to the k the
    table chose at each measured concurrency (0 where no k beat the verifier alone)."""
    parsed = vllm_read["tuned"]
    assert parsed["config"] == TUNED_CONFIG  # the argument reaches vLLM as written
    assert parsed["ranges"] == [[1, 2, 2], [3, 16, 1], [17, 32, 0]]
    lookup = parsed["lookup"]
    chosen = {1: 2, 8: 1, 32: 0}  # the fastest k that beats the baseline at each concurrency
    for concurrency, k in chosen.items():
        assert lookup[concurrency] == k, concurrency
    assert lookup[1:] == [2, 2] + [1] * 14 + [0] * 16 + [0] * 32  # vLLM carries the last k to max-num-seqs


def test_argv_order_spec_args_then_extra_args() -> None:
    verifier = Verifier(model="m", vllm_args=["--max-num-seqs", "4"])
    argv = build_serve_argv(
        "vllm", VllmEngine.of(verifier, model="/m"), port=1, seed=2, extra_args=["--x", "y"]
    )
    assert argv[:3] == ["vllm", "serve", "/m"]
    assert argv[-4:] == ["--max-num-seqs", "4", "--x", "y"]
    for absent in ("--revision", "--trust-remote-code", "--max-model-len", "--max-num-batched-tokens"):
        assert absent not in argv
    assert "--enforce-eager" not in argv


def test_a_cpu_without_native_bfloat16_serves_in_float32_unless_the_spec_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30: a bfloat16 checkpoint served at about 15 output tokens/s on such a CPU; float32 is fast."""
    monkeypatch.setattr("eagle3_pipeline.serving.vllm_server.accelerator_present", lambda: False)
    plain = VllmEngine.of(Verifier(model="m"), model="/m")
    monkeypatch.setenv("EAGLE3_CPU_BF16", "0")
    assert cpu_dtype_options(plain, []) == ["--dtype", "float32"]
    given = VllmEngine.of(Verifier(model="m", vllm_args=["--dtype=bfloat16"]), model="/m")
    assert cpu_dtype_options(given, []) == []  # verifier.vllmArgs decides
    assert cpu_dtype_options(plain, ["--dtype", "half"]) == []
    monkeypatch.setenv("EAGLE3_CPU_BF16", "1")
    assert cpu_dtype_options(plain, []) == []  # native bfloat16: vLLM's own choice
    monkeypatch.setenv("EAGLE3_CPU_BF16", "0")
    monkeypatch.setattr("eagle3_pipeline.serving.vllm_server.accelerator_present", lambda: True)
    assert cpu_dtype_options(plain, []) == []  # a GPU is not asked about


def test_find_vllm_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"scripts/build-vllm-cpu.sh"):
        find_vllm({"PATH": str(tmp_path)})
    with pytest.raises(StageError, match=r"EAGLE3_VLLM=.*not an executable"):
        find_vllm({ENV_VLLM: str(tmp_path / "missing")})
    exe = fake_vllm(tmp_path, "exit 0")
    assert find_vllm({"PATH": str(tmp_path)}) == str(exe)
    assert find_vllm({ENV_VLLM: str(exe), "PATH": ""}) == str(exe)


def test_out_of_memory_lines() -> None:
    assert looks_out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert looks_out_of_memory("ValueError: No available memory for the cache blocks. Try increasing")
    assert not looks_out_of_memory("ValueError: unknown model architecture")


# --- start-up failures with a fake `vllm` -------------------------------------------------------------------


def fake_vllm(directory: Path, body: str) -> Path:
    exe = directory / "vllm"
    exe.write_text(f"#!/usr/bin/env bash\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


SPEC = Eagle3RunSpec.model_validate(
    {"verifier": {"model": "/artifacts/models/v"}, "dataset": {"source": "d.jsonl", "seed": 5}}
)


def context(tmp_path: Path) -> StageContext[Any, Any]:
    art = tmp_path / "art"
    ctx = StageContext.of_spec(Stage.GENERATE, "t", SPEC, art, art / "generate" / "h")
    ctx.begin()
    return ctx


def server(ctx: StageContext[Any, Any], **options: Any) -> VllmServer:
    return VllmServer(ctx, VllmEngine.of(SPEC.verifier), seed=SPEC.dataset.seed, **options)


def test_early_exit_reports_the_log_tail_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / "env.txt"
    exe = fake_vllm(tmp_path, f'env > {env_file}; echo "$@"; echo "ValueError: no such model" >&2; exit 3')
    monkeypatch.setenv(ENV_VLLM, str(exe))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    ctx = context(tmp_path)
    with (
        pytest.raises(StageError, match=r"exited with code 3") as info,
        server(ctx, max_num_batched_tokens=64),
    ):
        pass
    assert "ValueError: no such model" in str(info.value)
    assert f"serve {tmp_path}/art/models/v" in str(info.value), "the model path is mapped onto this machine"
    assert "--max-num-batched-tokens 64" in str(info.value) and "--seed 5" in str(info.value)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert env["HF_HUB_OFFLINE"] == "1", "set when unset"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4", "kept when set"
    assert (ctx.work / "vllm.log").read_text().startswith("==> eagle3: ")


def test_out_of_memory_at_start_is_an_oom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_vllm(tmp_path, 'echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"; exit 1')
    monkeypatch.setenv(ENV_VLLM, str(exe))
    with pytest.raises(OutOfMemory, match=r"ran out of memory"), server(context(tmp_path)):
        pass


def test_a_server_that_never_answers_times_out_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ignores SIGTERM, and so does its child in the same process group: SIGKILL must follow
    exe = fake_vllm(tmp_path, "trap '' TERM; sleep 300 & sleep 300 & wait")
    monkeypatch.setenv(ENV_VLLM, str(exe))
    never = server(context(tmp_path), startup_timeout_s=2.0, stop_grace_s=1.0)
    started = time.monotonic()
    with pytest.raises(StageError, match=r"did not answer /health within 2 s"):
        never.start()
    assert time.monotonic() - started < 20
    assert never.pid is not None
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously: give the kernel a moment
    while group_members(never.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(never.pid) == [], "no live process of the server's group is left"


def test_a_servers_worker_spins_after_its_steps_only_in_a_process_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM CPU's default runs the model worker in a process of its own, which busy-polls for 1 s after each
    step; with V1 multiprocessing off (the suite's setting) there is none (benchmarks/vllm_spin.py)."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    assert server(context(tmp_path)).worker_spins
    assert not server(context(tmp_path), env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}).worker_spins
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert not server(context(tmp_path)).worker_spins
    assert server(context(tmp_path), env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}).worker_spins
