"""Committed files generated from code (the chart's copies, the dashboard, the rules, the GitOps example).

A `Generator` maps repository-relative paths to functions rendering each file's text from the repository
root. `stale` names the files that differ, `write` rewrites them, and `main` is the command line every
generator shares (`--check` exits 1 naming the stale files and the make target that refreshes them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Render = Callable[[Path], str]
REPO_ROOT = Path(__file__).resolve().parents[1]  # devtools/ is at the checkout's top: it is never installed


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


@dataclass(frozen=True)
class Generator:
    """`outputs` under a repository root; `prog` and `doc` for its command line, `stale_message` after each
    stale file's path under --check."""

    outputs: Mapping[str, Render]
    prog: str
    doc: str | None
    stale_message: str

    def stale(self, root: Path = REPO_ROOT) -> list[str]:
        """The files (relative paths) under `root` that differ from what their render function gives."""
        return [rel for rel, render in self.outputs.items() if _read(root / rel) != render(root)]

    def write(self, root: Path = REPO_ROOT) -> list[str]:
        """Write every file that differs; returns those that changed."""
        changed = []
        for rel, render in self.outputs.items():
            text, path = render(root), root / rel
            if _read(path) != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                changed.append(rel)
        return changed

    def main(self, argv: Sequence[str] | None = None) -> int:
        """`prog [--check] [--root DIR]`."""
        parser = argparse.ArgumentParser(prog=self.prog, description=self.doc)
        parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
        parser.add_argument(
            "--root", type=Path, default=REPO_ROOT, help="the repository root (default: %(default)s)"
        )
        args = parser.parse_args(argv)
        if args.check:
            bad = self.stale(args.root)
            for rel in bad:
                print(f"{rel} {self.stale_message}", file=sys.stderr)
            return 1 if bad else 0
        for rel in self.write(args.root):
            print(f"wrote {rel}")
        return 0
