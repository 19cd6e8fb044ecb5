"""Committed files generated from code (the chart's copies, the dashboard, the rules): write or check them.

A generator is a mapping of repository-relative paths to functions rendering each file's text from the
repository root. `stale` names the files that differ, `write` rewrites them, and `main` is the command line
both generators share (`--check` exits 1 naming the stale files and the make target that refreshes them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

Render = Callable[[Path], str]


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def stale(outputs: Mapping[str, Render], root: Path) -> list[str]:
    """The files (relative paths) under `root` that differ from what their render function gives."""
    return [rel for rel, render in outputs.items() if _read(root / rel) != render(root)]


def write(outputs: Mapping[str, Render], root: Path) -> list[str]:
    """Write every file that differs; returns those that changed."""
    changed = []
    for rel, render in outputs.items():
        text, path = render(root), root / rel
        if _read(path) != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(rel)
    return changed


def main(
    argv: Sequence[str] | None, *, prog: str, doc: str | None, outputs: Mapping[str, Render], root: Path,
    stale_message: str,
) -> int:  # fmt: skip
    """`prog [--check] [--root DIR]`; `stale_message` follows each stale file's path under --check."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--root", type=Path, default=root, help="the repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale(outputs, args.root)
        for rel in bad:
            print(f"{rel} {stale_message}", file=sys.stderr)
        return 1 if bad else 0
    for rel in write(outputs, args.root):
        print(f"wrote {rel}")
    return 0
