"""One guard for every patch of a library's internals: the exact version it was written against and a
fingerprint of each piece of source it relies on, checked before anything is patched.

A patch (eagle3_pipeline.adapters; the operator's uses of kopf's and kubernetes_asyncio's internals) replaces
or reads what a library keeps to itself, so it is right for the source it was read against only. Each patch
declares a `PatchGuard`: the distribution and its exact version, and, for each function, class or module it
patches or relies on, the sha256 of that source (`fingerprint`) and what it relies on there. The patch calls
`check()` before it patches: where the version or any fingerprint differs, `check()` raises
`LibraryChanged` and nothing runs patched on a source nobody read. The message names the patch, the
distribution, what differs (expected and found: the found fingerprints are the ones to write in once the
patch is re-verified) and the ways out: re-verify and update the guard, install the version it names, or
remove the patch once its `remove_when` holds.

A source is "module:qualname" (a function, class or method, as `inspect.getsource` reads it from the imported
module) or "module" (the module's file, read without executing it: speculators' fused loss does not import
without Triton). Its fingerprint is the sha256 of that text with its line endings made "\\n". A version's
local label (torch's "+cpu", "+cu130": builds of the same source) is not compared.

The standard library only: the contract imports no ML, Kubernetes or server library (pyproject's import
contracts); a guarded module is imported by its name when its guard is checked.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class LibraryChanged(RuntimeError):
    """The installed library is not the one a patch was verified against: nothing was patched."""


def fingerprint(text: str) -> str:
    """The sha256 of a source text, its line endings made "\\n"."""
    return hashlib.sha256(text.replace("\r\n", "\n").replace("\r", "\n").encode()).hexdigest()


def source_of(name: str) -> str:
    """The source text of "module:qualname" (a function, class or method) or "module" (its file)."""
    module, _, qualname = name.partition(":")
    if not qualname:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise LookupError(f"no module {module}")
        return Path(spec.origin).read_text()
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return inspect.getsource(target)


def fingerprint_of(name: str) -> str:
    """The fingerprint of a source as installed here ("module:qualname" or "module")."""
    return fingerprint(source_of(name))


@dataclass(frozen=True)
class Source:
    """A piece of a library's source that a patch replaces or relies on."""

    name: str  # "module:qualname" or "module"
    sha256: str  # fingerprint() of it as verified
    relied_on: str  # what the patch relies on there: what to re-check when it changed


@dataclass(frozen=True)
class PatchGuard:
    """What a patch was verified against: `distribution`==`version` with `sources` as fingerprinted."""

    patch: str  # the module that patches (its __name__)
    distribution: str
    version: str
    sources: tuple[Source, ...]
    remove_when: str  # when the patch is no longer needed

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def differences(self) -> list[str]:
        """What differs from what the patch was verified against (empty: the patch is right here)."""
        found = self.installed_version()
        problems = []
        if found is None or found.split("+")[0] != self.version:
            problems.append(f"version: expected {self.version}, found {found or 'not installed'}")
        for source in self.sources:
            try:
                now = fingerprint_of(source.name)
            except Exception as exc:  # whatever stops the read (an import error, a name gone) is the news
                problems.append(f"{source.name}: cannot be read ({type(exc).__name__}: {exc})")
                continue
            if now != source.sha256:
                problems.append(
                    f"{source.name}: its source changed (sha256 expected {source.sha256}, found {now}); "
                    f"the patch relies on it for: {source.relied_on}"
                )
        return problems

    def check(self) -> None:
        """Raise LibraryChanged unless the installed library is what the patch was verified against."""
        problems = self.differences()
        if not problems:
            return
        unchanged = len(self.sources) - sum(1 for p in problems if not p.startswith("version:"))
        also = f" ({unchanged} of the {len(self.sources)} sources it relies on unchanged)"
        pinned = f"{self.distribution}=={self.version}"
        lines = "\n".join(f"  - {p}" for p in problems)
        raise LibraryChanged(
            f"{self.patch} patches the internals of {self.distribution} as {pinned} writes them, and the "
            f"installed {self.distribution} differs{also}; nothing was patched:\n{lines}\n"
            f"Re-verify the patch against the installed source and, where it still holds, put the found "
            f"version and fingerprints in {self.patch}'s guard; or install {pinned}. Remove the patch when "
            f"{self.remove_when}."
        )
