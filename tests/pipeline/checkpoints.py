"""A bfloat16 copy of a float32 checkpoint, as real checkpoints ship (issue 30: the CPU path had only met the
tiny verifier's float32 weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def bfloat16_copy(source: Path, target: Path) -> Path:
    """`source` (a Hugging Face checkpoint directory) copied to `target` with every floating-point weight in
    bfloat16 and its config saying so; the tokenizer and the other files as they are."""
    shutil.copytree(source, target)
    for weights in target.glob("*.safetensors"):
        tensors = load_file(weights)
        converted = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}
        save_file(converted, weights, metadata={"format": "pt"})
    config_path = target / "config.json"
    config = json.loads(config_path.read_text())
    config |= {key: "bfloat16" for key in ("torch_dtype", "dtype") if key in config} or {"dtype": "bfloat16"}
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return target


def weight_dtypes(checkpoint: Path) -> set[torch.dtype]:
    """The dtypes of a checkpoint's floating-point weights."""
    return {
        tensor.dtype
        for weights in checkpoint.glob("*.safetensors")
        for tensor in load_file(weights).values()
        if tensor.is_floating_point()
    }
