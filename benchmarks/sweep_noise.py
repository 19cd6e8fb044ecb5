"""The sweep's paired rounds on a quiet and on a loaded machine (issue 43): does a CPU-bound neighbour move
the measured speedup, and what would one unpaired run have said?

    python -m benchmarks.sweep_noise --draft ART/train/<hash>/checkpoints/checkpoint_best \\
        --vllm "$(bash scripts/build-vllm-cpu.sh | tail -n1)"

Two sweeps of the same cells (the tiny verifier, `--ks` at `--concurrencies`, `--prompts` held-out prompts a
round, `--rounds` rounds; evaluate's own code: eagle3_pipeline.stages.evaluate.sweep): the first on a quiet
machine, the second with `--hogs` busy-looping processes started `--load-from` of the way into its rounds and
stopped at `--load-until` (fractions of the quiet sweep's time). For each cell it prints the median ratio and
its interval in both runs, whether the loaded median lies inside the quiet interval, and the range of ratios a
single unpaired run could have reported during the loaded sweep (any draft round over any baseline round of
that cell): what one sample per arm, measured at different times, would have decided from.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.stages import Stage
from eagle3_pipeline.data.conversations import prompt_of
from eagle3_pipeline.data.draft_checkpoint import write_serving_checkpoint
from eagle3_pipeline.runtime.context import StageContext, models_root
from eagle3_pipeline.stages.evaluate.rounds import Arm
from eagle3_pipeline.stages.evaluate.sweep import SpeculationSweep


def spec(ks: list[int], concurrencies: list[int], prompts: int, rounds: int) -> dict[str, Any]:
    return {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "sweep-noise"},
        "spec": {
            "verifier": {"model": "/models/tiny-llama", "maxModelLen": 1024},
            "dataset": {"source": "/models/datasets/tiny-chat.jsonl", "maxSequenceLength": 512},
            "evaluation": {
                "prompts": prompts,
                "maxTokens": 128,
                "rounds": rounds,
                "sweep": {"numSpeculativeTokens": ks, "prompts": prompts},
                "concurrencies": concurrencies,
            },
        },
    }


def held_out(count: int) -> list[list[dict[str, str]]]:
    """The tiny dataset's last `count` conversations' prompts (its tail: the split's held-out side)."""
    rows = (models_root() / "datasets" / "tiny-chat.jsonl").read_text().splitlines()
    found = [prompt_of(json.loads(line)["messages"]) for line in reversed(rows)]
    return [p for p in found if p is not None][:count]


def busy() -> None:
    while True:
        pass


class Hogs:
    """`n` busy-looping processes between two moments."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []  # type: ignore[var-annotated]

    def start(self) -> None:
        self.procs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join()


class Recording(SpeculationSweep):
    """The sweep, keeping every arm's rounds for the unpaired counterfactual."""

    kept: list[tuple[int, Arm, Arm]]

    def record(self, k: int, alone: Arm, drafted: Arm) -> None:
        self.kept = [*getattr(self, "kept", []), (k, alone, drafted)]
        super().record(k, alone, drafted)


def sweep(args: argparse.Namespace, draft: Path, work: Path) -> tuple[Recording, float]:
    doc = spec(args.ks, args.concurrencies, args.prompts, args.rounds)
    work.mkdir(parents=True, exist_ok=True)
    manifest = work / "run.yaml"
    manifest.write_text(json.dumps(doc))
    m = load_manifest(manifest)
    ctx = StageContext.of_spec(Stage.EVALUATE, m.name, m.spec, work, work / "out")
    (work / "out").mkdir(parents=True, exist_ok=True)
    plan = SpeculationSweep.plan(ctx, held_out(args.prompts))  # type: ignore[arg-type]
    ks = sorted(set(args.ks))
    s = Recording(ctx, plan, ks, args.prompts)  # type: ignore[arg-type]
    started = time.monotonic()
    s.run(draft)
    return s, time.monotonic() - started


def report(quiet: Recording, loaded: Recording) -> list[dict[str, Any]]:
    rows = []
    for q, cell in zip(quiet.table().cells, loaded.table().cells, strict=True):
        assert q.comparison is not None and cell.comparison is not None
        (_, alone, drafted) = next(x for x in loaded.kept if x[0] == cell.num_speculative_tokens)
        c = cell.concurrency
        unpaired = [d / b for d in drafted.speeds[c] if d for b in alone.speeds[c] if b]
        rows.append(
            {
                "k": cell.num_speculative_tokens,
                "concurrency": c,
                "quiet": q.comparison.text(),
                "loaded": cell.comparison.text(),
                "inside": q.comparison.low <= cell.comparison.ratio <= q.comparison.high,
                "unpaired": [round(min(unpaired), 2), round(max(unpaired), 2)],
                "baselineRoundsLoaded": [round(v, 1) for v in alone.speeds[c] if v],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draft", type=Path, required=True, help="a trained draft checkpoint directory")
    parser.add_argument("--vllm", help="vLLM's executable (default $EAGLE3_VLLM)")
    parser.add_argument("--ks", type=int, nargs="+", default=[3])
    parser.add_argument("--concurrencies", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--load-from", type=float, default=0.3)
    parser.add_argument("--load-until", type=float, default=0.7)
    args = parser.parse_args()
    if args.vllm:
        os.environ["EAGLE3_VLLM"] = args.vllm
    os.environ.setdefault("EAGLE3_MODELS_ROOT", str(models_root()))  # /models: the tiny verifier's cache
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        draft = write_serving_checkpoint(args.draft, work / "draft", "/models/tiny-llama").path
        quiet, seconds = sweep(args, draft, work / "quiet")
        hogs = Hogs(args.hogs)
        timers = [
            threading.Timer(args.load_from * seconds, hogs.start),
            threading.Timer(args.load_until * seconds, hogs.stop),
        ]
        for t in timers:
            t.start()
        try:
            loaded, loaded_seconds = sweep(args, draft, work / "loaded")
        finally:
            for t in timers:
                t.cancel()
            hogs.stop()
    out = {
        "quietSeconds": round(seconds, 1),
        "loadedSeconds": round(loaded_seconds, 1),
        "cells": report(quiet, loaded),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
