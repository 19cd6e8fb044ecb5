"""The pipeline on one GPU: transformers-backend extraction against the prefill roofline, and draft training,
our train stage against the stock `speculators train` on the same data and the same run.yaml.

    python benchmarks/gpu_pipeline.py [--size 1b|3b|tiny] [--device cuda|cpu] [--steps 300] [--epochs 1]
        [--seq-len N] [--token-budget N] [--warmup N] [--peak-tflops T] [--json out.json] [--workdir DIR]
        [--compare all|stock|online] [--vllm PATH] [--online-timeout S] [--online-evaluate]

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
   records (gpu_train_bench.py). The stock run comes second: Triton and inductor caches are warm for it,
   which only its time to the first step shows. Without an accelerator it runs inside
   eagle3_pipeline.speculators_cpu.cpu_adapted() (speculators 0.9.0 trains on CUDA only).
5. Online against offline (gpu_online.py; needs a vLLM for the device, `--vllm`, else every part is recorded
   as skipped with the reason): `eagle3 run` on the same prepare and vocab outputs, offline (vLLM
   extraction) and online (`eagle3 produce`, volume transfer; mooncake where it is installed): train tokens/s
   and their ratio, bytes stored on the volume, peak staging, the producer's own throughput at concurrency 1
   and 32, and the acceptance length (the train stage's validation estimate; `--online-evaluate`: vLLM's).

`--compare stock` runs 1-4, `--compare online` 1-3 (vocab only) and 5, `--compare all` (the default) all.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import json
import logging
import math
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from gpu_online import SOURCE_DIRS
from gpu_report import markdown
from gpu_roofline import (
    SIZES,
    LlamaShape,
    fraction,
    peak_flops,
    prefill_flops_per_token,
    roofline_tokens_per_s,
)
from gpu_train_bench import (
    Progress,
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
VAL_FRACTION = 0.05
PACKING = 0.9  # assumed fill of speculators' packed training rows, to size the dataset for --steps
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


def build_verifier(shape: LlamaShape, path: Path, device: torch.device, max_len: int) -> None:
    """Random Llama weights made on `device` (bf16 on a GPU, fp32 on the CPU) and a tokenizer, saved."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3_pipeline.tiny.corpus import sample
    from eagle3_pipeline.tiny.tokenizer import save_tokenizer, train_tokenizer, training_texts

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(4096, 2 * max_len),
        tie_word_embeddings=False,
    )
    llama: Any = LlamaForCausalLM  # untyped for mypy
    with device:  # initialized where it will run: seconds on a GPU for 1B parameters
        model = llama(config)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    save_tokenizer(train_tokenizer(training_texts(sample(0, 200)), 512), path, max_len)


def plan_rows(steps: int, epochs: int, seq_len: int) -> tuple[int, int, tuple[int, int]]:
    """(train rows, validation rows, length range) for about `steps` packed steps over `epochs` epochs."""
    lengths = (max(2, seq_len // 8), seq_len // 2)
    mean = sum(lengths) / 2
    train = max(4, math.ceil(steps / epochs * seq_len * PACKING / mean))
    return train, max(2, round(train * VAL_FRACTION)), lengths


def write_data(root: Path, vocab: int, train: int, val: int, lengths: tuple[int, int]) -> dict[str, Any]:
    """A prepare output of random rows, written with the prepare stage's own functions."""
    import torch

    from eagle3_pipeline.masking import Tokenized
    from eagle3_pipeline.prepared import (
        DATA_DIR,
        TOKEN_FREQ_FILE,
        TRAIN,
        VAL,
        save_dataset,
        token_frequencies,
    )

    rng = random.Random(0)
    rows = []
    for i in range(train + val):
        n = rng.randint(*lengths)
        ids = [rng.randrange(vocab) for _ in range(n)]
        conv = {"id": str(i), "split": TRAIN if i < train else VAL}
        rows.append((conv, Tokenized(ids, [0] * (n // 4) + [1] * (n - n // 4))))
    out = root / PREPARE
    save_dataset(out / DATA_DIR, rows)
    torch.save(dict(token_frequencies(rows)), out / TOKEN_FREQ_FILE)
    tokens = sum(len(t.input_ids) for _, t in rows)
    result = {"samples": len(rows), "train": train, "validation": val, "trainRatio": train / len(rows)}
    (out / "result.json").write_text(json.dumps({**result, "tokens": tokens}) + "\n")
    return {**result, "tokens": tokens, "meanLength": round(tokens / len(rows), 1), "lengths": list(lengths)}


def write_spec(path: Path, model: Path, shape: LlamaShape, args: argparse.Namespace) -> Path:
    spec = {
        "verifier": {"model": str(model)},
        "dataset": {
            "source": "random",
            "maxSequenceLength": args.seq_len,
            "validationFraction": VAL_FRACTION,
        },
        "extraction": {
            "backend": "transformers",
            "layers": list(shape.aux_layers),
            "tokenBudget": args.token_budget,
            "dtype": "bfloat16",
        },
        "draft": {"vocabSize": shape.draft_vocab},
        "training": {"epochs": args.epochs, "sequenceLength": args.seq_len},
    }
    doc = {"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Run", "metadata": {"name": "bench-gpu"}}
    path.write_text(yaml.safe_dump({**doc, "spec": spec}, sort_keys=False))
    return path


def stage(name: str, spec: Path, root: Path, output: str, inputs: list[str]) -> dict[str, Any]:
    """`eagle3 stage <name>` in this process; its result (SystemExit when it fails)."""
    from eagle3_pipeline.stage_main import run_stage

    with contextlib.redirect_stdout(io.StringIO()):  # the stage prints its result JSON
        code = run_stage(name, str(spec), str(root), output, inputs)
    if code != 0:
        raise SystemExit(f"stage {name} failed with exit code {code} (its error is above)")
    result: dict[str, Any] = json.loads((root / output / "result.json").read_text())
    return result


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def release(device: torch.device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def forward_rate(model_dir: Path, root: Path, shape: LlamaShape, budget: int, device: torch.device) -> float:
    """Tokens/s of the extractor's forward passes (layer capture included) over the stage's batches."""
    from eagle3_pipeline import extract_transformers as tf
    from eagle3_pipeline.extract_rows import PreparedRows
    from eagle3_pipeline.hidden_states import Layout, plan_batches

    rows = PreparedRows.load(root / PREPARE, shape.vocab)
    layout = Layout(shape.aux_layers, shape.layers, shape.hidden, "bfloat16")
    batches = [rows.token_ids(b) for b in plan_batches(list(enumerate(rows.seq_lens)), budget)]
    extractor = tf.TransformersExtractor(
        tf.load_verifier(tf.VerifierRef(str(model_dir), None, False), device), layout
    )
    extractor.forward(batches[0])  # warm-up: kernels chosen, allocator grown
    synchronize(device)
    started = time.perf_counter()
    for batch in batches:
        extractor.forward(batch)
    synchronize(device)
    seconds = time.perf_counter() - started
    del extractor
    release(device)
    return sum(len(ids) for batch in batches for ids in batch) / seconds


def extraction(ctx: Context) -> dict[str, Any]:
    started = time.perf_counter()
    result = stage("extract", ctx.spec, ctx.root, EXTRACT, [f"prepare={PREPARE}"])
    stage_wall = time.perf_counter() - started
    release(ctx.device)
    forward = forward_rate(ctx.model, ctx.root, ctx.shape, ctx.args.token_budget, ctx.device)
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
        "bytesPerToken": result["bytesPerToken"],
        "tokenBudget": result["tokenBudget"],
        "layers": result["layers"],
    }


def train_ours(ctx: Context) -> dict[str, Any]:
    """`eagle3 stage train` in this process, with the settings it picks for the device."""
    import torch

    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    inputs = [f"prepare={PREPARE}", f"extract={EXTRACT}", f"vocab={VOCAB}"]
    started = time.perf_counter()
    with recording_steps(Progress("ours", started)) as recorder:
        result = stage("train", ctx.spec, ctx.root, TRAIN, inputs)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    ctx.ours = summarize(recorder.steps, ctx.warmup, started, time.perf_counter(), peak)
    release(ctx.device)
    say(f"train (ours): {ctx.ours.steps} steps, {ctx.ours.steps_per_s} steps/s")
    stage_keys = ("parameters", "device", "trainTokensPerSecond", "trainSeconds")
    return {
        "ours": ctx.ours.as_dict(),
        "warmupSteps": ctx.warmup,
        "settings": run_settings(ctx.root / TRAIN / RUN_YAML),
        "stageResult": {k: result.get(k) for k in stage_keys},
    }


def train_stock(ctx: Context) -> dict[str, Any]:
    """`speculators train --config <our run.yaml>` in a subprocess, saving to a directory of its own."""
    import torch

    cuda = ctx.device.type == "cuda"
    config, save = ctx.root / TRAIN / RUN_YAML, ctx.root / "stock" / "checkpoints"
    save.parent.mkdir()
    env = stock_env([REPO / d for d in SOURCE_DIRS], None if cuda else torch.get_num_threads())
    stock = run_stock(stock_command(config, save), env, save.parent, ctx.stock_log, ctx.warmup)
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
        self.warmup = args.warmup if args.warmup is not None else max(1, min(10, args.steps // 10))
        self.stock_log = args.json.with_suffix(".stock.log") if args.json else root / "stock.log"
        self.peak: float | None = None
        self.ours: TrainFigures | None = None
        self.report: dict[str, Any] = {"phases": {}}

    def phase(self, name: str, run: Callable[[], Any], key: str | None = None) -> Any:
        """Run one phase, its time (and its value, under `key`) saved at once: a run cut short by a time
        limit keeps what it measured."""
        say(f"{name} ...")
        started = time.perf_counter()
        value = run()
        self.report["phases"][name] = round(time.perf_counter() - started, 2)
        if key is not None:
            self.report[key] = value
        self.save()
        return value

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
    ctx.phase("data", lambda: write_data(ctx.root, ctx.shape.vocab, train_rows, val_rows, lengths), "data")
    write_spec(ctx.spec, ctx.model, ctx.shape, args)
    ctx.phase("vocab", lambda: stage("vocab", ctx.spec, ctx.root, VOCAB, [f"prepare={PREPARE}"]), "vocab")
    if args.compare in ("all", "stock"):
        ctx.phase("extract", lambda: extraction(ctx), "extraction")
        ctx.phase("train", lambda: train_ours(ctx), "training")
        report["training"].update(ctx.phase("stock", lambda: train_stock(ctx)))
    if args.compare in ("all", "online"):
        online_comparison(ctx)
    ctx.save()
    return report


def online_comparison(ctx: Context) -> None:
    """Step 5: offline (vLLM extraction) against online (volume, mooncake) by `eagle3 run`, and the producer
    alone; every part that cannot run is recorded under `skipped` with the reason."""
    import gpu_online as go

    args = ctx.args
    online: dict[str, Any] = {"runs": {}, "skipped": {}, "timeoutSeconds": args.online_timeout}
    ctx.report["online"] = online
    vllm, why = go.find_vllm(args.vllm)
    if vllm is None:
        online["skipped"]["all"] = why
        say(f"online comparison skipped: {why}")
        ctx.save()
        return
    online["vllm"], online["eager"] = vllm, not args.online_compile
    art = ctx.root / go.ARTIFACTS
    logs = args.json.parent if args.json else ctx.root
    until = "evaluate" if args.online_evaluate else "train"
    if args.online_evaluate:
        go.conversations(ctx.root / PREPARE, go.EVAL_PROMPTS)
    modes = {
        "offline": {"mode": "offline", "backend": "vllm"},
        "volume": {"mode": "online", "transfer": "volume"},
        "mooncake": {"mode": "online", "transfer": "mooncake"},
    }
    specs: dict[str, Path] = {}
    for label, fields in modes.items():
        problem = go.mooncake_problem() if label == "mooncake" else None
        if problem:
            online["skipped"][label] = problem
            say(f"online {label} skipped: {problem}")
            continue
        spec = specs[label] = go.manifest(
            ctx.spec, ctx.root, label, fields, evaluate=args.online_evaluate, eager=not args.online_compile
        )
        go.seed(art, spec, {"prepare": ctx.root / PREPARE, "vocab": ctx.root / VOCAB})
        run = functools.partial(go.run_mode, label, spec, art, vllm, until, args.online_timeout, logs)
        online["runs"][label] = figures = ctx.phase(f"online-{label}", run)
        if "error" in figures:
            say(f"online {label}: {figures['error']} (see {logs / figures['log']})")
    if "trainTokensPerSecond" in online["runs"].get("volume", {}):
        rows = go.dataset_rows(ctx.root / PREPARE)
        throughput = functools.partial(go.producer_throughput, specs["volume"], art, vllm, rows)
        online["producer"] = ctx.phase("producer", throughput)
    else:
        online["skipped"]["producer"] = "the online (volume) run did not finish"
    online["ratio"] = go.compare(online["runs"])
    ctx.save()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="1b")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--steps", type=int, default=300, help="training steps to size the dataset for")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seq-len", type=int, help="tokens per packed training step (default 2048; tiny 256)")
    p.add_argument("--token-budget", type=int, help="extraction tokens per batch (default 32768; tiny 1024)")
    p.add_argument("--warmup", type=int, help="first steps left out of the rates (default steps/10, 1..10)")
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
    args = p.parse_args(argv)
    tiny = args.size == "tiny"
    args.seq_len = args.seq_len or (256 if tiny else 2048)
    args.token_budget = args.token_budget or (1024 if tiny else 32768)
    return args


def terminated(signum: int, frame: object) -> None:
    """SIGTERM (a time limit) ends the run like an error: the run directory is still removed."""
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
