"""The GPU tier (`pytest -m gpu` or `pytest tests/gpu`): every module skips itself without CUDA.

`tiny_models` (the tiny verifier and its datasets, built once per machine) and the longer timeout of the
tests that use it are tests/pipeline/conftest.py's, imported rather than repeated.
"""

from __future__ import annotations

from tests.pipeline.conftest import pytest_collection_modifyitems, tiny_models

__all__ = ["pytest_collection_modifyitems", "tiny_models"]
