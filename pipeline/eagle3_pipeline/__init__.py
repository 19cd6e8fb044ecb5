"""The stage programs of eagle3-operator (prepare, generate, extract, vocab, train, evaluate, export)."""

from __future__ import annotations

__version__ = "0.1.0"
