"""prepare on CPU against speculators' own `prepare-data` on the same rows: tokens per second, masks compared.

    .venv/bin/python benchmarks/prepare_cpu.py [--rows 4000] [--vllm PATH] [--workers 2] [--seq-length 512]

speculators masks natural-language conversations only through a vLLM server's `/v1/chat/completions/render`
endpoint, so both are measured with one: the tiny verifier (`eagle3 tiny`) served by vLLM on CPU, and this
project's prepare (the verifier's chat template, rendered locally). The rows are the tiny example dataset
repeated with fresh ids up to `--rows`. Reported: rows, tokens, wall seconds of each tool's processing (server
start and imports excluded for speculators; `eagle3 stage prepare` is timed as a whole process and by its own
tokenization timer), tokens per second, and how many rows both tools tokenized identically (ids and mask).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def rows_file(src: Path, out: Path, n: int) -> tuple[Path, Path]:
    base = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    ours, theirs = out / "rows.jsonl", out / "rows-speculators.jsonl"
    with ours.open("w") as a, theirs.open("w") as b:
        for i in range(n):
            messages = [
                {k: v for k, v in m.items() if k != "reasoning_content"}
                for m in base[i % len(base)]["messages"]
            ]
            a.write(json.dumps({"id": f"r{i}", "messages": messages}) + "\n")
            b.write(json.dumps({"conversations": messages}) + "\n")
    return ours, theirs


def manifest(path: Path, model: Path, source: Path, seq: int) -> Path:
    spec = {
        "verifier": {"model": str(model), "maxModelLen": 1024},
        "dataset": {"source": str(source), "maxSequenceLength": seq, "validationFraction": 0.0},
        "training": {"sequenceLength": seq},
        "extraction": {"tokenBudget": max(seq, 8192)},
    }
    doc = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "bench"},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def run_ours(run: Path, art: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "eagle3_cli", "stage", "prepare", "--spec", str(run)]
    cmd += ["--artifacts", str(art), "--output", "prepare/bench"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.monotonic() - t0
    result: dict[str, Any] = json.loads((art / "prepare" / "bench" / "result.json").read_text())
    return {"wall": wall, **result}


def run_theirs(model: Path, rows: Path, out: Path, seq: int, workers: int, vllm: str) -> dict[str, Any]:
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.stages import Stage
    from eagle3_contract.vllm_command import VllmEngine
    from eagle3_pipeline.runtime.context import StageContext
    from eagle3_pipeline.serving.vllm_server import VllmServer

    spec = load_manifest(manifest(out / "serve.yaml", model, rows, seq)).spec
    ctx = StageContext.of_spec(Stage.GENERATE, "bench", spec, out, out / "server", token_budget=8192)
    ctx.begin()
    os.environ["EAGLE3_VLLM"] = vllm
    engine = VllmEngine.of(spec.verifier)
    serve = VllmServer(ctx, engine, seed=spec.dataset.seed, extra_args=["--enable-scale-out"])
    with serve as server:  # serves the render endpoint
        cmd = [str(Path(sys.executable).parent / "speculators"), "prepare-data", "--model", str(model)]
        cmd += ["--data", str(rows), "--output", str(out / "speculators"), "--seq-length", str(seq)]
        cmd += ["--render-endpoint", server.root_url, "--num-preprocessing-workers", str(workers)]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
    if proc.returncode:
        raise SystemExit(f"speculators prepare-data failed:\n{proc.stderr[-3000:]}")
    return {"wall": wall, "serverStart": server.started_s}


def _runs(mask: list[int]) -> int:
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def _runs(mask: list[int]) -> int:
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))


def compare(ours: Path, theirs: Path) -> dict[str, Any]:
    import datasets

    a = datasets.load_from_disk(str(ours)).with_format(None)
    b = datasets.load_from_disk(str(theirs)).with_format(None)
    masks = {tuple(r["input_ids"]): r["loss_mask"] for r in b}
    same_ids = sum(1 for r in a if tuple(r["input_ids"]) in masks)
    same = sum(1 for r in a if masks.get(tuple(r["input_ids"])) == list(r["loss_mask"]))
    single = [r for r in a if _runs(r["loss_mask"]) == 1]
    same_single = sum(1 for r in single if masks.get(tuple(r["input_ids"])) == list(r["loss_mask"]))
    return {
        "rows": len(a),
        "theirRows": len(b),
        "sameIds": same_ids,
        "sameIdsAndMask": same,
        "singleTurn": len(single),
        "sameSingleTurn": same_single,
        "theirTokens": sum(len(r["input_ids"]) for r in b),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--vllm", default=os.environ.get("EAGLE3_VLLM", "vllm"))
    parser.add_argument("--models", type=Path, default=None)
    args = parser.parse_args()
    from eagle3_pipeline.runtime.context import models_root

    root = models_root(str(args.models) if args.models else None)
    model, src = root / "tiny-llama", root / "datasets" / "tiny-chat.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        ours_rows, their_rows = rows_file(src, out, args.rows)
        ours = run_ours(manifest(out / "run.yaml", model, ours_rows, args.seq_length), out / "art")
        theirs = run_theirs(model, their_rows, out, args.seq_length, args.workers, args.vllm)
        cmp = compare(out / "art" / "prepare" / "bench" / "data", out / "speculators")
    print("| tool | rows | tokens | seconds | tokens/s |\n| --- | --- | --- | --- | --- |")
    print(
        f"| eagle3 prepare (tokenization) | {ours['samples']} | {ours['tokens']} | "
        f"{ours['tokenizeSeconds']:.2f} | {ours['tokensPerSecond']:,.0f} |"
    )
    print(
        f"| eagle3 prepare (whole process) | {ours['samples']} | {ours['tokens']} | {ours['wall']:.2f} | "
        f"{ours['tokens'] / ours['wall']:,.0f} |"
    )
    print(
        f"| speculators prepare-data (render endpoint, {args.workers} workers) | {cmp['theirRows']} | "
        f"{cmp['theirTokens']} | {theirs['wall']:.2f} | {cmp['theirTokens'] / theirs['wall']:,.0f} |"
    )
    print(
        f"\nrows with identical input_ids: {cmp['sameIds']}/{cmp['rows']}; identical ids + loss mask: "
        f"{cmp['sameIdsAndMask']}/{cmp['rows']} "
        f"(single-turn rows: {cmp['sameSingleTurn']}/{cmp['singleTurn']}; "
        "speculators writes one row per assistant turn, masking only that turn); "
        f"vLLM started in {theirs['serverStart']:.0f} s (not counted)"
    )


if __name__ == "__main__":
    main()
