"""eagle3-operator: reconciles Eagle3Runs into stage Jobs and a vLLM speculative-decoding Deployment."""

from __future__ import annotations

__version__ = "0.1.0"
