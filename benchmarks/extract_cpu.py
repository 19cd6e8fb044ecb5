"""Hidden-state extraction on CPU with the transformers backend: tokens per second and bytes per token.

    .venv/bin/python benchmarks/extract_cpu.py [--models tiny 50m] [--dtypes bfloat16 fp8]
        [--token-budget 4096] [--samples 256] [--min-len 64] [--max-len 512] [--threads N] [--repeat 3]
        [--json out.json]

For each verifier (random Llama weights: `tiny` is 4 layers x hidden 64, `50m` is 8 layers x hidden 512 with
a 32k vocabulary, about 60M parameters) and storage dtype, a prepared dataset of random rows is written and
`eagle3 stage extract` runs in this process, `--repeat` times (fresh outputs; the median run is reported).
Reported: the extraction loop's tokens per second (forward passes, fp8 quantization and file writes; model
loading excluded), the stage's wall time, and the bytes per token of the files written (hidden states of
len(aux) + 1 layers plus the int64 token id and safetensors headers).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import random
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from eagle3_pipeline.stage_main import run_stage

INPUT = "prepare=prepare/bench"
# name -> (layers, hidden, intermediate, heads, kv heads, vocab, aux layers)
MODELS: dict[str, tuple[int, int, int, int, int, int, list[int]]] = {
    "tiny": (4, 64, 128, 4, 2, 1000, [1, 2]),
    "50m": (8, 512, 1536, 8, 4, 32000, [2, 4, 5]),
}


@dataclass
class Row:
    model: str
    params_m: float
    layers: str
    hidden: int
    dtype: str
    budget: int
    samples: int
    tokens: int
    tokens_per_s: float
    bytes_per_token: float
    extract_s: float
    wall_s: float


def build_model(name: str, path: Path) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, inter, heads, kv, vocab, _ = MODELS[name]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=8192,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters()) / 1e6


def write_dataset(root: Path, vocab: int, samples: int, lengths: tuple[int, int]) -> None:
    from datasets import Dataset

    rng = random.Random(0)
    rows = [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(samples)]
    data = Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[1] * len(r) for r in rows],
            "seq_len": [len(r) for r in rows],
            "id": [str(i) for i in range(samples)],
            "split": ["train"] * samples,
        }
    )
    data.set_format("torch")
    data.save_to_disk(str(root / "prepare/bench/data"))
    (root / "prepare/bench/result.json").write_text("{}\n")


def write_manifest(path: Path, model: Path, aux: list[int], dtype: str, budget: int, max_len: int) -> Path:
    doc = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "bench-extract"},
        "spec": {
            "verifier": {"model": str(model)},
            "dataset": {"source": "random", "maxSequenceLength": max_len},
            "extraction": {"backend": "transformers", "layers": aux, "tokenBudget": budget, "dtype": dtype},
            "training": {"sequenceLength": max_len},
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def measure(name: str, dtype: str, args: argparse.Namespace, model: Path, root: Path, params_m: float) -> Row:
    """One `eagle3 stage extract` run in this process; `root` is the artifacts directory."""
    layers, hidden, *_, aux = MODELS[name]
    spec = write_manifest(root / f"{name}-{dtype}.yaml", model, aux, dtype, args.token_budget, args.max_len)
    runs: list[tuple[dict[str, Any], float]] = []
    for attempt in range(args.repeat):
        output = f"extract/{name}-{dtype}-{attempt}"
        started = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):  # the stage prints its result JSON
            code = run_stage("extract", str(spec), str(root), output, [INPUT], args.token_budget)
        wall = time.monotonic() - started
        if code != 0:
            raise SystemExit(f"extract failed for {name} {dtype} (exit code {code})")
        runs.append((json.loads((root / output / "result.json").read_text()), wall))
        shutil.rmtree(root / output)
    runs.sort(key=lambda run: float(run[0]["tokensPerSecond"]))
    result, wall = runs[len(runs) // 2]
    return Row(
        model=name,
        params_m=round(params_m, 1),
        layers=f"{[*aux, layers]}",
        hidden=hidden,
        dtype=dtype,
        budget=args.token_budget,
        samples=result["samples"],
        tokens=result["tokens"],
        tokens_per_s=result["tokensPerSecond"],
        bytes_per_token=result["bytesPerToken"],
        extract_s=result["extractSeconds"],
        wall_s=round(wall, 1),
    )


def table(rows: list[Row]) -> str:
    head = (
        "| verifier | params (M) | layers stored | hidden | dtype | token budget | samples | tokens "
        "| tokens/s | bytes/token | extract s | stage wall s |"
    )
    lines = [head, "|" + " --- |" * 12]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.params_m} | {r.layers} | {r.hidden} | {r.dtype} | {r.budget} | {r.samples} "
            f"| {r.tokens} | {r.tokens_per_s:,.0f} | {r.bytes_per_token} | {r.extract_s} | {r.wall_s} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["tiny", "50m"])
    p.add_argument("--dtypes", nargs="+", choices=["bfloat16", "float16", "fp8"], default=["bfloat16", "fp8"])
    p.add_argument("--token-budget", type=int, default=4096)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration; the median is reported")
    p.add_argument("--json", type=Path, help="write the rows as JSON here too")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="extract-bench-") as tmp:
        root = Path(tmp)
        for name in args.models:
            model, artifacts = root / name / "model", root / name / "artifacts"
            params_m = build_model(name, model)
            write_dataset(artifacts, MODELS[name][5], args.samples, (args.min_len, args.max_len))
            for dtype in args.dtypes:
                rows.append(measure(name, dtype, args, model, artifacts, params_m))
    print(f"\nCPU: {torch.get_num_threads()} torch threads, torch {torch.__version__}\n")
    print(table(rows))
    print("\n```\n" + shlex.join([".venv/bin/python", "benchmarks/extract_cpu.py", *sys.argv[1:]]) + "\n```")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
