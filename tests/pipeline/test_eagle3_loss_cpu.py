"""eagle3_pipeline.adapters.eagle3_loss_cpu: EAGLE-3's loss with the targets' work done once per forward
gives speculators' own loss, gradient and metrics."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from speculators.losses import resolve_loss_config
from speculators.models.eagle3.metrics import compute_metrics

from eagle3_contract.patch_guard import LibraryChanged
from eagle3_pipeline.adapters import eagle3_loss_cpu
from eagle3_pipeline.adapters.eagle3_loss_cpu import compute_metrics_once, fused_loss
from tests.patch_guards import another_version, check_both_directions

VOCAB, SEQ = 96, 40


def _batch(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, SEQ, VOCAB, generator=gen).to(dtype)
    targets = (3 * torch.randn(1, SEQ, VOCAB, generator=gen)).to(dtype)
    targets[0, :4, 7] = targets[0, :4, 9] = 50.0  # ties: both argmaxes take the first maximal index
    logits[0, :4, 7] = logits[0, :4, 9] = 50.0
    loss_mask = torch.rand(1, SEQ, generator=gen) > 0.3
    return logits, targets, loss_mask


def _steps(fn, dtype: torch.dtype, loss_config) -> list[tuple[float, torch.Tensor, dict]]:
    """Each TTT step's loss, the gradient of the logits and the metrics, as forward calls them."""
    logits, targets, loss_mask = _batch(dtype)
    prev_correct = loss_mask.clone()
    out = []
    for step in range(3):
        leaf = logits.clone().requires_grad_()
        loss, metrics = fn(leaf, targets, loss_mask, prev_correct, step, 0.8, loss_config)
        loss.backward()
        out.append((loss.item(), leaf.grad, {k: v.float() for k, v in metrics.items()}))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_its_gradient_and_the_metrics_are_speculators_own(dtype: torch.dtype) -> None:
    config = resolve_loss_config("kl_div", "eager")
    theirs = _steps(compute_metrics, dtype, config)
    ours = _steps(compute_metrics_once, dtype, config)
    for (their_loss, their_grad, their_metrics), (loss, grad, metrics) in zip(theirs, ours, strict=True):
        assert loss == pytest.approx(their_loss, rel=1e-5, abs=1e-6)
        assert grad.dtype == their_grad.dtype
        tolerance = 1e-6 if dtype == torch.float32 else 2e-3  # the bfloat16 gradient's own rounding
        assert torch.allclose(grad.float(), their_grad.float(), atol=tolerance), (
            (grad - their_grad).abs().max()
        )
        assert metrics.keys() == their_metrics.keys()
        for name, value in their_metrics.items():
            if "acc" in name:  # counts of correct positions: exact
                assert torch.equal(metrics[name], value), name
            else:
                assert metrics[name].item() == pytest.approx(value.item(), rel=1e-5, abs=1e-6), name


def test_the_targets_statistics_follow_a_new_forwards_targets() -> None:
    config = resolve_loss_config("kl_div", "eager")
    logits, targets, loss_mask = _batch(torch.float32)
    first, _ = compute_metrics_once(logits, targets, loss_mask, loss_mask.clone(), 0, 1.0, config)
    other = targets.flip(-1)  # the next batch's targets
    ours, _ = compute_metrics_once(logits, other, loss_mask, loss_mask.clone(), 0, 1.0, config)
    theirs, _ = compute_metrics(logits, other, loss_mask, loss_mask.clone(), 0, 1.0, config)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5) and ours.item() != pytest.approx(
        first.item()
    )
    targets.mul_(2)  # written in place: the same tensor, another version
    ours, _ = compute_metrics_once(logits, targets, loss_mask, loss_mask.clone(), 0, 1.0, config)
    theirs, _ = compute_metrics(logits, targets, loss_mask, loss_mask.clone(), 0, 1.0, config)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)


@pytest.mark.parametrize("loss", ["rkl", '{"kl_div": 0.5, "tv": 0.5}'])
def test_another_loss_goes_to_speculators_own(loss: str) -> None:
    config = resolve_loss_config(loss, "eager")
    logits, targets, loss_mask = _batch(torch.float32)
    ours = compute_metrics_once(logits, targets, loss_mask, loss_mask.clone(), 1, 1.0, config)
    theirs = compute_metrics(logits, targets, loss_mask, loss_mask.clone(), 1, 1.0, config)
    assert ours[0].item() == theirs[0].item() and ours[1].keys() == theirs[1].keys()


def test_the_replacement_matches_the_installed_speculators_and_refuses_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    check_both_directions(monkeypatch, tmp_path, eagle3_loss_cpu.GUARD)
    another_version(monkeypatch, eagle3_loss_cpu.GUARD)
    core = importlib.import_module(eagle3_loss_cpu.CALLER)
    with pytest.raises(LibraryChanged, match=r"speculators==0\.9\.0"), fused_loss():
        pass
    assert core.compute_metrics is compute_metrics  # nothing replaced


def test_the_replacement_holds_only_within_the_block() -> None:
    core = importlib.import_module(eagle3_loss_cpu.CALLER)
    with fused_loss(enabled=False) as fused:
        assert not fused and core.compute_metrics is compute_metrics
    with fused_loss() as fused:
        assert fused and core.compute_metrics is compute_metrics_once
    assert core.compute_metrics is compute_metrics
