"""Constraints for installing an extra of this project beside vLLM: vLLM's versions of what the extra names.

    python3 vllm_pins.py pyproject.toml pipeline > constraints.txt

Run with vLLM's Python: prints `name==version` (names in PEP 503 form) for each requirement of the extra
that this environment has installed (torch, transformers, tokenizers, numpy, ...). Installed with these
constraints, in a virtual environment that sees vLLM's packages (--system-site-packages), the extra reuses
vLLM's copies of them (no second torch), and pip fails, naming the package, when vLLM's version is outside the
extra's range; only the extra's other dependencies (datasets and what it needs) go into that environment.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import tomllib

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def canonical(name: str) -> str:
    """The name as pip compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(pyproject: str, extra: str) -> list[str]:
    with open(pyproject, "rb") as f:
        requirements = tomllib.load(f)["project"]["optional-dependencies"][extra]
    out = []
    for requirement in requirements:
        found = NAME.match(requirement)
        if found is None:
            raise SystemExit(f"{pyproject}: cannot read the requirement {requirement!r} of the {extra} extra")
        try:
            dist = md.distribution(found[0])
        except md.PackageNotFoundError:
            continue
        out.append(f"{canonical(dist.metadata['Name'])}=={dist.version}")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python3 vllm_pins.py PYPROJECT EXTRA")
    print("\n".join(pins(sys.argv[1], sys.argv[2])))
