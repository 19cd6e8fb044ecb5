"""A run: prompts answered once on a server, with vLLM's speculative-decoding counters' difference over it.

vLLM's counters are server-wide, not per request, so every figure evaluate reports (the main runs, each
category's, the incumbent's) is the difference of /metrics read before and after a run that asked the server
for nothing else.
"""

from __future__ import annotations

import asyncio

from eagle3_contract.api.spec import Sampling
from eagle3_contract.params import EvaluateParams, EvaluateTuning
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.requests import Measurement, Message, answer_all, read_counters, settled_counters
from eagle3_pipeline.serving.vllm_server import VllmServer

Context = StageContext[EvaluateParams, EvaluateTuning]


def counted_run(
    ctx: Context, server: VllmServer, prompts: list[list[Message]], sampling: Sampling | None, counted: bool
) -> Measurement:
    """Every prompt answered once (greedy when `sampling` is None); `counted`: with the spec-decode counters'
    difference over the run."""
    before = read_counters(server) if counted else None
    result = asyncio.run(answer_all(server, prompts, ctx.params.max_tokens, ctx.progress, sampling))
    if counted:
        after = settled_counters(server, before, result.output_tokens)
        result.counters = after - before if before is not None else after
    return result
