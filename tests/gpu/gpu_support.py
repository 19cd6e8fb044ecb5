"""Shared by the GPU tests: the skips without CUDA or a GPU vLLM, and the tiny verifier's run manifests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.pipeline.draft_support import DATASET, VERIFIER
from tests.pipeline.manifests import base_spec, write_manifest

NO_GPU = "needs an NVIDIA GPU: torch.cuda.is_available() is false here (the gpu tier; see docs/gpu.md)"
AUX_LAYERS = [1, 2, 3]  # the tiny verifier has 4 layers: speculators' default [2, n/2, n-3] repeats one


def require_cuda() -> None:
    """Skip the calling test module, at import, on a machine without a CUDA device."""
    if not torch.cuda.is_available():
        pytest.skip(NO_GPU, allow_module_level=True)


def gpu_vllm() -> str:
    """vLLM built for the GPU ($EAGLE3_VLLM, else `vllm` on PATH); without one the calling module skips."""
    found = os.environ.get("EAGLE3_VLLM") or shutil.which("vllm")
    if not found or not os.access(found, os.X_OK):
        pytest.skip(
            "needs vLLM for the GPU: set $EAGLE3_VLLM to its bin/vllm or put `vllm` on PATH (docs/gpu.md)",
            allow_module_level=True,
        )
    return found


def tiny_manifest(models: Path, path: Path, samples: int, **training: Any) -> str:
    """An Eagle3Run for the tiny verifier and `samples` rows of its chat dataset (transformers extraction)."""
    doc = base_spec(
        models / VERIFIER, models / DATASET, maxSamples=samples, maxSequenceLength=512, validationFraction=0.1
    )
    doc["extraction"] |= {"layers": AUX_LAYERS, "tokenBudget": 4096, "dtype": "bfloat16"}
    doc["draft"] = {"vocabSize": 256}
    doc["training"] |= {"sequenceLength": 512, **training}
    return str(write_manifest(path, doc))
