"""Muon's Newton-Schulz iterations in float32, for a CPU without native bfloat16.

torch 2.13's `torch.optim.Muon` orthogonalizes each update with
`torch.optim._muon._zeropower_via_newtonschulz`, which casts the update to bfloat16 (`grad.bfloat16()`) and
has no switch for it: fast on a GPU and on a CPU with AVX512-BF16 or AMX, but on one without them oneDNN
converts every operand, and the iterations took about 95% of a 100M-class draft's training time (issue 30: a
512x576 by 576x8192 matmul at 0.5 GFLOP/s in bfloat16 against 54.5 in float32 on one thread).
`newton_schulz_float32` is the same quintic iteration with the same coefficients, steps and normalization,
in float32 (no less precise: bfloat16 keeps 8 bits of mantissa, float32 24). It is written here because
torch offers no dtype for it. Its `GUARD` (eagle3_contract.patch_guard), checked before the patch is applied
(eagle3_pipeline.adapters.speculators_cpu), pins torch 2.13.0 and the source of the function it replaces and
of the one that calls it, so a torch upgrade fails loudly instead of training with an unpatched or wrongly
patched optimizer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eagle3_contract.patch_guard import PatchGuard, Source

MODULE = "torch.optim._muon"
FUNCTION = "_zeropower_via_newtonschulz"
GUARD = PatchGuard(
    patch=__name__,
    distribution="torch",
    version="2.13.0",
    sources=(
        Source(
            f"{MODULE}:{FUNCTION}",
            "99e2359a95e1a914345207e49f072a658866333f4458b7b45faafa35c628f7c4",
            "newton_schulz_float32 is this function (its checks, coefficients, steps and normalization), "
            "in float32 instead of grad.bfloat16()",
        ),
        Source(
            f"{MODULE}:_single_tensor_muon",
            "44fba01f07983da8404c512ab0d862f1992262955ed3c6ff1ab2e424e57ba23c",
            f"Muon looks {FUNCTION} up in {MODULE} (the name replaced) and calls it with (update, "
            "ns_coefficients, ns_steps, eps)",
        ),
    ),
    remove_when="torch's Muon lets the caller choose the dtype of its Newton-Schulz iterations",
)


def newton_schulz_float32(
    grad: Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> Tensor:
    """torch's `_zeropower_via_newtonschulz` (same checks, iteration and result shape) in float32."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    ortho = grad.float()
    if grad.size(0) > grad.size(1):
        ortho = ortho.T
    ortho = ortho / ortho.norm().clamp(min=eps)  # a copy: grad is never written to
    for _ in range(ns_steps):
        gram = ortho @ ortho.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        ortho = torch.addmm(ortho, update, ortho, beta=a)
    return ortho.T if grad.size(0) > grad.size(1) else ortho
