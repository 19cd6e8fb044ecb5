"""tests/conftest.py's schedule for `make test`: a module's tests run on one xdist worker, and every
`apiserver` test on one worker, so module fixtures and the real API server are set up once.

Run on a small suite of its own with the same conftest: xdist's loadgroup once stopped grouping without a
word (pytest-xdist#1386), and a split group only shows as a slower suite."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
MODULE = """
import pytest

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass

@pytest.mark.apiserver
@pytest.mark.parametrize("i", range(3))
def test_on_the_server(i):
    pass
"""


def workers_of(out: str) -> dict[str, set[str]]:
    """`[gw0] ... PASSED tests/test_a.py::test_alone[0]` lines: the workers each group ran on."""
    seen: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in re.findall(r"\[(gw\d+)\].*?PASSED (\S+)", out):
        module, test = nodeid.split("::", 1)
        seen["apiserver" if test.startswith("test_on_the_server") else module].add(worker)
    return seen


@pytest.mark.timeout(300)
def test_each_module_and_the_api_server_run_on_one_worker(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    apiserver: a real API server\n")
    for name in "abcd":
        (tmp_path / f"test_{name}.py").write_text(MODULE)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2"]
    argv += ["--dist", "loadgroup", "--no-loadscope-reorder"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = workers_of(done.stdout)
    assert set(seen) == {"apiserver"} | {f"test_{name}.py" for name in "abcd"}, done.stdout[-3000:]
    assert all(len(workers) == 1 for workers in seen.values()), seen
    assert len(set().union(*seen.values())) == 2, "both workers had work"
