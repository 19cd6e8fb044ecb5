"""Draft training on CPU: `eagle3 stage train` against stock `speculators train` on the same run.yaml.

    .venv/bin/python benchmarks/train_cpu.py [--shape tiny|100m] [--repeat 3] [--epochs 6] [--threads 1]
        [--work DIR] [--json out.json]

`--shape 100m` (issue 30) trains at a 100M-class verifier's shape instead of the tiny one's: a Llama verifier
of hidden size 576, 9 heads of which 3 key-value, MLP 1536, a vocabulary of 49,152 (SmolLM2-135M's), in
bfloat16 as real checkpoints ship, with a draft vocabulary of 8,192 and sequences of 512. Its weights are
random (seeded) and it has 4 layers instead of 30: training reads the verifier's hidden size, vocabulary,
embeddings and LM head and extract's stored layers, never its depth, so the draft's work per token is the
real shape's while extract stays short. It uses the tiny tokenizer (1,024 tokens; the ids above it are never
seen, as in any real dataset most of a 49,152-token vocabulary is rare), and the tiny example's data.
`$EAGLE3_CPU_BF16=0` makes ours take the path of a CPU without native bfloat16 on one that has it
(eagle3_pipeline.runtime.host_cpu); stock always runs as speculators does.

The tiny example (`examples/tiny/eagle3run.yaml`, the tiny verifier of `eagle3 tiny`) with regeneration off,
so no vLLM is needed: its prepare, extract and vocab outputs are made once by the local runner and cached in
`--work`. Then, `--repeat` times, in alternating order (ours, stock, stock, ours, ...), each as a process of
its own with the same torch threads (`OMP_NUM_THREADS`), its output going to a log file in `--work`:

- ours: `eagle3 stage train` (the train plan's inputs, a fresh output directory);
- stock: `speculators train --config <the run.yaml ours wrote> --save-path <fresh>`, inside
  `eagle3_pipeline.adapters.speculators_cpu.cpu_adapted()` (speculators 0.9.0 refuses a machine without a
  GPU).

Both run speculators' `Trainer.run_training` on the same data, config, seed and epochs; each validates after
every epoch and saves every epoch's checkpoint. Both processes get the same passive observer: a logging filter
on speculators' `speculators` and `speculators.metrics` loggers that timestamps (CLOCK_MONOTONIC) each step's
metric record and the trainer's "Training/Validation epoch" lines. Per run:

- step s: the sum of speculators' own per-step `step_ms` (from the end of the previous step's optimizer step
  to the end of this one); tokens: the sum of its `tokens_per_s * step_ms` (each step's non-padding tokens);
- of which fetch s: the sum of its `fetch_ms`, the part of step s before the forward pass: the previous
  step's metric logging (stock prints every step's metrics to the console through rich, ours adds them to the
  epoch's metrics.jsonl line), the loader's next batch (hidden-state files read, collated), the device copy;
- loop s: from "Training epoch 1/N started" to "Validation epoch N/N completed": the steps plus the per-epoch
  checkpoint saves and validation passes; of which validation s: the validation passes;
- startup s: from the process's start to "Training epoch 1/N started" (imports, config, model, data loaders);
- wall s: the whole process;
- CPU time (user + system seconds of all the process's threads, less sensitive than wall time to other jobs
  on the machine): loop CPU s over the same span as loop s and startup CPU s up to it (the observer reads
  `time.process_time()` at the epoch lines), process CPU s for the whole process (`os.wait4`).

Reported: the median of each figure over the repeats, tokens/s = tokens / step s and tokens / loop s (and
tokens / loop CPU s), and the ratio ours / stock of each median. Equivalence: the runs must have the same
numbers of steps, epochs and tokens; each run's final-epoch train loss and every epoch's validation loss are
printed (identical when the seed and the thread count give the same arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"
EVENTS_ENV = "EAGLE3_TRAIN_BENCH_EVENTS"
# Prepended to both processes: timestamps speculators' step records and epoch lines, changes nothing.
OBSERVER = f"""
import json, logging, os, sys, time
from collections.abc import Mapping
_sink = open(os.environ[{EVENTS_ENV!r}], "a", buffering=1)
class _Observer(logging.Filter):
    def filter(self, record):
        msg, now = record.msg, time.monotonic()
        if isinstance(msg, Mapping) and isinstance(msg.get("epoch"), int) and "train" in msg:
            import torch
            p = msg.get("profile") or {{}}
            ms, rate = p.get("step_ms", 0.0), p.get("tokens_per_s", 0.0)
            _sink.write(json.dumps({{"t": now, "kind": "step", "epoch": msg["epoch"], "ms": ms,
                "fetch_ms": p.get("fetch_ms", 0.0),
                "tokens": rate * ms / 1000, "loss": msg["train"].get("loss"),
                "threads": torch.get_num_threads()}}) + "\\n")
        elif isinstance(msg, Mapping) and isinstance(msg.get("epoch"), int) and "val" in msg:
            _sink.write(json.dumps({{"t": now, "kind": "val", "epoch": msg["epoch"],
                "loss": msg["val"].get("loss_epoch")}}) + "\\n")
        elif isinstance(msg, str) and msg.startswith(("Training epoch", "Validation epoch")):
            _sink.write(json.dumps({{"t": now, "cpu": time.process_time(), "kind": "text",
                "msg": msg}}) + "\\n")
        return True
for _name in ("speculators", "speculators.metrics"):
    logging.getLogger(_name).addFilter(_Observer())
"""
OURS = OBSERVER + "from eagle3_cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
STOCK = OBSERVER + (
    "from eagle3_pipeline.adapters.speculators_cpu import cpu_adapted\n"
    "from speculators.__main__ import app\n"
    "sys.argv = ['speculators', *sys.argv[1:]]\n"
    "with cpu_adapted():\n"
    "    app()\n"
)


@dataclass
class Run:
    tool: str  # "ours" or "stock"
    index: int
    threads: int
    epochs: int
    steps: int
    tokens: int
    step_s: float
    fetch_s: float
    val_s: float
    loop_s: float
    startup_s: float
    wall_s: float
    loop_cpu_s: float
    startup_cpu_s: float
    cpu_s: float
    final_train_loss: float
    val_losses: list[float] = field(default_factory=list)

    @property
    def step_tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def loop_tokens_per_s(self) -> float:
        return self.tokens / self.loop_s

    @property
    def tokens_per_loop_cpu_s(self) -> float:
        return self.tokens / self.loop_cpu_s


SHAPE_100M = {  # SmolLM2-135M's width, heads and vocabulary (its config.json), 4 layers instead of 30
    "vocab_size": 49_152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}
VERIFIER_100M = "bench-100m-llama"


def verifier_100m(root: Path) -> str:
    """The 100M-class shape's verifier under the models root (built once: random weights, bfloat16, the
    tiny verifier's tokenizer and chat template); returns its /models path."""
    target = root / VERIFIER_100M
    if not (target / "config.json").is_file():
        import torch
        from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tiny = root / "tiny-llama"
        base = AutoConfig.from_pretrained(tiny)
        config = LlamaConfig(
            **SHAPE_100M, max_position_embeddings=2048, tie_word_embeddings=False, rms_norm_eps=1e-5,
            bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id, pad_token_id=base.pad_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        partial = root / f".{VERIFIER_100M}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(partial)
        AutoTokenizer.from_pretrained(tiny).save_pretrained(partial)
        shutil.copyfile(tiny / "generation_config.json", partial / "generation_config.json")
        partial.rename(target)
    return f"/models/{VERIFIER_100M}"


def bench_manifest(work: Path, epochs: int | None, shape: str = "tiny") -> Path:
    """The tiny example with regeneration off (its dataset has answers), optionally other epochs; at the
    100M-class shape, with its verifier, a draft vocabulary of 8,192 and sequences of 512."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "bench-train" if shape == "tiny" else f"bench-train-{shape}"
    doc["spec"]["regeneration"]["enabled"] = False
    if shape == "100m":
        from eagle3_pipeline.runtime.context import models_root

        doc["spec"]["verifier"]["model"] = verifier_100m(models_root())
        doc["spec"]["draft"]["vocabSize"] = 8192
        doc["spec"]["dataset"]["maxSequenceLength"] = 512
        doc["spec"]["training"]["sequenceLength"] = 512
    if epochs is not None:
        doc["spec"]["training"]["epochs"] = epochs
    path = work / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def upstream(manifest: Path, art: Path) -> Any:
    """prepare, extract and vocab by the local runner (reused when complete); returns the train plan."""
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.stages import Stage, plan_stages
    from eagle3_pipeline.local.run import LocalOptions, run_local

    run = load_manifest(manifest)
    for outcome in run_local(run, LocalOptions(artifacts=art, until="vocab")):
        print(f"upstream: {outcome.stage} {outcome.status} ({outcome.seconds:.1f} s)", file=sys.stderr)
    [plan] = [p for p in plan_stages(run.spec) if p.stage == Stage.TRAIN]
    return plan


@dataclass(frozen=True)
class Span:
    start: float  # monotonic clock
    end: float
    cpu: float  # user + system seconds of the process


def launch(code: str, args: list[str], events: Path, log: Path, threads: int, cwd: Path) -> Span:
    """Run `python -c code args...` to completion."""
    from eagle3_pipeline.runtime.context import ENV_MODELS_ROOT, models_root

    events.unlink(missing_ok=True)
    env = {**os.environ, EVENTS_ENV: str(events), "OMP_NUM_THREADS": str(threads)}
    env[ENV_MODELS_ROOT] = str(models_root().resolve())
    with log.open("wb") as sink:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], cwd=cwd, env=env, stdout=sink, stderr=sink
        )
        _, status, usage = os.wait4(proc.pid, 0)
        ended = time.monotonic()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{shlex.join(args[:3])} failed (exit code {proc.returncode}):\n{tail}")
    return Span(started, ended, usage.ru_utime + usage.ru_stime)


def measure(tool: str, index: int, events: Path, span: Span) -> Run:
    """A run's figures from its observer's events (see the module docstring)."""
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    steps = [e for e in lines if e["kind"] == "step"]
    texts = {e["msg"]: e for e in lines if e["kind"] == "text"}
    vals = sorted((e["epoch"], e["loss"]) for e in lines if e["kind"] == "val")
    n = len(vals)
    first, last = texts[f"Training epoch 1/{n} started"], texts[f"Validation epoch {n}/{n} completed"]
    val_s = sum(
        texts[f"Validation epoch {k}/{n} completed"]["t"] - texts[f"Validation epoch {k}/{n} started"]["t"]
        for k in range(1, n + 1)
    )
    final = [e["loss"] for e in steps if e["epoch"] == n - 1]
    return Run(
        tool=tool,
        index=index,
        threads=steps[0]["threads"],
        epochs=n,
        steps=len(steps),
        tokens=round(sum(e["tokens"] for e in steps)),
        step_s=sum(e["ms"] for e in steps) / 1000,
        fetch_s=sum(e["fetch_ms"] for e in steps) / 1000,
        val_s=val_s,
        loop_s=last["t"] - first["t"],
        startup_s=first["t"] - span.start,
        wall_s=span.end - span.start,
        loop_cpu_s=last["cpu"] - first["cpu"],
        startup_cpu_s=first["cpu"],
        cpu_s=span.cpu,
        final_train_loss=sum(final) / len(final),
        val_losses=[loss for _, loss in vals],
    )


def run_ours(index: int, plan: Any, spec: Path, art: Path, work: Path, threads: int) -> Run:
    output = f"train/bench-ours-{index}"
    shutil.rmtree(art / output, ignore_errors=True)
    argv = ["stage", "train", "--spec", str(spec), "--artifacts", str(art), "--output", output]
    argv += [f"--input={name}={path}" for name, path in sorted(plan.inputs.items())]
    events = work / "events-ours.jsonl"
    span = launch(OURS, argv, events, work / "ours.log", threads, work)
    run = measure("ours", index, events, span)
    keep = work / "run.yaml"
    if not keep.exists():  # the config stock trains from: the first one ours wrote
        shutil.copyfile(art / output / "checkpoints" / "run.yaml", keep)
    result = json.loads((art / output / "result.json").read_text())
    if result["trainTokensPerSecond"] != round(run.step_tokens_per_s, 1):
        print(f"note: ours reports {result['trainTokensPerSecond']} train tokens/s", file=sys.stderr)
    shutil.rmtree(art / output)
    return run


def run_stock(index: int, work: Path, threads: int) -> Run:
    save = work / "stock-checkpoints"
    shutil.rmtree(save, ignore_errors=True)
    argv = ["train", "--config", str(work / "run.yaml"), "--save-path", str(save)]
    events = work / "events-stock.jsonl"
    span = launch(STOCK, argv, events, work / "stock.log", threads, work)
    run = measure("stock", index, events, span)
    shutil.rmtree(save)
    return run


def median_of(runs: list[Run], key: str) -> float:
    return float(statistics.median(float(getattr(r, key)) for r in runs))


WALL = (
    ("step_s", ".2f"),
    ("fetch_s", ".2f"),
    ("step_tokens_per_s", ",.0f"),
    ("loop_s", ".2f"),
    ("val_s", ".2f"),
    ("loop_tokens_per_s", ",.0f"),
    ("startup_s", ".2f"),
    ("wall_s", ".2f"),
)
CPU = (("loop_cpu_s", ".2f"), ("tokens_per_loop_cpu_s", ",.0f"), ("startup_cpu_s", ".2f"), ("cpu_s", ".2f"))
NAMES = {"ours": "eagle3 stage train", "stock": "speculators train (cpu_adapted)"}


def summary(runs: list[Run]) -> dict[str, Any]:
    """Medians per tool and the ratio ours / stock of each."""
    keys = [k for k, _ in WALL + CPU]
    by = {tool: [r for r in runs if r.tool == tool] for tool in NAMES}
    medians = {tool: {k: median_of(rs, k) for k in keys} for tool, rs in by.items()}
    ratio = {k: medians["ours"][k] / medians["stock"][k] for k in keys}
    return {"medians": medians, "ratio": ratio}


def table(runs: list[Run], s: dict[str, Any], head: str, columns: tuple[tuple[str, str], ...]) -> str:
    lines = [head, "| --- |" + " ---: |" * (head.count("|") - 2)]
    for tool, name in NAMES.items():
        r = next(r for r in runs if r.tool == tool)
        cells = [f"{s['medians'][tool][k]:{f}}" for k, f in columns]
        counts = [f"{r.steps}", f"{r.tokens:,}"] if "steps" in head else []
        lines.append(f"| {name} | " + " | ".join(counts + cells) + " |")
    counts = ["", ""] if "steps" in head else []
    lines.append(
        "| ratio ours / stock | " + " | ".join(counts + [f"{s['ratio'][k]:.3f}" for k, _ in columns]) + " |"
    )
    return "\n".join(lines)


WALL_HEAD = (
    "| | steps | tokens | step s | of which fetch s | tokens/s (steps) | loop s | of which validation s "
    "| tokens/s (loop) | startup s | wall s |"
)
CPU_HEAD = "| CPU time (user + system) | loop CPU s | tokens per loop CPU s | startup CPU s | process CPU s |"


def equivalence(runs: list[Run]) -> list[str]:
    """Lines comparing the runs' steps, tokens and losses; raises SystemExit when the step counts differ."""
    out = []
    for r in runs:
        val = ", ".join(f"{v:.4f}" for v in r.val_losses)
        out.append(
            f"{r.tool} #{r.index}: {r.threads} thread(s), {r.epochs} epochs, {r.steps} steps, {r.tokens:,} "
            f"tokens, final train loss {r.final_train_loss:.4f}, val loss by epoch [{val}]"
        )
    if len({(r.steps, r.epochs, r.tokens) for r in runs}) != 1:
        raise SystemExit("the runs differ in steps, epochs or tokens:\n" + "\n".join(out))
    return out


def load() -> str:
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


def alternate(repeat: int, threads: int, plan: Any, spec: Path, work: Path) -> tuple[list[Run], list[str]]:
    """ours, stock, stock, ours, ...: `repeat` runs of each; the runs and the load average after each."""
    (work / "run.yaml").unlink(missing_ok=True)  # the first run of ours writes the one stock reads
    runs: list[Run] = []
    loads = [load()]
    for index in range(repeat):
        for tool in ("ours", "stock") if index % 2 == 0 else ("stock", "ours"):
            if tool == "ours":
                runs.append(run_ours(index, plan, spec, work / "art", work, threads))
            else:
                runs.append(run_stock(index, work, threads))
            loads.append(load())
            print(f"{tool} #{index}: {runs[-1].wall_s:.1f} s wall, {loads[-1]}", file=sys.stderr)
    return runs, loads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--shape", choices=("tiny", "100m"), default="tiny", help="the verifier's shape (see above)"
    )
    p.add_argument("--repeat", type=int, default=3, help="runs of each tool (alternating); medians reported")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: the example's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both (OMP_NUM_THREADS)")
    default_work = Path.home() / ".cache" / "eagle3-operator" / "bench-train"
    p.add_argument("--work", type=Path, default=default_work, help="upstream outputs and scratch (kept)")
    p.add_argument("--json", type=Path, help="write every run and the summary as JSON here too")
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    from eagle3_pipeline.runtime.context import models_root
    from eagle3_pipeline.tiny.build import build

    build(models_root())  # the tiny verifier: the tiny shape's, and the 100M shape's tokenizer
    spec, art = bench_manifest(work, args.epochs, args.shape), work / "art"
    plan = upstream(spec, art)
    runs, loads = alternate(args.repeat, args.threads, plan, spec, work)
    lines, s = equivalence(runs), summary(runs)
    bf16 = os.environ.get("EAGLE3_CPU_BF16", "the CPU's flags")
    where = f"shape {args.shape}; CPU: {os.cpu_count()} cores, {args.threads} torch thread(s)"
    print(f"\n{where}; native bfloat16: {bf16}; {', '.join(loads)}\n")
    print(table(runs, s, WALL_HEAD, WALL) + "\n\n" + table(runs, s, CPU_HEAD, CPU))
    print("\n" + "\n".join(lines))
    print("\n```\n" + shlex.join([".venv/bin/python", "benchmarks/train_cpu.py", *sys.argv[1:]]) + "\n```")
    if args.json:
        doc = {"runs": [asdict(r) for r in runs], **s, "loads": loads, "threads": args.threads}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
