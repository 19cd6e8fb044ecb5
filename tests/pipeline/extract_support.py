"""Shared by the extract tests: a tiny random Llama verifier, a prepared dataset and a run manifest."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
import yaml

VOCAB = 128
HIDDEN = 32
LAYERS = 4
MAX_LEN = 64
PREPARE_OUT = "prepare/h"
EXTRACT_OUT = "extract/h"


def build_tiny_llama(path: Path, layers: int = LAYERS, hidden: int = HIDDEN, seed: int = 0) -> Path:
    """A random LlamaForCausalLM saved with save_pretrained (no tokenizer: the tests need token ids only)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4 * MAX_LEN,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def random_rows(count: int, seed: int = 0, lengths: tuple[int, int] = (4, MAX_LEN)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(*lengths))] for _ in range(count)]


def write_prepared(artifacts: Path, rows: list[list[int]], val_fraction: float = 0.2) -> Path:
    """A complete prepare output (`data/` in torch format, as the prepare stage saves it, + result.json)."""
    from datasets import Dataset

    out = artifacts / PREPARE_OUT
    n_val = max(1, int(len(rows) * val_fraction))
    dataset = Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[0] * (len(r) // 2) + [1] * (len(r) - len(r) // 2) for r in rows],
            "seq_len": [len(r) for r in rows],
            "id": [f"row-{i}" for i in range(len(rows))],
            "split": ["train"] * (len(rows) - n_val) + ["val"] * n_val,
        }
    )
    dataset.set_format("torch")
    dataset.save_to_disk(str(out / "data"))
    (out / "result.json").write_text(json.dumps({"samples": len(rows)}) + "\n")
    return out


def write_manifest(
    path: Path,
    model: Path,
    *,
    layers: list[int] | None = None,
    token_budget: int = 4 * MAX_LEN,
    dtype: str = "bfloat16",
    backend: str = "transformers",
    max_len: int = MAX_LEN,
    max_model_len: int | None = None,
) -> Path:
    extraction: dict[str, Any] = {"backend": backend, "tokenBudget": token_budget, "dtype": dtype}
    if layers is not None:
        extraction["layers"] = layers
    doc = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "tiny-extract"},
        "spec": {
            "verifier": {"model": str(model)},
            "dataset": {"source": "unused", "maxSequenceLength": max_len},
            "extraction": extraction,
            "training": {"sequenceLength": max_len},
        },
    }
    if max_model_len is not None:
        doc["spec"]["verifier"]["maxModelLen"] = max_model_len
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def stage_args(spec: Path, artifacts: Path, token_budget: int | None = None) -> list[str]:
    """`eagle3 stage extract` arguments after the stage name."""
    argv = ["--spec", str(spec), "--artifacts", str(artifacts), "--output", EXTRACT_OUT]
    argv += ["--input", f"prepare={PREPARE_OUT}"]
    if token_budget is not None:
        argv += ["--token-budget", str(token_budget)]
    return argv


def reference_hidden_states(model_dir: Path, ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """[T, L, H] float32 from running the decoder layers by hand: id i = input of layer i, n = last output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    base = model.model
    with torch.no_grad():
        x = base.embed_tokens(torch.tensor([ids]))
        positions = torch.arange(len(ids))[None]
        rope = base.rotary_emb(x, position_ids=positions)
        states = [x]  # states[i] = input of decoder layer i; states[n] = output of the last layer
        for layer in base.layers:
            out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=rope)
            x = out[0] if isinstance(out, tuple) else out
            states.append(x)
    return torch.stack([states[i][0] for i in layer_ids], dim=1)
