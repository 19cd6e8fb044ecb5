"""Pipeline tests: `tiny_models`, the tiny verifier and its example datasets, built once per machine.

The fixture builds into the default models root (`$EAGLE3_MODELS_ROOT`, else the per-user cache), the same
place `eagle3 tiny` and `make demo` use, so a build is shared by every test module and later runs. A cold
build takes a few minutes on a small CPU: tests that use the fixture get a timeout long enough for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_pipeline.runtime.context import models_root

BUILD_TIMEOUT_S = 3600  # a cold build: about 2.5 min on 2 idle cores, far longer on a busy machine
log = logging.getLogger(__name__)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tiny_models" not in getattr(item, "fixturenames", ()):
            continue
        marker = item.get_closest_marker("timeout")
        current = (marker.args[0] if marker.args else marker.kwargs.get("timeout", 0)) if marker else 0
        if marker is None or float(current) > 0:  # 0 disables the timeout: leave it disabled
            item.add_marker(pytest.mark.timeout(max(float(current), BUILD_TIMEOUT_S)))


@pytest.fixture(scope="session")
def tiny_models() -> Path:
    """The models root: `tiny-llama/` and `datasets/` (tiny-chat.jsonl, tiny-chat-sharegpt.jsonl, ...)."""
    from eagle3_pipeline.tiny.build import build

    root = build(models_root())
    log.info("tiny verifier in %s", root)
    return root


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls on a shared CI machine: more threads only wait for each other (10x slower under load)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
