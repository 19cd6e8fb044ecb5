"""Writing Eagle3Run manifests and running stage programs in tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def write_manifest(path: Path, spec: dict[str, Any], name: str = "t") -> Path:
    doc = {"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Run", "metadata": {"name": name}, "spec": spec}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def base_spec(model: Path, source: Path, **dataset: Any) -> dict[str, Any]:
    return {
        "verifier": {"model": str(model)},
        "dataset": {"source": str(source), "maxSequenceLength": 256, **dataset},
        "extraction": {"backend": "transformers", "layers": [1], "tokenBudget": 512},
        "draft": {"vocabSize": 32},
        "training": {"sequenceLength": 256},
    }


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def chat(i: int, turns: int = 1) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"count {i} {t}"})
        words = " ".join(str(i * 7 + k) for k in range(1 + (i + t) % 5))
        messages.append({"role": "assistant", "content": f"one two three {words}"})
    return {"messages": messages}
