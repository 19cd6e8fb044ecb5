"""A draft's next generation on this machine, end to end: serve, capture shifted traffic, retrain, compare.

    EAGLE3_VLLM="$(bash scripts/build-vllm-cpu.sh | tail -n1)" .venv/bin/python -m benchmarks.retrain_loop

1. `eagle3 run` the tiny example (without its sweep: a fixed k of 3), in --artifacts (reused when done).
2. Serve its exported draft on vLLM CPU with capture on (every request recorded, as a serving pod records
   with sampleRate 1) and send --requests requests drawn from a shifted mix of the tiny corpus's tasks
   (--tasks, by default spell, reverse and letters only), greedy, --tokens tokens at most, 4 in flight. The
   server's own speculative-decoding counters over them give the live acceptance.
3. `eagle3 run --retrain <the capture directory>`: generation 2 from those records, mixed with the run's data
   (--original-ratio), warm-started from the draft, evaluated beside it (evaluation.incumbent).
4. Fresh requests of the same shifted mix (another seed), sent to the serving draft and to generation 2's in
   turn on servers of their own: the acceptance each reaches on traffic neither trained on.

Prints each figure, the ratio of the two drafts' acceptance on the fresh traffic, and the generation's
evaluate line (both drafts on its held-out captured and original prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml
from tests.pipeline.capture_support import MODEL, server

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.api.spec import ExportedDraft
from eagle3_contract.generation import Generation, plan_generation
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.runtime.context import models_root
from eagle3_pipeline.serving.requests import read_counters, settled_counters
from eagle3_pipeline.serving.spec_metrics import Acceptance
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.tiny.tasks import TASKS, task_kind

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"


def manifest(path: Path) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["evaluation"].pop("sweep", None)
    doc["spec"]["evaluation"].pop("concurrencies", None)
    doc["spec"]["serving"]["speculationLength"] = "fixed"
    path.write_text(yaml.safe_dump(doc))
    return path


def eagle3_run(file: Path, art: Path, vllm: str, *extra: str) -> None:
    argv = [sys.executable, "-m", "eagle3_cli", "run", str(file), "--artifacts", str(art), "--vllm", vllm]
    argv += ["--models", str(models_root()), *extra]
    started = time.monotonic()
    subprocess.run(argv, check=True, cwd=ROOT)
    print(f"eagle3 run {' '.join(extra) or ''}: {time.monotonic() - started:.0f} s", flush=True)


def shifted(kinds: list[str], n: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    tasks = [task for task, _ in TASKS if task_kind(task) in kinds]
    return [[{"role": "user", "content": rng.choice(tasks)(rng).request}] for _ in range(n)]


def answer(base: str, messages: list[dict[str, str]], tokens: int) -> None:
    body = {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0.0}
    httpx.post(f"{base}/chat/completions", json=body, timeout=600).raise_for_status()


def acceptance(srv: VllmServer, prompts: list[list[dict[str, str]]], tokens: int) -> Acceptance:
    """The server's acceptance over answering `prompts` (its counters' difference), 4 in flight."""
    before = read_counters(srv)
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda m: answer(srv.base_url, m, tokens), prompts))
    after = settled_counters(srv, before, 1)
    return Acceptance.from_counters(after - before if before is not None else after)


def served(name: str, draft: Path, work: Path, capture: Path | None, run: Any) -> Any:
    srv = server(name, draft, work, capture, segment_seconds=1.0)
    with srv:
        return run(srv)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifacts", type=Path, default=Path(tempfile.gettempdir()) / "eagle3-retrain-loop")
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--fresh", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tasks", default="spell,reverse,letters")
    parser.add_argument("--original-ratio", default="1.0")
    parser.add_argument("--epochs", default="3")
    args = parser.parse_args()
    vllm = os.environ["EAGLE3_VLLM"]
    art, kinds = args.artifacts, args.tasks.split(",")
    art.mkdir(parents=True, exist_ok=True)
    file = manifest(art / "run.yaml")
    eagle3_run(file, art, vllm)
    spec = load_manifest(file).spec
    export = next(p for p in plan_stages(spec) if p.stage is Stage.EXPORT).output_dir
    capture, work = art / "capture", art / "servers"
    live = served(
        "before",
        art / export,
        work,
        capture,
        lambda s: acceptance(s, shifted(kinds, args.requests, 1), args.tokens),
    )
    time.sleep(2)  # the last segment is written
    records = sum(1 for p in capture.glob("*/*.jsonl") for _ in p.open())
    print(
        f"live acceptance length of the serving draft on {kinds}: {live.length:.3f} "
        f"({records} records captured)"
    )
    eagle3_run(
        file,
        art,
        vllm,
        "--retrain",
        str(capture),
        "--original-ratio",
        args.original_ratio,
        "--epochs",
        args.epochs,
    )
    gen = Generation(
        2,
        str(capture.resolve()),
        ExportedDraft(path=export),
        original_ratio=float(args.original_ratio),
        epochs=int(args.epochs),
    )
    plans = {p.stage: p for p in plan_generation(spec, gen)}
    evaluate = json.loads((art / plans[Stage.EVALUATE].output_dir / "result.json").read_text())
    print(
        "generation 2's evaluate:", json.dumps(evaluate["incumbent"] | {"new": evaluate["acceptanceLength"]})
    )
    fresh = shifted(kinds, args.fresh, 2)
    old = served("serving", art / export, work, None, lambda s: acceptance(s, fresh, args.tokens))
    new = served(
        "generation-2",
        art / plans[Stage.EXPORT].output_dir,
        work,
        None,
        lambda s: acceptance(s, fresh, args.tokens),
    )
    print(
        f"fresh shifted traffic ({args.fresh} requests): serving {old.length:.3f}, "
        f"generation 2 {new.length:.3f}, ratio {new.length / old.length:.3f}"
    )


if __name__ == "__main__":
    main()
