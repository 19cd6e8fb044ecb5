"""`gpu_pipeline.py`'s online-against-offline comparison: the same manifest trained from stored hidden states
and from a hidden-state producer, by the local executor (`eagle3 run`), on the benchmark's verifier and data.

Needs a vLLM for the device (`--vllm`, else $EAGLE3_VLLM, else `vllm` on PATH): without one every part is
recorded as skipped, with the reason. The prepare and vocab outputs the benchmark made are linked into an
artifacts directory of its own under their content hashes, so `eagle3 run` reuses them (it runs no prepare
and no vocab). Then, each `eagle3 run` a subprocess with a time limit of its own:

1. offline: `extraction.backend: vllm`: the extract stage stores every sample, the train stage reads them;
2. online, `transfer: volume`: `eagle3 run` starts `eagle3 produce` (vLLM with `extract_hidden_states`) and
   the train stage asks it for every sample (written under `hidden-states/<train hash>`, read, deleted);
3. online, `transfer: mooncake`, where `mooncake_master` is on PATH and `mooncake.store` imports (else
   skipped, with the reason);
4. the producer alone (`eagle3 produce` through eagle3_pipeline.local.producers) sent a bounded number of
   rows with speculators' async client at concurrency 1 and 32 (benchmarks/online_cpu.py's `hammer`):
   samples/s, tokens/s and MB/s of hidden states, each file read back and deleted as the trainer does.

Per mode: the train stage's own tokens/s (its steps), its seconds, the bytes the mode leaves on the volume
(offline: extract's output; online: what is left under `hidden-states/`), the largest staging directory seen
while it ran (polled every 0.2 s), the producer's prompt tokens (vLLM's counter), the validation estimate of
the acceptance length, and with `--online-evaluate` the evaluate stage's mean acceptance length in vLLM.
On one GPU the producer and the trainer share the device (in a cluster they do not): both vLLM servers get
`extraction.gpuMemoryUtilization` GPU_MEMORY so that training has room, and online training competes with
the producer for the GPU's time, which the ratio includes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from online_cpu import Watch, dir_bytes, hammer

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("contract", "operator", "pipeline", "cli")  # the project's packages, without installing it
ARTIFACTS = "online-art"  # under the benchmark's run directory
GPU_MEMORY = 0.3  # of the GPU, for each vLLM server: a 1B verifier needs a few GB; training shares the GPU
CONCURRENCY = (1, 32)
PRODUCER_ROWS = {1: 64, 32: 512}  # rows sent at each concurrency (at most the dataset's)
EVAL_PROMPTS, EVAL_MAX_TOKENS, EVAL_SPECULATIVE = 16, 32, 3
STOP_GRACE_S = 30.0
LOG_LINES = 300  # of each producer log kept in the mode's log


def source_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with the project's packages first on PYTHONPATH (children import eagle3_cli)."""
    out = dict(os.environ if env is None else env)
    paths = [str(REPO / d) for d in SOURCE_DIRS]
    out["PYTHONPATH"] = os.pathsep.join([*paths, out.get("PYTHONPATH", "")]).strip(os.pathsep)
    return out


def find_vllm(given: str | None) -> tuple[str | None, str | None]:
    """(the vllm executable, None) or (None, why there is none)."""
    candidate = given or os.environ.get("EAGLE3_VLLM") or shutil.which("vllm")
    if not candidate:
        return None, (
            "no vLLM: --vllm, $EAGLE3_VLLM and `vllm` on PATH all absent. vLLM cannot be carried to the "
            "device machine as it is lent now (vllm 0.32.0's wheel is 326.5 MB and pins torch 2.13.0; the "
            "image has torch 2.11.0 and a call carries 64 MiB)"
        )
    if not os.access(candidate, os.X_OK):
        return None, f"{candidate} is not an executable vllm"
    return candidate, None


def mooncake_problem() -> str | None:
    """Why the mooncake transfer cannot run here, or None."""
    if shutil.which("mooncake_master") is None:
        return (
            "no `mooncake_master` on PATH: install mooncake-transfer-engine==0.3.13.post1 (the CUDA build, "
            "a 98 MB wheel: gpu_wheels.sh --mooncake) and Debian's libibverbs1, here and in vLLM's Python"
        )
    if importlib.util.find_spec("mooncake") is None:
        return "the mooncake package does not import in this Python (mooncake-transfer-engine)"
    try:
        importlib.import_module("mooncake.store")
    except (ImportError, OSError) as exc:  # libibverbs.so.1 missing, above all
        return f"mooncake.store does not import ({exc}); Debian's libibverbs1 provides libibverbs.so.1"
    return None


def manifest(
    base: Path, work: Path, label: str, extraction: dict[str, Any], *, evaluate: bool, eager: bool
) -> Path:
    """The benchmark's run.yaml for one mode: regeneration off, the extraction fields of `label`; `eager`:
    vLLM without torch.compile and CUDA graphs (`verifier.vllmArgs`), which saves about a minute of every
    server's start and costs a prefill-only server little."""
    doc = yaml.safe_load(base.read_text())
    doc["metadata"]["name"] = f"bench-{label}"
    spec = doc["spec"]
    if eager:
        spec["verifier"]["vllmArgs"] = [*spec["verifier"].get("vllmArgs", []), "--enforce-eager"]
    spec["regeneration"] = {"enabled": False}
    spec["extraction"] = {**spec["extraction"], "gpuMemoryUtilization": GPU_MEMORY, **extraction}
    if evaluate:
        spec["evaluation"] = {
            "prompts": EVAL_PROMPTS,
            "maxTokens": EVAL_MAX_TOKENS,
            "numSpeculativeTokens": EVAL_SPECULATIVE,
        }
    path = work / f"bench-{label}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def plans(spec: Path) -> dict[str, str]:
    """Stage name -> output directory (relative to the artifacts root) as `eagle3 run` plans them."""
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.stages import plan_stages

    return {p.stage.value: p.output_dir for p in plan_stages(load_manifest(spec).spec) if not p.skipped}


def seed(art: Path, spec: Path, made: dict[str, Path]) -> None:
    """Link the benchmark's own prepare and vocab outputs where `eagle3 run` looks for them (their hashes)."""
    planned = plans(spec)
    for stage, source in made.items():
        target = art / planned[stage]
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source.resolve(), target_is_directory=True)


def conversations(prepare: Path, validation: int) -> None:
    """Held-out prompts for the evaluate stage: `validation` tiny-corpus chats marked as validation rows."""
    from eagle3_pipeline.data.prepared import CONVERSATIONS_FILE, VAL
    from eagle3_pipeline.tiny.corpus import sample

    rows = [{"id": f"eval-{i}", "split": VAL, "messages": m} for i, m in enumerate(sample(1, validation))]
    (prepare / CONVERSATIONS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_bounded(argv: list[str], env: dict[str, str], log: Path, seconds: float) -> int:
    """Run `argv` in its own process group, logging to `log`; stopped (TERM, then KILL) after `seconds` or
    when this process is stopped. Returns its exit code (124 at the limit)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    try:
        return proc.wait(timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        return 124
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def keep_producer_logs(art: Path, log: Path) -> None:
    """Append the producer's (and the Mooncake master's) log to the mode's log, then remove them: the
    next mode's producer starts a log of its own."""
    for child in sorted((art / ".producers").glob("*.log")):
        lines = child.read_text(errors="replace").splitlines()[-LOG_LINES:]
        with log.open("a") as out:
            out.write(f"\n==> last {len(lines)} lines of {child.name}\n" + "\n".join(lines) + "\n")
        child.unlink()


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value: dict[str, Any] = json.loads(path.read_text())
        return value
    except (OSError, ValueError):
        return None


def run_mode(
    label: str, spec: Path, art: Path, vllm: str, until: str, seconds: float, logs: Path
) -> dict[str, Any]:
    """One `eagle3 run SPEC --until UNTIL`: the train stage's figures and what the mode stored."""
    planned = plans(spec)
    # every mode trains: the transfer is not part of the train stage's hash (mooncake would reuse volume's)
    for stage in ("train", "evaluate"):
        if stage in planned:
            shutil.rmtree(art / planned[stage], ignore_errors=True)
    log = logs / f"gpu_pipeline.online.{label}.log"
    argv = [sys.executable, "-m", "eagle3_cli", "run", str(spec), "--artifacts", str(art)]
    argv += ["--until", until, "--vllm", vllm]
    watch = Watch(art, log)
    watch.start()
    started = time.monotonic()
    try:
        code = run_bounded(argv, source_env(), log, seconds)
    finally:
        watch.stop.set()
        watch.join()
        keep_producer_logs(art, log)
    figures: dict[str, Any] = {
        "mode": label,
        "runSeconds": round(time.monotonic() - started, 1),
        "exitCode": code,
        "log": log.name,
    }
    train = read_json(art / planned["train"] / "result.json")
    if code != 0 or train is None:
        figures["error"] = "stopped at its time limit" if code == 124 else f"eagle3 run exited with {code}"
        return figures
    extract = art / planned["extract"] if "extract" in planned else None
    figures |= {
        "trainTokensPerSecond": train["trainTokensPerSecond"],
        "trainTokens": sum(e["trainTokens"] for e in train["epochs"]),
        "trainSeconds": train.get("trainSeconds"),
        "estimatedAcceptanceLength": train.get("estimatedAcceptanceLength"),
        "storedBytes": dir_bytes(extract) if extract else dir_bytes(art / "hidden-states"),
        "peakStagingBytes": watch.peak_staging,
        "hiddenStates": train.get("hiddenStates"),
    }
    if extract is not None:
        result = read_json(extract / "result.json") or {}
        figures["extractTokensPerSecond"] = result.get("tokensPerSecond")
    else:
        figures["producerPromptTokens"] = watch.tokens
    if until == "evaluate":
        evaluation = read_json(art / planned["evaluate"] / "result.json") or {}
        figures["acceptanceLength"] = evaluation.get("acceptanceLength")
    return figures


def producer_throughput(spec: Path, art: Path, vllm: str, rows: list[list[int]]) -> list[dict[str, Any]]:
    """`eagle3 produce` alone, sent up to PRODUCER_ROWS rows at each concurrency."""
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.online import ENV_HIDDEN_STATES_ENDPOINT
    from eagle3_pipeline.local.producers import LocalProducers
    from eagle3_pipeline.local.run import LocalOptions, stage_env

    run = load_manifest(spec)
    env = source_env(stage_env(LocalOptions(artifacts=art, vllm=vllm)))
    with LocalProducers(run.spec, spec, art, env) as online:
        endpoint = online[ENV_HIDDEN_STATES_ENDPOINT]
        figures = []
        for c in CONCURRENCY:
            sent = rows[: PRODUCER_ROWS[c]]
            figures.append({**asyncio.run(hammer(endpoint, sent, c)), "rows": len(sent)})
        return figures


def dataset_rows(prepare: Path) -> list[list[int]]:
    import datasets

    from eagle3_pipeline.data.prepared import DATA_DIR

    table = datasets.load_from_disk(str(prepare / DATA_DIR)).with_format(None)
    return [list(r) for r in table["input_ids"]]


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compare(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Online over offline: train tokens/s, and the acceptance lengths' agreement (within 5%)."""
    offline = runs.get("offline") or {}
    out: dict[str, Any] = {}
    for label in ("volume", "mooncake"):
        online = runs.get(label) or {}
        if "trainTokensPerSecond" not in online or "trainTokensPerSecond" not in offline:
            continue
        row: dict[str, Any] = {
            "trainTokensPerSecond": ratio(online["trainTokensPerSecond"], offline["trainTokensPerSecond"])
        }
        for key in ("estimatedAcceptanceLength", "acceptanceLength"):
            a, b = online.get(key), offline.get(key)
            if a is not None and b:
                row[key] = ratio(a, b)
                row[key + "Within5Percent"] = abs(a - b) <= 0.05 * b
        out[label] = row
    return out


def comparison(ctx: Any, prepare: Path, vocab: Path, say: Callable[[str], None]) -> None:
    """gpu_pipeline.py's step 5 on its Context (`args`, `root`, `spec`, `report`, `phase`, `save`) and its
    prepare and vocab outputs: offline (vLLM extraction) against online (volume, mooncake) by `eagle3 run`,
    and the producer alone; every part that cannot run is recorded under `skipped` with the reason."""
    args = ctx.args
    online: dict[str, Any] = {"runs": {}, "skipped": {}, "timeoutSeconds": args.online_timeout}
    ctx.report["online"] = online
    vllm, why = find_vllm(args.vllm)
    if vllm is None:
        online["skipped"]["all"] = why
        say(f"online comparison skipped: {why}")
        ctx.save()
        return
    online["vllm"], online["eager"] = vllm, not args.online_compile
    art = ctx.root / ARTIFACTS
    logs = args.json.parent if args.json else ctx.root
    until = "evaluate" if args.online_evaluate else "train"
    if args.online_evaluate:
        conversations(prepare, EVAL_PROMPTS)
    modes = {
        "offline": {"mode": "offline", "backend": "vllm"},
        "volume": {"mode": "online", "transfer": "volume"},
        "mooncake": {"mode": "online", "transfer": "mooncake"},
    }
    specs: dict[str, Path] = {}
    for label, fields in modes.items():
        problem = mooncake_problem() if label == "mooncake" else None
        if problem:
            online["skipped"][label] = problem
            say(f"online {label} skipped: {problem}")
            continue
        spec = specs[label] = manifest(
            ctx.spec, ctx.root, label, fields, evaluate=args.online_evaluate, eager=not args.online_compile
        )
        seed(art, spec, {"prepare": prepare, "vocab": vocab})
        run = functools.partial(run_mode, label, spec, art, vllm, until, args.online_timeout, logs)
        online["runs"][label] = figures = ctx.phase(f"online-{label}", run)
        if "error" in figures:
            say(f"online {label}: {figures['error']} (see {logs / figures['log']})")
    if "trainTokensPerSecond" in online["runs"].get("volume", {}):
        throughput = functools.partial(producer_throughput, specs["volume"], art, vllm, dataset_rows(prepare))
        online["producer"] = ctx.phase("producer", throughput)
    else:
        online["skipped"]["producer"] = "the online (volume) run did not finish"
    online["ratio"] = compare(online["runs"])
    ctx.save()
