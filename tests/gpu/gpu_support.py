"""Shared by the GPU tests: the skips without CUDA or a GPU vLLM, the tiny verifier's run manifests, and
training without torch.compile.

The tier checks that training works on a GPU with speculators' stock settings (flex attention, the fused
Triton loss, spawned loader workers), not how fast: compiling flex attention and the fused loss takes minutes
of a short device session, so the tier trains uncompiled (`uncompiled()` in this process, `UNCOMPILED_ENV` for
subprocesses): flex attention runs its eager implementation and the fused loss its Triton kernels directly.
The compiled configuration, the one a user runs, is what benchmarks/gpu_pipeline.py measures (docs/gpu.md).
EAGLE3_GPU_TIER_COMPILE=1 makes the tier compile too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.pipeline.draft_support import DATASET, VERIFIER
from tests.pipeline.manifests import base_spec, write_manifest

NO_GPU = "needs an NVIDIA GPU: torch.cuda.is_available() is false here (the gpu tier; see docs/gpu.md)"
AUX_LAYERS = [1, 2, 3]  # the tiny verifier has 4 layers: speculators' default [2, n/2, n-3] repeats one
COMPILED = os.environ.get("EAGLE3_GPU_TIER_COMPILE") == "1"
# torch reads TORCH_COMPILE_DISABLE when it imports (torch._dynamo.config.disable: compiled functions run
# eagerly) and TORCHDYNAMO_DISABLE in torch.compile (which then returns the function as it is)
UNCOMPILED_ENV = {} if COMPILED else {"TORCH_COMPILE_DISABLE": "1", "TORCHDYNAMO_DISABLE": "1"}


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


@contextmanager
def uncompiled() -> Iterator[None]:
    """torch.compile's functions run eagerly in the block (unless EAGLE3_GPU_TIER_COMPILE=1)."""
    if COMPILED:
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield
