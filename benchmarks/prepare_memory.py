"""prepare's peak memory against the dataset's size: `eagle3 stage prepare` on JSON Lines of N MB.

    .venv/bin/python benchmarks/prepare_memory.py [--sizes 50,200] [--row-bytes 1000] [--models DIR]

The rows are the tiny example's conversations (`eagle3 tiny` builds them) with fresh ids, each assistant
turn repeated up to about `--row-bytes` bytes per row, written until the file holds N MB; the verifier is the
tiny one (its tokenizer and chat template). Each size runs `eagle3 stage prepare` as its own process (one
size per run of this script: ru_maxrss is the largest child's). Reported per size: rows, file MB, the peak
resident memory (ru_maxrss, which counts the pages of the Arrow files it memory-maps), the peak anonymous
memory (RssAnon, sampled), anonymous over file size, wall seconds, and the samples prepare wrote.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

MB = 1 << 20


def write_rows(src: Path, out: Path, megabytes: int, row_bytes: int) -> int:
    base = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    rows, size = 0, 0
    with out.open("w", encoding="utf-8") as f:
        while size < megabytes * MB:
            messages = []
            for m in base[rows % len(base)]["messages"]:
                content = m["content"]
                if m["role"] == "assistant":
                    content = " ".join([content] * max(1, row_bytes // max(1, len(content) * 2)))
                messages.append({"role": m["role"], "content": content})
            line = json.dumps({"id": f"r{rows}", "messages": messages}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            rows += 1
    return rows


def manifest(path: Path, model: Path, source: Path) -> Path:
    spec = {
        "verifier": {"model": str(model), "maxModelLen": 1024},
        "dataset": {"source": str(source), "maxSequenceLength": 1024, "validationFraction": 0.05},
        "training": {"sequenceLength": 1024},
    }
    doc = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "mem"},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def measure(run: Path, art: Path) -> dict[str, Any]:
    """Runs prepare; its peak resident memory (ru_maxrss: what `time -v` reports, the Arrow files it maps
    included) and the peak of its anonymous memory (RssAnon, sampled every 0.1 s: what no reclaim frees)."""
    cmd = [sys.executable, "-m", "eagle3_cli", "stage", "prepare", "--spec", str(run)]
    cmd += ["--artifacts", str(art), "--output", "prepare/mem"]
    started = time.monotonic()
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr)
        anon_kb = 0
        while child.poll() is None:
            anon_kb = max(anon_kb, _rss_anon_kb(child.pid))
            time.sleep(0.1)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.monotonic() - started
        if child.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"prepare failed:\n{stderr.read().decode(errors='replace')[-3000:]}")
    result: dict[str, Any] = json.loads((art / "prepare" / "mem" / "result.json").read_text())
    return {
        "peakMB": usage.ru_maxrss / 1024,
        "anonMB": anon_kb / 1024,
        "wall": wall,
        "samples": result["samples"],
    }


def _rss_anon_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="50,200", help="dataset sizes in MB, comma-separated")
    parser.add_argument("--row-bytes", type=int, default=1000)
    parser.add_argument("--models", type=Path, default=None)
    args = parser.parse_args()
    from eagle3_pipeline.runtime.context import models_root

    root = models_root(str(args.models) if args.models else None)
    model, src = root / "tiny-llama", root / "datasets" / "tiny-chat.jsonl"
    print("| file MB | rows | samples | peak RSS MB | peak anonymous MB | anonymous / file | wall s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            rows = write_rows(src, out / "rows.jsonl", size, args.row_bytes)
            file_mb = (out / "rows.jsonl").stat().st_size / MB
            got = measure(manifest(out / "run.yaml", model, out / "rows.jsonl"), out / "art")
        print(
            f"| {file_mb:.0f} | {rows} | {got['samples']} | {got['peakMB']:.0f} | {got['anonMB']:.0f} | "
            f"{got['anonMB'] / file_mb:.1f}x | {got['wall']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
