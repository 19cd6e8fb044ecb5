"""eagle3_pipeline.adapters.muon_float32: Muon's iterations in float32 on a CPU without native bfloat16."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from eagle3_contract.patch_guard import LibraryChanged
from eagle3_pipeline.adapters import muon_float32
from eagle3_pipeline.adapters.speculators_cpu import PATCHES, cpu_adapted, patches
from tests.patch_guards import another_version, check_both_directions


@pytest.mark.parametrize("shape", [(96, 64), (64, 96)])
def test_the_float32_iterations_match_torchs_own_up_to_bfloat16s_rounding(shape: tuple[int, int]) -> None:
    grad = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    original = grad.clone()
    module = importlib.import_module(muon_float32.MODULE)
    coefficients, steps, eps = (3.4445, -4.775, 2.0315), 5, 1e-7
    torchs = getattr(module, muon_float32.FUNCTION)(grad, coefficients, steps, eps)
    ours = muon_float32.newton_schulz_float32(grad, coefficients, steps, eps)
    assert ours.dtype == torch.float32 and torchs.dtype == torch.bfloat16 and ours.shape == grad.shape
    assert torch.allclose(ours, torchs.float(), atol=0.05), (ours - torchs.float()).abs().max()
    assert torch.equal(grad, original)  # the gradient is left as it was
    with pytest.raises(ValueError, match="2D matrix"):
        muon_float32.newton_schulz_float32(torch.zeros(2, 2, 2), coefficients, steps, eps)


def test_torch_still_casts_to_bfloat16_where_the_patch_replaces_it_and_another_torch_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert muon_float32.GUARD.version == "2.13.0"
    check_both_directions(monkeypatch, tmp_path, muon_float32.GUARD)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="patches only without an accelerator")
def test_another_torch_is_refused_only_where_muon_would_be_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    another_version(monkeypatch, muon_float32.GUARD)
    module = importlib.import_module(muon_float32.MODULE)
    before = getattr(module, muon_float32.FUNCTION)
    with pytest.raises(LibraryChanged, match=r"torch==2\.13\.0"), cpu_adapted(native_bfloat16=False):
        pass
    assert getattr(module, muon_float32.FUNCTION) is before
    with cpu_adapted(native_bfloat16=True) as on_cpu:  # Muon left as torch has it: nothing of it to check
        assert on_cpu and getattr(module, muon_float32.FUNCTION) is before


def test_only_a_cpu_without_native_bfloat16_gets_the_float32_iterations() -> None:
    assert patches(native_bfloat16=True) == PATCHES
    float32 = (muon_float32.MODULE, muon_float32.FUNCTION, muon_float32.newton_schulz_float32)
    assert patches(native_bfloat16=False)[-1] == float32
    module = importlib.import_module(muon_float32.MODULE)
    before = getattr(module, muon_float32.FUNCTION)
    with cpu_adapted(native_bfloat16=False) as on_cpu:
        assert on_cpu and getattr(module, muon_float32.FUNCTION) is muon_float32.newton_schulz_float32
        muon = torch.optim.Muon([torch.nn.Parameter(torch.randn(8, 4))], lr=0.1)
        muon.param_groups[0]["params"][0].grad = torch.randn(8, 4)
        muon.step()  # torch's Muon calls the float32 iterations
    assert getattr(module, muon_float32.FUNCTION) is before  # put back after training
