"""Both directions of a patch's guard (eagle3_contract.patch_guard), for the tests of each patch: the
installed library passes; another version, or another source in any place the patch relies on, is refused
with a message that names it."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.patch_guard import LibraryChanged, PatchGuard, Source

OTHER_VERSION = "0.0.1"


def another_version(monkeypatch: pytest.MonkeyPatch, guard: PatchGuard) -> None:
    """importlib.metadata says OTHER_VERSION of the guard's distribution is installed."""
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: OTHER_VERSION if name == guard.distribution else real(name),
    )


def another_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: Source) -> None:
    """A stand-in with other source text where `source` is: a function for "module:qualname", a module whose
    file says something else for "module"."""
    module, _, qualname = source.name.partition(":")
    if not qualname:
        other = tmp_path / "another_source.py"
        other.write_text("# not the source the patch was verified against\n")
        stand_in = types.ModuleType(module)
        stand_in.__spec__ = importlib.util.spec_from_file_location(module, other)
        monkeypatch.setitem(sys.modules, module, stand_in)
        return
    *parents, name = qualname.split(".")
    owner: Any = importlib.import_module(module)
    for part in parents:
        owner = getattr(owner, part)

    def changed(*args: Any, **kwargs: Any) -> None:  # another body than the library's
        return None

    monkeypatch.setattr(owner, name, changed)


def refusal(guard: PatchGuard) -> str:
    """The guard's message; fails the test where the guard passes."""
    with pytest.raises(LibraryChanged) as refused:
        guard.check()
    message = str(refused.value)
    assert guard.patch in message and "nothing was patched" in message
    assert guard.remove_when in message
    return message


def check_both_directions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, guard: PatchGuard) -> None:
    """The installed library passes; another version, and another source in each place, are refused."""
    guard.check()
    assert guard.sources, "a guard fingerprints what its patch relies on"
    with monkeypatch.context() as m:
        another_version(m, guard)
        message = refusal(guard)
        assert f"version: expected {guard.version}, found {OTHER_VERSION}" in message
        assert f"install {guard.distribution}=={guard.version}" in message
        assert f"{len(guard.sources)} of the {len(guard.sources)} sources it relies on unchanged" in message
    for source in guard.sources:
        with monkeypatch.context() as m:
            another_source(m, tmp_path, source)
            message = refusal(guard)
            assert f"{source.name}: its source changed (sha256 expected {source.sha256}, found " in message
            assert source.relied_on in message and "version:" not in message
