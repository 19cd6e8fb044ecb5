"""The fused loss kernels' workaround for torch 2.11's Dynamo (seen on an H200; see the module)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from eagle3_contract.patch_guard import LibraryChanged
from eagle3_pipeline.adapters import fused_loss_kernels
from eagle3_pipeline.adapters.fused_loss_kernels import separate_autotune_configs
from tests.patch_guards import another_version, check_both_directions


class Config:  # stands in for triton.Config: what deepcopy copies
    def __init__(self, block: int) -> None:
        self.kwargs = {"BLOCK_SIZE": block}


def fake_fused(monkeypatch: pytest.MonkeyPatch, shared: bool) -> types.SimpleNamespace:
    """speculators' fused loss module with stand-in kernels (Triton is not here), read from its real file."""
    configs = [Config(1024), Config(2048)]
    module = types.ModuleType("speculators.losses.fused")
    module.__spec__ = importlib.util.find_spec(fused_loss_kernels.MODULE)  # found, not executed
    module.loss_forward_kernel = types.SimpleNamespace(configs=configs)  # type: ignore[attr-defined]
    module.loss_backward_kernel = types.SimpleNamespace(  # type: ignore[attr-defined]
        configs=configs if shared else list(configs)
    )
    monkeypatch.setitem(sys.modules, "speculators.losses.fused", module)
    import speculators.losses

    monkeypatch.setattr(speculators.losses, "fused", module, raising=False)
    return types.SimpleNamespace(forward=module.loss_forward_kernel, backward=module.loss_backward_kernel)


def test_kernels_sharing_one_configs_list_get_one_each_with_the_same_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = fake_fused(monkeypatch, shared=True)
    forward = kernels.forward.configs
    assert separate_autotune_configs() is True
    assert kernels.forward.configs is forward  # the forward kernel keeps its own
    assert kernels.backward.configs is not forward
    assert all(a is not b for a, b in zip(kernels.backward.configs, forward, strict=True))
    assert [c.kwargs for c in kernels.backward.configs] == [c.kwargs for c in forward]
    assert separate_autotune_configs() is False  # once separate, nothing more to do


def test_the_guard_holds_for_the_installed_speculators_and_refuses_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Read from its file: speculators' fused loss does not import without Triton."""
    check_both_directions(monkeypatch, tmp_path, fused_loss_kernels.GUARD)


def test_shared_lists_of_another_speculators_are_refused_and_left_shared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = fake_fused(monkeypatch, shared=True)
    another_version(monkeypatch, fused_loss_kernels.GUARD)
    with pytest.raises(LibraryChanged, match=r"speculators==0\.9\.0"):
        separate_autotune_configs()
    assert kernels.backward.configs is kernels.forward.configs


def test_separate_lists_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = fake_fused(monkeypatch, shared=False)
    backward = kernels.backward.configs
    assert separate_autotune_configs() is False
    assert kernels.backward.configs is backward


def test_without_triton_there_is_nothing_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "speculators.losses.fused", None)  # an import of it raises ImportError
    import speculators.losses

    monkeypatch.delattr(speculators.losses, "fused", raising=False)
    assert separate_autotune_configs() is False
