"""evaluate's vLLM servers, one per configuration, kept up between its phases where they can share the
machine.

evaluate serves the same configuration more than once: the verifier alone for its baseline and again as
the sweep's and the bake-off's `none`; the draft at evaluation's k for its measurement and again as the
sweep's cell at that k; a bake-off's trained candidate, which is then the draft measured in full. A start
costs about 30 CPU-s for the tiny verifier on vLLM CPU, and minutes for a large verifier on a GPU (weights
loaded, graphs captured), so `ServerPool` starts a configuration once and hands the same warm server out
again. A reused server's rounds are still paired and differenced (the spec-decode counters around each run),
so what it measured before changes no figure.

Where servers can be up together (a CPU: an idle vLLM server takes no CPU, docs/serving.md), a kept server
stays up until `release` or the stage's end; one asked for with `keep` false (a rival, an epoch's draft, a
sweep k other than evaluation's) stops when its `with` ends. Where they cannot (an accelerator: vLLM claims
most of its memory for one server), the pool holds at most one: asking for another configuration stops the
one held first, so only consecutive uses share it (the baseline and the bake-off's `none`, which the
bake-off measures first).

A key names a configuration: `ALONE`, `draft_key(checkpoint, k)` (the checkpoint train wrote, not its slim
serving copy, which evaluate rewrites when the bake-off chooses another), `rival_key(method, k)`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.vllm_server import VllmServer, accelerator_present

logger = logging.getLogger(__name__)

Context = StageContext[EvaluateParams, EvaluateTuning]

ALONE = "the verifier alone"
MIN_DEFAULT_MAX_NUM_SEQS = 128  # vLLM 0.32's smallest default (its CPU backend's, for one API server)


def server_options(params: EvaluateParams) -> list[str]:
    """--max-num-seqs where a sweep's concurrency exceeds vLLM's smallest default (none otherwise: the
    command stays the serving Deployment's); every server of the stage gets the same options."""
    largest = max(params.concurrencies or (0,)) if params.sweep is not None else 0
    return ["--max-num-seqs", str(largest)] if largest > MIN_DEFAULT_MAX_NUM_SEQS else []


def draft_key(checkpoint: Path, k: int) -> str:
    """The verifier with the draft of `checkpoint` (train's, resolved) proposing k tokens."""
    return f"draft {checkpoint.resolve()} at k={k}"


def rival_key(method: str, k: int) -> str:
    """The verifier with a training-free method (ngram, suffix) proposing k tokens."""
    return f"{method} at k={k}"


class ServerPool:
    """The stage's servers by key (see the module doc); a context manager that stops every one on exit."""

    def __init__(self, ctx: Context, together: bool | None = None) -> None:
        self.ctx = ctx
        self.together = not accelerator_present() if together is None else together
        self.servers: dict[str, VllmServer] = {}
        self.in_use: dict[str, int] = {}
        self.started = 0  # servers this pool started (the stage's log says how many it saved)
        self.reused = 0

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def serve(
        self, key: str, config: Mapping[str, Any] | None, log_name: str, keep: bool = True
    ) -> Iterator[VllmServer]:
        """The server of `key`: the one up already, else one started (speculative config `config`, its
        log `log_name` in the work directory), kept up after the `with` when `keep` (see the module doc)."""
        server = self.servers.get(key)
        if server is None:
            if not self.together:
                self._stop_all()
            server = self._start(config, log_name)
            if keep or not self.together:
                self.servers[key] = server
        else:
            self.reused += 1
            logger.info("evaluate: %s serves again for %s (log: %s)", key, log_name, server.log_path)
        self.in_use[key] = self.in_use.get(key, 0) + 1
        try:
            yield server
        finally:
            self.in_use[key] -= 1
            if key not in self.servers:
                server.stop()

    def release(self, key: str) -> None:
        """Stop the server of `key` if one is up and not in use (a bake-off's candidate that lost)."""
        server = self.servers.get(key)
        if server is not None and not self.in_use.get(key):
            del self.servers[key]
            server.stop()

    def close(self) -> None:
        self._stop_all()
        if self.reused:
            logger.info("evaluate: %d servers started, %d starts saved by reuse", self.started, self.reused)

    def _stop_all(self) -> None:
        for key in list(self.servers):
            if self.in_use.get(key):
                raise RuntimeError(f"evaluate: {key}'s server is still in use where only one fits")
            self.servers.pop(key).stop()

    def _start(self, config: Mapping[str, Any] | None, log_name: str) -> VllmServer:
        params, tuning = self.ctx.params, self.ctx.tuning
        server = VllmServer(
            self.ctx,
            params.verifier.engine(tuning.tensor_parallel_size),
            seed=tuning.seed,
            speculative_config=config,
            log_path=self.ctx.work / log_name,
            options=server_options(params),
        )
        server.start()
        self.started += 1
        return server
