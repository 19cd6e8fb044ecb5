"""Online against offline hidden states on CPU: training speed, bytes on the volume, producer throughput.

    .venv/bin/python benchmarks/online_cpu.py --vllm PATH/bin/vllm [--epochs 2] [--work DIR] [--json out.json]

The tiny example (`examples/tiny/eagle3run.yaml`, the tiny verifier of `eagle3 tiny`) with regeneration off,
run twice by the local runner up to the train stage, into one artifacts directory (prepare and vocab are
shared; each run's train output is removed first, so both train):

- offline: the extract stage (transformers backend) stores every sample, then train reads the files;
- online (`extraction.mode: online`, volume transfer): `eagle3 run` starts one producer (`eagle3 produce`:
  vLLM CPU with `extract_hidden_states`) and train asks it for every sample, every epoch.

Reported per mode: the train stage's own figures (train tokens/s over its steps, the epochs' seconds), the
train stage's wall time, the bytes the mode leaves stored on the volume (offline: extract's output; online:
what is left under `hidden-states/`), the largest staging directory seen while training (polled every 0.2 s)
and, online, the hidden-state bytes moved: the producer's prompt tokens (vLLM's own counter,
`vllm:prompt_tokens_total` on its /metrics, read just before training ends) x the bytes per token of the
files (4 layers x hidden x 2 + the token id). Then the producer's own throughput: `eagle3 produce` alone,
sent every row of the dataset with speculators' async client at concurrency 1 and 8; samples/s, tokens/s
and MB/s of hidden states (each file read back and deleted, as the trainer does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"
PRODUCER_LINE = re.compile(r"hidden-state producer on (http://\S+/v1)")


def manifest(work: Path, epochs: int, mode: str) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = f"bench-{mode}"
    doc["spec"]["regeneration"]["enabled"] = False
    doc["spec"]["training"]["epochs"] = epochs
    doc["spec"]["extraction"]["mode"] = mode
    path = work / f"bench-{mode}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def prompt_tokens(endpoint: str) -> float | None:
    import httpx

    try:
        text = httpx.get(endpoint.removesuffix("/v1") + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prompt_tokens_total")
    ]
    return sum(values) if values else None


class Watch(threading.Thread):
    """Polls the staging directory's size and the producer's token counter while the run goes on."""

    def __init__(self, art: Path, stderr: Path) -> None:
        super().__init__(daemon=True)
        self.art, self.stderr, self.stop = art, stderr, threading.Event()
        self.peak_staging, self.tokens, self.endpoint = 0, 0.0, ""

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.peak_staging = max(self.peak_staging, dir_bytes(self.art / "hidden-states"))
            if not self.endpoint and self.stderr.exists():
                found = PRODUCER_LINE.search(self.stderr.read_text(errors="replace"))
                self.endpoint = found.group(1) if found else ""
            if self.endpoint:
                self.tokens = prompt_tokens(self.endpoint) or self.tokens


def run_mode(mode: str, spec: Path, art: Path, vllm: str, models: Path) -> dict[str, Any]:
    shutil.rmtree(art / "train", ignore_errors=True)
    log = art.parent / f"{mode}.log"
    argv = [sys.executable, "-m", "eagle3_cli", "run", str(spec), "--artifacts", str(art), "--until", "train"]
    argv += ["--models", str(models), "--vllm", vllm]
    watch = Watch(art, log)
    watch.start()
    started = time.monotonic()
    with log.open("w") as err:
        code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=err, check=False).returncode
    watch.stop.set()
    watch.join()
    if code != 0:
        sys.exit(f"{mode} run failed ({code}); see {log}")
    [result_file] = (art / "train").glob("*/result.json")
    result = json.loads(result_file.read_text())
    extract = next((art / "extract").glob("*/"), None) if mode == "offline" else None
    return {
        "mode": mode,
        "runSeconds": round(time.monotonic() - started, 1),
        "trainTokensPerSecond": result["trainTokensPerSecond"],
        "trainTokens": sum(e["trainTokens"] for e in result["epochs"]),
        "epochSeconds": [round(e["seconds"], 1) for e in result["epochs"]],
        "storedBytes": dir_bytes(extract) if extract else dir_bytes(art / "hidden-states"),
        "peakStagingBytes": watch.peak_staging,
        "producerPromptTokens": watch.tokens,
        "estimatedAcceptanceLength": result.get("estimatedAcceptanceLength"),
    }


async def hammer(endpoint: str, rows: list[list[int]], concurrency: int) -> dict[str, float]:
    import openai
    from hs_connectors import FileTransfer
    from speculators.data_generation.vllm_client import generate_hidden_states_async

    client = openai.AsyncOpenAI(base_url=endpoint, api_key="EMPTY")
    model = (await client.models.list()).data[0].id
    transfer, gate = FileTransfer(Path("/nonexistent")), asyncio.Semaphore(concurrency)
    moved = 0

    async def one(ids: list[int]) -> None:
        nonlocal moved
        async with gate:
            handle, params = await generate_hidden_states_async(client, model, {"input_ids": ids})
            sample = await asyncio.to_thread(transfer.get_generated, params)
            assert sample is not None
            moved += sum(t.numel() * t.element_size() for t in sample.values())
            transfer.delete(handle)

    started = time.monotonic()
    await asyncio.gather(*(one(ids) for ids in rows))
    seconds = time.monotonic() - started
    tokens = sum(len(r) for r in rows)
    return {
        "concurrency": concurrency,
        "samplesPerSecond": round(len(rows) / seconds, 2),
        "tokensPerSecond": round(tokens / seconds, 1),
        "megabytesPerSecond": round(moved / seconds / 1e6, 2),
    }


def producer_throughput(spec: Path, art: Path, vllm: str, models: Path) -> list[dict[str, float]]:
    import datasets

    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.online import ENV_HIDDEN_STATES_ENDPOINT
    from eagle3_pipeline.local.producers import LocalProducers
    from eagle3_pipeline.local.run import LocalOptions, stage_env

    [data] = (art / "prepare").glob("*/data")
    rows = [list(r) for r in datasets.load_from_disk(str(data)).with_format(None)["input_ids"]]
    run = load_manifest(spec)
    env = stage_env(LocalOptions(artifacts=art, models=models, vllm=vllm))
    with LocalProducers(run.spec, spec, art, env) as online:
        endpoint = online[ENV_HIDDEN_STATES_ENDPOINT]
        return [asyncio.run(hammer(endpoint, rows, c)) for c in (1, 8)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm", required=True, help="vLLM CPU's bin/vllm (scripts/build-vllm-cpu.sh prints it)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "eagle3-operator" / "bench-online")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from eagle3_pipeline.runtime.context import models_root
    from eagle3_pipeline.tiny.build import build

    models = models_root()
    build(models)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    art = work / "art"
    runs = [
        run_mode(m, manifest(work, args.epochs, m), art, args.vllm, models) for m in ("offline", "online")
    ]
    per_token = 4 * 128 * 2 + 8  # the tiny verifier's files: 4 layers x hidden 128 x bf16, and the token id
    runs[1]["movedBytes"] = int(runs[1]["producerPromptTokens"] * per_token)
    producer = producer_throughput(work / "bench-online.yaml", art, args.vllm, models)
    ratio = runs[1]["trainTokensPerSecond"] / runs[0]["trainTokensPerSecond"]
    print(
        json.dumps(
            {"runs": runs, "producer": producer, "onlineOverOfflineTokensPerSecond": round(ratio, 3)},
            indent=2,
        )
    )
    print(f"load average: {os.getloadavg()}")
    print("```\n" + shlex.join([".venv/bin/python", "benchmarks/online_cpu.py", *sys.argv[1:]]) + "\n```")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": runs, "producer": producer, "ratio": ratio}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
