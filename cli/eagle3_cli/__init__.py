"""The `eagle3` command: a thin entry on top of the contract, the operator and the pipeline."""

from __future__ import annotations
