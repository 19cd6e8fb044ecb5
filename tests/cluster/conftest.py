"""The real node of the tier (scripts/node.sh), one per module (the modules run one after another in one
xdist group: a node costs 20-23 s to start, and stopping it after each module frees the cores and memory its
pods hold for the tiers that run beside it).

Each module takes the host's state before `up` and, at its end, stops the node and compares: a difference is
an error of the module, naming what was left behind. Where the node cannot run (not Linux, not root, no
writable cgroup v1, no Kubernetes binaries) the tier is skipped with the reason; with CI=true that is a
failure instead, so CI never passes without it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import tiers
from tests.cluster import node


@dataclass
class Node:
    kubeconfig: Path
    before: node.HostSnapshot
    cold_start_s: float


@pytest.fixture(scope="module")
def cluster() -> Iterator[Node]:
    missing = node.missing_requirements()
    if missing:
        tiers.missing("real-node", "tests/cluster needs " + "; ".join(missing))
    if node.is_up() or node.STATE.exists():
        node.down()  # a node a killed session left behind
    before = node.snapshot_host()
    started = time.monotonic()
    kubeconfig = node.up()
    cold = time.monotonic() - started
    print(f"\n[cluster] the node: cold start {cold:.1f} s")
    try:
        yield Node(kubeconfig, before, cold)
    finally:
        node.down()
        left = node.diff_host(before, node.snapshot_host())
        if left:
            pytest.fail("scripts/node.sh down left the host changed:\n  " + "\n  ".join(left))
