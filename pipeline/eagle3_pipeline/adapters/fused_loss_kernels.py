"""speculators' fused loss inside torch.compile on torch 2.11: one autotune configs list per kernel.

speculators 0.9.0 decorates its fused loss's forward and backward Triton kernels with one
`triton.autotune(...)` object, so both kernels' Autotuners hold the same `configs` list. On CUDA the loss runs
inside a compiled region (`compute_metrics`, through `conditional_torch_compile`), and torch 2.11's Dynamo
wraps each Autotuner's `configs` without its side-effect deduplication: the backward kernel's list, the same
object under a second name, fails the trace with "ListVariable(length=21) is already tracked for mutation"
(pytorch/pytorch#177600, fixed by #177874). The first training step then raises, in our train stage and in
the stock `speculators train` alike; seen on an H200 with torch 2.11.0+cu130 and triton 3.6.0.

Giving the backward kernel its own copy of the list (and of its Config objects) leaves the autotuning as it
was, since both kernels already tune separately, keyed on their own arguments, and lets Dynamo trace both.
It is applied only where the two kernels share a list, so it does nothing on a torch or speculators without
the problem, and nothing without Triton (the CPU, where the loss is the eager one). Where they share one, its
`GUARD` (eagle3_contract.patch_guard) first checks speculators 0.9.0 and the source of its fused loss module
(the one `triton.autotune` object both kernels are decorated with), so the list is never copied on a source
nobody read.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from eagle3_contract.patch_guard import PatchGuard, Source

log = logging.getLogger(__name__)
MODULE = "speculators.losses.fused"
GUARD = PatchGuard(
    patch=__name__,
    distribution="speculators",
    version="0.9.0",
    sources=(
        Source(
            MODULE,
            "9144017e137269d231d1d926c68e2b808eab0d0a346be7d2708fd86ec00ab9eb",
            "loss_forward_kernel and loss_backward_kernel are decorated with one triton.autotune object "
            "(_autotune_tile) and tune separately, keyed on their own arguments",
        ),
    ),
    remove_when="speculators gives each fused loss kernel its own autotune configs, or the torch in use "
    "has pytorch/pytorch#177874 (Dynamo traces a list held under two names)",
)


def separate_autotune_configs() -> bool:
    """Give speculators' fused backward loss kernel its own autotune configs; True if they were shared.
    Raises LibraryChanged (nothing copied) where they are shared in another speculators than GUARD's."""
    try:
        from speculators.losses import fused
    except ImportError:  # no Triton: the fused loss is not available, nothing to trace
        return False
    forward: Any = getattr(fused, "loss_forward_kernel", None)
    backward: Any = getattr(fused, "loss_backward_kernel", None)
    shared = getattr(forward, "configs", None)
    if backward is None or shared is None or shared is not getattr(backward, "configs", None):
        return False
    GUARD.check()
    backward.configs = copy.deepcopy(shared)
    log.info("speculators' fused loss kernels shared one autotune configs list: the backward one has its own")
    return True
