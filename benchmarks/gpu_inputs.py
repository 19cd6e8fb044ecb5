"""`gpu_pipeline.py`'s inputs and device helpers: the random-weight verifier, the prepared rows of random
tokens sized for a number of training steps, the benchmark's manifest, the forward-only extraction rate, and
the CUDA allocator's peak."""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from gpu_roofline import LlamaShape

if TYPE_CHECKING:
    import torch

VAL_FRACTION = 0.05
PACKING = 0.9  # assumed fill of speculators' packed training rows, to size the dataset for --steps


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


def write_data(prepare: Path, vocab: int, train: int, val: int, lengths: tuple[int, int]) -> dict[str, Any]:
    """A prepare output of random rows in `prepare`, written with the prepare stage's own functions."""
    import torch

    from eagle3_pipeline.data.masking import Tokenized
    from eagle3_pipeline.data.prepared import DATA_DIR, TOKEN_FREQ_FILE, TRAIN, VAL, Figures, save_dataset

    rng = random.Random(0)
    rows = []
    for i in range(train + val):
        n = rng.randint(*lengths)
        ids = [rng.randrange(vocab) for _ in range(n)]
        rows.append(
            (
                {"id": str(i), "split": TRAIN if i < train else VAL},
                Tokenized(ids, [0] * (n // 4) + [1] * (n - n // 4)),
            )
        )
    figures = Figures()
    for conv, tokenized in rows:
        figures.add(conv["split"], tokenized)
    out = prepare
    save_dataset(
        out / DATA_DIR,
        (
            {**conv, "input_ids": t.input_ids, "loss_mask": t.loss_mask, "seq_len": len(t.input_ids)}
            for conv, t in rows
        ),
    )
    torch.save(dict(figures.frequencies), out / TOKEN_FREQ_FILE)
    tokens = figures.tokens
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


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def release(device: torch.device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def forward_rate(
    model_dir: Path, prepare: Path, shape: LlamaShape, budget: int, device: torch.device
) -> float:
    """Tokens/s of the extractor's forward passes (layer capture included) over the stage's batches."""
    from eagle3_pipeline.data.hidden_states import Layout, plan_batches
    from eagle3_pipeline.data.verifier import LocalVerifier
    from eagle3_pipeline.stages.extract import transformers_backend as tf
    from eagle3_pipeline.stages.extract.rows import PreparedRows

    rows = PreparedRows.load(prepare, shape.vocab)
    layout = Layout(shape.aux_layers, shape.layers, shape.hidden, "bfloat16")
    batches = [rows.token_ids(b) for b in plan_batches(list(enumerate(rows.seq_lens)), budget)]
    extractor = tf.TransformersExtractor(
        tf.load_verifier(LocalVerifier(str(model_dir), None, False), device), layout
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


def peak_reset(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: torch.device) -> int | None:
    import torch

    return torch.cuda.max_memory_allocated() if device.type == "cuda" else None


def gib(value: int | None) -> float | None:
    return round(value / 2**30, 3) if value is not None else None
