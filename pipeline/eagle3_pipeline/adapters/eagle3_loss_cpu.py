"""EAGLE-3's per-step loss and accuracy, computed for the CPU without the work speculators repeats.

speculators 0.9.0's `Eagle3DraftModel.forward` calls `speculators.models.eagle3.metrics.compute_metrics` once
per TTT step with the same verifier targets (the verifier's logits over the draft vocabulary, made once per
forward). On a GPU its fused Triton loss makes that cheap; on the CPU it takes the eager path, which per step
and per position:
  - takes the softmax of the targets again, and their argmax (the same rows, shifted by the step);
  - computes the KL divergence elementwise with `kl_div` (an `xlogy` over the whole draft vocabulary for the
    targets' own entropy, a constant) and backpropagates through `kl_div` and `log_softmax` apart;
  - takes the argmax of bfloat16 logits, which torch 2.13 computes at half the speed of `max(dim).indices`.
At a 100M-class verifier's shape (a draft vocabulary of 8,192, sequences of 512) those are about 12 % of a
CPU training step (docs/benchmarks.md). `fused_loss()` replaces compute_metrics, while training, by
`compute_metrics_once`: the targets' probabilities, entropy and argmax once per forward (for the first step,
sliced for the others), the KL divergence as one autograd function whose backward is `softmax(logits) - p`,
and `max(dim).indices` for the argmax (the same index: the first maximal one). The loss, its gradient and
every metric are the same up to float rounding (tests/pipeline/test_eagle3_loss_cpu.py); any other loss
configuration than speculators' eager KL divergence goes to the original.

The replacement is written against speculators==0.9.0: before patching, its `GUARD` checks that version and
the source of what it replaces and mirrors (eagle3_contract.patch_guard).
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch

from eagle3_contract.patch_guard import PatchGuard, Source

CALLER = "speculators.models.eagle3.core"  # where forward looks compute_metrics up
FUNCTION = "compute_metrics"
GUARD = PatchGuard(
    patch=__name__,
    distribution="speculators",
    version="0.9.0",
    sources=(
        Source(
            f"{CALLER}:Eagle3DraftModel.forward",
            "f682b266d1b18786842b8d031697e9e396acc1d710ed55b343ef6fd5d3a48df0",
            f"forward makes the verifier's targets once and calls {FUNCTION} (looked up in {CALLER}: the "
            "name replaced) once per TTT step with them",
        ),
        Source(
            f"speculators.models.eagle3.metrics:{FUNCTION}",
            "5dd4345b708ab81a46cdb86b9dba8ec96f949549d48c658293d33799bdf404d9",
            "compute_metrics_once is this function (compound_loss with exp_loss_decay, the argmax "
            "accuracies, the metrics' names) with the targets' work done once per forward",
        ),
        Source(
            "speculators.losses.eager:kl_div_loss",
            "88c0bcd43bdb28e4ea6625b7ba545aebf15febaca2f6349f757a688969cda118",
            "KlDivergence computes this loss: log_softmax and softmax in float32, kl_div of probabilities",
        ),
    ),
    remove_when="speculators' eager loss computes the targets' softmax, entropy and argmax once per "
    "forward, or its fused loss runs on the CPU",
)


class KlDivergence(torch.autograd.Function):
    """Per-position KL(p || softmax(logits)) = sum(p log p) - sum(p log_softmax(logits)), in float32, with
    `p` and `sum(p log p)` given (the targets' probabilities and negative entropy, constants)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, p: torch.Tensor, p_log_p: torch.Tensor) -> torch.Tensor:
        log_q = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        ctx.save_for_backward(log_q, p)
        ctx.logits_dtype = logits.dtype
        return p_log_p - (p * log_q).sum(dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        log_q, p = ctx.saved_tensors
        return log_q.exp().sub_(p).mul_(grad.unsqueeze(-1)).to(ctx.logits_dtype), None, None


class TargetStats:
    """The targets' probabilities, negative entropy and argmax, for the targets of the last forward."""

    def __init__(self) -> None:
        self.of: weakref.ref[torch.Tensor] | None = None
        self.version = -1
        self.p = self.p_log_p = self.ids = torch.empty(0)

    def of_targets(self, targets: torch.Tensor) -> TargetStats:
        if self.of is None or self.of() is not targets or self.version != targets._version:
            with torch.no_grad():
                self.p = torch.softmax(targets, dim=-1, dtype=torch.float32)
                self.p_log_p = torch.special.xlogy(self.p, self.p).sum(dim=-1)
                self.ids = targets.max(dim=-1).indices
            self.of, self.version = weakref.ref(targets), targets._version
        return self


_STATS = TargetStats()


def compute_metrics_once(
    logits: torch.Tensor,
    targets: torch.Tensor,
    loss_mask: torch.Tensor | None,
    prev_correct: torch.Tensor | None,
    ttt_step: int,
    ttt_step_loss_decay: float,
    loss_config: Any = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """speculators' compute_metrics (the loss and metrics of one TTT step), with the targets' work done once
    per forward; the original for any loss but the eager KL divergence."""
    metrics_module = importlib.import_module("speculators.models.eagle3.metrics")
    from speculators.losses import compound_loss, exp_loss_decay
    from speculators.losses.eager import kl_div_loss
    from speculators.models.metrics import compute_accuracy_single_step

    if loss_config is not None and [fn for fn, _ in loss_config.values()] != [kl_div_loss]:
        return metrics_module.compute_metrics(  # type: ignore[no-any-return]
            logits, targets, loss_mask, prev_correct, ttt_step, ttt_step_loss_decay, loss_config
        )
    weight = 1.0 if loss_config is None else next(iter(loss_config.values()))[1]
    stats = _STATS.of_targets(targets)
    s_logits, s_targets, s_loss_mask, s_prev_correct = metrics_module.align_for_step(
        logits, targets, loss_mask, prev_correct, ttt_step
    )
    p, p_log_p, target_ids = (t[:, ttt_step:] for t in (stats.p, stats.p_log_p, stats.ids))
    seq_len = s_logits.shape[1]
    if s_loss_mask is None:
        s_loss_mask = torch.ones(1, seq_len, device=s_logits.device, dtype=torch.bool)
    pos_idx = torch.full((1, seq_len), ttt_step, device=s_logits.device, dtype=torch.long)

    def fused_kl(step_logits: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        return KlDivergence.apply(step_logits, p, p_log_p)  # type: ignore[no-any-return,no-untyped-call]

    s_loss, _ = compound_loss(
        s_logits,
        s_targets,
        s_loss_mask,
        pos_idx,
        loss_config={"kl_div": (fused_kl, weight)},
        decay_fn=partial(exp_loss_decay, gamma=ttt_step_loss_decay),
    )
    pred_ids = s_logits.detach().max(dim=-1).indices
    full_correct, full_total, cond_correct, cond_total = compute_accuracy_single_step(
        pred_ids, target_ids, s_loss_mask, s_prev_correct
    )
    ones = torch.tensor(1.0, device=s_loss.device)
    return s_loss, {
        f"loss_{ttt_step}_sum": s_loss.detach().clone(),
        f"loss_{ttt_step}_total": ones,
        f"full_acc_{ttt_step}_sum": full_correct,
        f"full_acc_{ttt_step}_total": full_total,
        f"cond_acc_{ttt_step}_sum": cond_correct,
        f"cond_acc_{ttt_step}_total": cond_total,
    }


@contextlib.contextmanager
def fused_loss(enabled: bool = True) -> Iterator[bool]:
    """Within the block (when `enabled`), EAGLE-3's forward computes its loss with compute_metrics_once.
    Raises LibraryChanged (nothing replaced) where the installed speculators differs from what the
    replacement was written for."""
    if not enabled:
        yield False
        return
    GUARD.check()
    caller = importlib.import_module(CALLER)
    original = getattr(caller, FUNCTION)
    setattr(caller, FUNCTION, compute_metrics_once)
    try:
        yield True
    finally:
        setattr(caller, FUNCTION, original)
