"""eagle3_contract.patch_guard: the one check every patch of a library's internals makes before it patches
(issue 42, item 10). Each patch's own tests check its guard both ways (tests/patch_guards.py)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from pathlib import Path

import pytest

from eagle3_contract.patch_guard import LibraryChanged, PatchGuard, Source, fingerprint, fingerprint_of
from tests.patch_guards import check_both_directions

LIBRARY = '''"""A stand-in library."""


def helper(x):
    return x + 1


class Thing:
    def method(self):
        return helper(1)
'''
BROKEN = 'raise ImportError("this module needs a library that is not installed here")\n'


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package `guarded_lib` on sys.path: `core` imports, `needs_gpu` raises when imported."""
    package = tmp_path / "site" / "guarded_lib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text(LIBRARY)
    (package / "needs_gpu.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m.startswith("guarded_lib")]:
        monkeypatch.delitem(sys.modules, name)
    return package


def guard_of(version: str = "9.9.0") -> PatchGuard:
    """pytest stands in for the distribution; guarded_lib for its source."""
    return PatchGuard(
        patch="tests.contract.test_patch_guard",
        distribution="pytest",
        version=version,
        sources=(
            Source(
                "guarded_lib.core:Thing.method", fingerprint_of("guarded_lib.core:Thing.method"), "a call"
            ),
            Source("guarded_lib.core:helper", fingerprint_of("guarded_lib.core:helper"), "adds one"),
            Source("guarded_lib.needs_gpu", fingerprint(BROKEN), "its module is not imported to be read"),
        ),
        remove_when="the stand-in library is fixed",
    )


def test_a_fingerprint_is_the_sha256_of_the_text_whatever_its_line_endings() -> None:
    unix = "def f():\n    return 1\n"
    assert fingerprint(unix) == hashlib.sha256(unix.encode()).hexdigest()
    assert (
        fingerprint(unix) == fingerprint(unix.replace("\n", "\r\n")) == fingerprint(unix.replace("\n", "\r"))
    )
    assert fingerprint(unix) != fingerprint(unix.replace("1", "2"))


def test_the_guard_passes_the_source_it_was_verified_against_and_refuses_any_change(
    library: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    guard = guard_of(importlib.metadata.version("pytest"))
    check_both_directions(monkeypatch, tmp_path, guard)


def test_the_message_says_what_differs_and_what_to_do(library: Path) -> None:
    guard = guard_of()  # not pytest's version
    (library / "core.py").write_text(LIBRARY.replace("x + 1", "x + 2"))
    with pytest.raises(LibraryChanged) as refused:
        guard.check()
    message = str(refused.value)
    found = fingerprint_of("guarded_lib.core:helper")
    assert message.startswith(
        "tests.contract.test_patch_guard patches the internals of pytest as pytest==9.9.0 writes them, and "
        "the installed pytest differs (2 of the 3 sources it relies on unchanged); nothing was patched:\n"
    )
    assert f"  - version: expected 9.9.0, found {importlib.metadata.version('pytest')}\n" in message
    assert (
        f"  - guarded_lib.core:helper: its source changed (sha256 expected {guard.sources[1].sha256}, found "
        f"{found}); the patch relies on it for: adds one\n"
    ) in message
    assert message.endswith(
        "Re-verify the patch against the installed source and, where it still holds, put the found version "
        "and fingerprints in tests.contract.test_patch_guard's guard; or install pytest==9.9.0. Remove the "
        "patch when the stand-in library is fixed."
    )


def test_what_cannot_be_read_is_named(library: Path) -> None:
    guard = guard_of(importlib.metadata.version("pytest"))
    gone = PatchGuard(
        guard.patch,
        "not-a-distribution-here",
        "1.0",
        (Source("guarded_lib.core:Gone", "0" * 64, "x"), Source("guarded_lib.absent", "0" * 64, "y")),
        "never",
    )
    assert gone.differences() == [
        "version: expected 1.0, found not installed",
        "guarded_lib.core:Gone: cannot be read (AttributeError: module 'guarded_lib.core' has no attribute "
        "'Gone')",
        "guarded_lib.absent: cannot be read (LookupError: no module guarded_lib.absent)",
    ]


def test_a_versions_local_label_is_a_build_of_the_same_source(
    library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.13.0+cpu and 2.13.0+cu130 are builds of torch 2.13.0."""
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.0+cpu")
    guard_of("9.9.0").check()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.1+cpu")
    with pytest.raises(LibraryChanged, match=r"version: expected 9\.9\.0, found 9\.9\.1\+cpu"):
        guard_of("9.9.0").check()
