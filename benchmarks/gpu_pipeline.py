"""The pipeline on one GPU: transformers-backend extraction against the prefill roofline, and draft training,
our train stage against the stock `speculators train` on the same data and the same run.yaml.

    python benchmarks/gpu_pipeline.py [--size 1b|3b|tiny] [--device cuda|cpu] [--steps 300] [--epochs 1]
        [--seq-len N] [--token-budget N] [--warmup N] [--stop-after-steps N] [--budget PHASE=S ...]
        [--peak-tflops T] [--json out.json] [--workdir DIR] [--compare all|stock|online] [--vllm PATH]
        [--online-timeout S] [--online-evaluate] [--plan-only]

(PYTHONPATH=contract:operator:pipeline:cli; `benchmarks/gpu_pipeline.sh` runs it on a GPU machine with a time
limit.)
1. A random-weight Llama verifier of `--size` is built on the device (bf16 on a GPU; `1b`: 16 layers x 2048,
   1.1B parameters) with a small BPE tokenizer (speculators reads one for the draft's mask token).
2. A prepared dataset of random rows (lengths uniform in [seq/8, seq/2], about 5% validation rows, token
   frequencies and trainRatio as prepare writes them), sized for about `--steps` packed training steps.
3. `eagle3 stage vocab` and `eagle3 stage extract` (transformers backend) run in this process. Extraction
   is reported as the stage's rate (forwards, layer capture, copy to host, file writes; loading excluded)
   and as a forward-only rate over the same batches, both also as a fraction of the prefill roofline
   (gpu_roofline.py; the peak from a table of GPU names or `--peak-tflops`).
4. `eagle3 stage train` runs in this process with the settings it picks for the device (on a GPU the stock
   ones: flex attention, the fused Triton loss, 12 loader workers), then `speculators train --config
   <that run.yaml> --save-path <elsewhere>` as a subprocess; both are measured from speculators' own step
   records (gpu_train_bench.py): the rates after the warm-up, and apart from them the seconds the compiling
   steps took (`compile_s`) and the time to the first step. The stock run comes second: Triton and inductor
   caches are warm for it, which its compile seconds and time to the first step show. Without an
   accelerator it runs inside eagle3_pipeline.adapters.speculators_cpu.cpu_adapted() (speculators 0.9.0 trains
   on CUDA only). `--stop-after-steps N` stops each run once it has logged N steps (no checkpoint, no
   validation: the train stage's output stays uncommitted, so it has no result).
5. Online against offline (gpu_online.py; needs a vLLM for the device, `--vllm`, else every part is recorded
   as skipped with the reason): `eagle3 run` on the same prepare and vocab outputs, offline (vLLM
   extraction) and online (`eagle3 produce`, volume transfer; mooncake where it is installed): train tokens/s
   and their ratio, bytes stored on the volume, peak staging, the producer's own throughput at concurrency 1
   and 32, and the acceptance length (the train stage's validation estimate; `--online-evaluate`: vLLM's).

`--compare stock` runs 1-4, `--compare online` 1-3 (vocab only) and 5, `--compare all` (the default) all.
`--budget PHASE=SECONDS` limits a phase (gpu_budget.py): a training phase past it keeps the steps it logged,
any other ends the run with what was measured so far. `--plan-only` prints the settings and budgets and exits
(benchmarks/gpu_session.sh --dry-run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_budget import StopRun, deadline, parse_budgets
from gpu_inputs import (
    build_verifier,
    forward_rate,
    gib,
    peak_bytes,
    peak_reset,
    plan_rows,
    release,
    write_data,
    write_spec,
)
from gpu_online import SOURCE_DIRS, comparison
from gpu_report import markdown
from gpu_roofline import (
    SIZES,
    fraction,
    peak_flops,
    prefill_flops_per_token,
    roofline_tokens_per_s,
)
from gpu_train_bench import (
    Progress,
    Step,
    TrainFigures,
    ratios,
    recording_steps,
    run_settings,
    run_stock,
    stock_command,
    stock_env,
    summarize,
)

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
PREPARE, EXTRACT, VOCAB, TRAIN = "prepare/bench", "extract/bench", "vocab/bench", "train/bench"
RUN_YAML = "checkpoints/run.yaml"  # in the train stage's output
PHASES = ("describe", "build", "data", "vocab", "extract", "train", "stock")  # those --budget may limit
COMPILE_OFF = ("TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE")  # set to 1: torch.compile runs nothing
STARTED = time.perf_counter()


def say(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def pick_device(name: str) -> torch.device:
    """The device; for cpu, CUDA is hidden before torch initializes it, so every stage sees no accelerator."""
    if name == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device is visible: run with --device cpu for the smoke run")
    return torch.device(name)


def stage(name: str, spec: Path, root: Path, output: str, inputs: list[str]) -> dict[str, Any]:
    """`eagle3 stage <name>` in this process; its result (SystemExit when it fails)."""
    from eagle3_pipeline.stage_main import run_stage

    with contextlib.redirect_stdout(io.StringIO()):  # the stage prints its result JSON
        code = run_stage(name, str(spec), str(root), output, inputs)
    if code != 0:
        raise SystemExit(f"stage {name} failed with exit code {code} (its error is above)")
    result: dict[str, Any] = json.loads((root / output / "result.json").read_text())
    return result


def compiled(device: torch.device) -> bool:
    """Whether training compiles (speculators compiles on CUDA only, and not with COMPILE_OFF set)."""
    return device.type == "cuda" and not any(os.environ.get(name) == "1" for name in COMPILE_OFF)


def extraction(ctx: Context) -> dict[str, Any]:
    peak_reset(ctx.device)
    started = time.perf_counter()
    result = stage("extract", ctx.spec, ctx.root, EXTRACT, [f"prepare={PREPARE}"])
    stage_wall = time.perf_counter() - started
    peak = peak_bytes(ctx.device)
    release(ctx.device)
    forward = forward_rate(ctx.model, ctx.root / PREPARE, ctx.shape, ctx.args.token_budget, ctx.device)
    mean_len = ctx.report["data"]["meanLength"]
    roofline = roofline_tokens_per_s(ctx.shape, mean_len, ctx.peak)
    stage_rate = float(result["tokensPerSecond"])
    return {
        "tokens": result["tokens"],
        "stageTokensPerSecond": stage_rate,
        "forwardTokensPerSecond": round(forward, 1),
        "flopsPerToken": round(prefill_flops_per_token(ctx.shape, mean_len)),
        "rooflineTokensPerSecond": round(roofline, 1) if roofline else None,
        "stageRooflineFraction": fraction(stage_rate, roofline),
        "forwardRooflineFraction": fraction(forward, roofline),
        "extractSeconds": result["extractSeconds"],
        "stageWallSeconds": round(stage_wall, 2),
        "peakMemoryGiB": gib(peak),
        "bytesPerToken": result["bytesPerToken"],
        "tokenBudget": result["tokenBudget"],
        "layers": result["layers"],
    }


def train_ours(ctx: Context) -> dict[str, Any]:
    """`eagle3 stage train` in this process, with the settings it picks for the device; stopped after
    `--stop-after-steps` steps or at the phase's budget, it has no result (its output stays uncommitted)."""
    peak_reset(ctx.device)
    inputs = [f"prepare={PREPARE}", f"extract={EXTRACT}", f"vocab={VOCAB}"]
    started = time.perf_counter()
    progress = Progress("ours", started, lambda steps: ctx.snapshot("ours", steps, started))
    result: dict[str, Any] | None = None
    stopped: str | None = None
    with recording_steps(progress, ctx.args.stop_after_steps) as recorder:
        try:
            result = stage("train", ctx.spec, ctx.root, TRAIN, inputs)
        except StopRun as stop:
            stopped = stop.reason
    ended = time.perf_counter()
    ctx.ours = summarize(recorder.steps, ctx.warmup, started, ended, peak_bytes(ctx.device), stopped)
    release(ctx.device)
    say(f"train (ours): {ctx.ours.steps} steps, {ctx.ours.steps_per_s} steps/s (stopped: {stopped})")
    stage_keys = ("parameters", "device", "trainTokensPerSecond", "trainSeconds")
    return {
        "ours": ctx.ours.as_dict(),
        "warmupSteps": ctx.warmup,
        "stopAfterSteps": ctx.args.stop_after_steps,
        "compiled": compiled(ctx.device),
        "settings": run_settings(ctx.run_yaml()),
        "stageResult": {k: result.get(k) for k in stage_keys} if result else None,
    }


def train_stock(ctx: Context) -> dict[str, Any]:
    """`speculators train --config <our run.yaml>` in a subprocess, saving to a directory of its own."""
    import torch

    cuda = ctx.device.type == "cuda"
    config, save = ctx.run_yaml(), ctx.root / "stock" / "checkpoints"
    save.parent.mkdir()
    env = stock_env([REPO / d for d in SOURCE_DIRS], None if cuda else torch.get_num_threads())
    started = time.perf_counter()
    stock = run_stock(
        stock_command(config, save),
        env,
        save.parent,
        ctx.stock_log,
        ctx.warmup,
        ctx.args.stop_after_steps,
        lambda steps: ctx.snapshot("stock", steps, started),
    )
    assert ctx.ours is not None
    return {
        "stock": stock.as_dict(),
        "ratio": ratios(ctx.ours, stock),
        "stockCommand": f"speculators train --config {config} --save-path {save}",
        "stockAdaptedToCpu": not cuda,
    }


class Context:
    """One benchmark run: its arguments, device, verifier and working directory, and the report so far."""

    def __init__(self, args: argparse.Namespace, root: Path, device: torch.device) -> None:
        self.args, self.root, self.device = args, root, device
        self.shape = SIZES[args.size]
        self.model = root / "verifier"
        self.spec = root / "run.yaml"
        self.warmup: int = args.warmup
        self.stock_log = args.json.with_suffix(".stock.log") if args.json else root / "stock.log"
        self.peak: float | None = None
        self.ours: TrainFigures | None = None
        self.report: dict[str, Any] = {"phases": {}, "budgets": args.budgets}

    def phase(self, name: str, run: Callable[[], Any], key: str | None = None) -> Any:
        """Run one phase under its budget, its time (and its value, under `key`) saved at once: a run cut
        short keeps what it measured. A phase that fails or runs past its budget is recorded, and ends the
        run (the training phases catch their budget themselves)."""
        say(f"{name} ...")
        started = time.perf_counter()
        budget = self.args.budgets.get(name)
        try:
            with deadline(budget):
                value = run()
        except StopRun as stop:
            self.ended(name, started, "overBudget", budget)
            raise SystemExit(f"phase {name} ran past its budget ({stop.reason})") from None
        except (Exception, SystemExit) as exc:  # SystemExit: a stage that failed (its error is above)
            self.ended(name, started, "errors", f"{type(exc).__name__}: {exc}"[:2000])
            raise
        if key is not None:
            self.report[key] = value
        self.ended(name, started)
        return value

    def ended(self, name: str, started: float, problem: str | None = None, what: Any = None) -> None:
        """A phase's seconds, and what went wrong (under `overBudget` or `errors`), saved."""
        self.report["phases"][name] = round(time.perf_counter() - started, 2)
        if problem is not None:
            self.report.setdefault(problem, {})[name] = what
        self.save()

    def snapshot(self, label: str, steps: list[Step], started: float) -> None:
        """A training run's figures so far (`stopped: running`), saved while it runs."""
        figures = summarize(steps, self.warmup, started, time.perf_counter(), None, "running")
        self.report.setdefault("training", {})[label] = figures.as_dict()
        self.save()

    def run_yaml(self) -> Path:
        """The train stage's run.yaml: in its output, or in its work directory when it was stopped."""
        from eagle3_pipeline.runtime.context import work_dir_of

        done = self.root / TRAIN / RUN_YAML
        return done if done.exists() else work_dir_of(self.root / TRAIN) / RUN_YAML

    def save(self) -> None:
        self.report["totalSeconds"] = round(time.perf_counter() - STARTED, 2)
        if self.args.json:
            self.args.json.write_text(json.dumps(self.report, indent=2) + "\n")


def describe(ctx: Context) -> dict[str, Any]:
    import importlib.metadata

    import torch

    name = torch.cuda.get_device_name() if ctx.device.type == "cuda" else platform.processor() or "cpu"
    ctx.peak = peak_flops(name, ctx.args.peak_tflops)
    versions = {p: importlib.metadata.version(p) for p in ("torch", "transformers", "speculators")}
    return {
        "device": {
            "type": ctx.device.type,
            "name": name,
            "peakTflops": ctx.peak / 1e12 if ctx.peak else None,
        },
        "versions": versions,
        "verifier": {"size": ctx.args.size, **ctx.shape.describe()},
    }


def run(ctx: Context) -> dict[str, Any]:
    args, report = ctx.args, ctx.report
    report.update(ctx.phase("describe", lambda: describe(ctx)))
    ctx.phase("build", lambda: build_verifier(ctx.shape, ctx.model, ctx.device, args.seq_len))
    train_rows, val_rows, lengths = plan_rows(args.steps, args.epochs, args.seq_len)
    prepare = ctx.root / PREPARE
    ctx.phase("data", lambda: write_data(prepare, ctx.shape.vocab, train_rows, val_rows, lengths), "data")
    write_spec(ctx.spec, ctx.model, ctx.shape, args)
    ctx.phase("vocab", lambda: stage("vocab", ctx.spec, ctx.root, VOCAB, [f"prepare={PREPARE}"]), "vocab")
    if args.compare in ("all", "stock"):
        ctx.phase("extract", lambda: extraction(ctx), "extraction")
        ctx.phase("train", lambda: train_ours(ctx), "training")
        report["training"].update(ctx.phase("stock", lambda: train_stock(ctx)))
    if args.compare in ("all", "online"):
        comparison(ctx, ctx.root / PREPARE, ctx.root / VOCAB, say)
    ctx.save()
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="1b")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--steps", type=int, default=300, help="training steps to size the dataset for")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seq-len", type=int, help="tokens per packed training step (default 2048; tiny 256)")
    p.add_argument("--token-budget", type=int, help="extraction tokens per batch (default 32768; tiny 1024)")
    p.add_argument("--warmup", type=int, help="first steps left out of the rates (default steps/10, 1..10)")
    p.add_argument(
        "--stop-after-steps",
        type=int,
        help="stop each training run once it has logged this many steps (default: run to the end)",
    )
    p.add_argument(
        "--budget",
        action="append",
        metavar="PHASE=SECONDS",
        help=f"a phase's time limit (repeatable; phases: {', '.join(PHASES)})",
    )
    p.add_argument("--plan-only", action="store_true", help="print the settings and budgets (JSON), and exit")
    p.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOP/s (default: from the GPU's name)")
    p.add_argument("--json", type=Path, help="write the report here (after every phase)")
    p.add_argument("--markdown", type=Path, help="write the Markdown tables here too")
    p.add_argument("--workdir", type=Path, help="where the temporary run directory goes (default $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the run directory (models, files, checkpoints)")
    p.add_argument(
        "--compare",
        choices=["all", "stock", "online"],
        default="all",
        help="stock: ours against stock speculators train; online: online against offline; all",
    )
    p.add_argument("--vllm", help="vLLM's executable for the online comparison (default $EAGLE3_VLLM, PATH)")
    p.add_argument(
        "--online-timeout",
        type=float,
        default=240.0,
        help="seconds for each `eagle3 run` of the online comparison (default 240)",
    )
    p.add_argument(
        "--online-compile",
        action="store_true",
        help="vLLM with torch.compile and CUDA graphs (default: --enforce-eager, faster to start)",
    )
    p.add_argument(
        "--online-evaluate",
        action="store_true",
        help="run the evaluate stage for each draft too (two more vLLM servers per mode)",
    )
    return resolve(p, p.parse_args(argv))


def resolve(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on other options, and the budgets; `p.error` for what cannot run."""
    tiny = args.size == "tiny"
    args.seq_len = args.seq_len or (256 if tiny else 2048)
    args.token_budget = args.token_budget or (1024 if tiny else 32768)
    args.warmup = args.warmup if args.warmup is not None else max(1, min(10, args.steps // 10))
    try:
        args.budgets = parse_budgets(args.budget, PHASES)
    except ValueError as exc:
        p.error(str(exc))
    if args.stop_after_steps is not None and args.stop_after_steps <= args.warmup + 1:
        p.error(f"--stop-after-steps {args.stop_after_steps}: no step would be measured after the warm-up")
    return args


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """What `--plan-only` prints: the run's settings and its phases' budgets."""
    keys = ("size", "device", "steps", "epochs", "seq_len", "token_budget", "warmup", "stop_after_steps")
    return {**{k: getattr(args, k) for k in keys}, "compare": args.compare, "budgets": args.budgets}


def terminated(signum: int, frame: object) -> None:
    """SIGTERM (a time limit) ends the run like an error: the run directory is still removed."""
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plan_only:
        print(json.dumps(plan(args)))
        return 0
    signal.signal(signal.SIGTERM, terminated)
    device = pick_device(args.device)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="gpu-pipeline-", dir=args.workdir))
    try:
        report = run(Context(args, root, device))
    finally:
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    text = markdown(report)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
