"""The evaluate stage's requests to a vLLM server and its speculative-decoding counters around them.

`answer_all` answers every prompt through vLLM's OpenAI-compatible chat API (/v1/chat/completions, never the
raw /v1/completions: vLLM renders each conversation with the verifier's own chat template, as serving
traffic is), CONCURRENCY requests in flight: greedily (temperature 0) or with the serving traffic's sampling
settings (`evaluation.sampling`: vLLM's SamplingParams temperature, top_p, top_k and a per-request seed); a
failed request is recorded, not raised. It keeps the token ids vLLM returns (`return_token_ids`): the
prompt as vLLM rendered and tokenized it, and the answer's tokens (what `eagle3_pipeline.serving.degenerate`
judges).
`read_counters` and `settled_counters` read the server's `vllm:spec_decode_*` counters from `/metrics`
(`eagle3_pipeline.serving.spec_metrics`) before and after a run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.api.spec import Sampling
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.reporter import StageReporter
from eagle3_pipeline.serving.degenerate import Screening
from eagle3_pipeline.serving.spec_metrics import SpecDecodeCounters, parse_counters
from eagle3_pipeline.serving.vllm_server import VllmServer

Message = dict[str, str]
CONCURRENCY = 8
REQUEST_TIMEOUT_S = 3600.0
METRICS_POLL_S = 0.5
METRICS_SETTLE_S = 30.0  # the server records a step's counters as it returns the step's tokens


@dataclass
class Measurement:
    """One server's run over the prompts."""

    outputs: list[str | None]
    output_tokens: int = 0
    seconds: float = 0.0
    server_start_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    counters: SpecDecodeCounters | None = None  # the difference over the run; None without a draft
    # the token ids vLLM returned per prompt: the rendered prompt's and the answer's (None: failed)
    prompt_token_ids: list[list[int] | None] = field(default_factory=list)
    token_ids: list[list[int] | None] = field(default_factory=list)
    # the verifier's greedy answers to every prompt judged (eagle3_pipeline.serving.degenerate): set on the
    # run of the server that screened them; `screened` is that pass when this run measured the kept prompts
    # again
    screening: Screening | None = None
    screened: Measurement | None = None
    sampled: Measurement | None = None  # the draft server's second run, at evaluation.sampling

    @property
    def tokens_per_second(self) -> float | None:
        return self.output_tokens / self.seconds if self.seconds > 0 else None


def request_options(sampling: Sampling | None) -> dict[str, Any]:
    """The OpenAI request's sampling arguments: greedy (temperature 0), or vLLM's SamplingParams
    temperature, top_p, top_k (vLLM's extra parameter) and a per-request seed; vLLM returns the prompt's
    and the answer's token ids with either."""
    if sampling is None:
        return {"temperature": 0.0, "extra_body": {"return_token_ids": True}}
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "extra_body": {"top_k": sampling.top_k, "return_token_ids": True},
    }


def read_counters(server: VllmServer) -> SpecDecodeCounters | None:
    import httpx

    try:
        response = httpx.get(server.root_url + "/metrics", timeout=30.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        server.check()
        raise StageError(f"cannot read the vLLM server's /metrics ({exc})") from None
    return parse_counters(response.text, server.model_name)


def settled_counters(
    server: VllmServer, before: SpecDecodeCounters | None, tokens: int
) -> SpecDecodeCounters:
    """The counters once they count every token returned (the server records them as it returns tokens)."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    while True:
        after = read_counters(server)
        if after is None:
            raise StageError(
                "the vLLM server with the draft exports no vllm:spec_decode_* counters at /metrics: "
                "speculative decoding is not active (see its log for the speculative config it read)"
            )
        generated = after.generation_tokens - (before.generation_tokens if before else 0.0)
        if generated >= tokens or time.monotonic() > deadline:
            return after
        time.sleep(METRICS_POLL_S)


async def answer_all(
    server: VllmServer,
    prompts: list[list[Message]],
    max_tokens: int,
    progress: StageReporter | None = None,
    sampling: Sampling | None = None,
    concurrency: int = CONCURRENCY,
) -> Measurement:
    """Answers to every prompt (greedy, or with `sampling`), `concurrency` in flight; a failed request is
    recorded, not raised."""
    import openai
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=2, timeout=REQUEST_TIMEOUT_S)
    semaphore = asyncio.Semaphore(concurrency)
    result = Measurement(
        outputs=[None] * len(prompts),
        prompt_token_ids=[None] * len(prompts),
        token_ids=[None] * len(prompts),
    )
    options = request_options(sampling)

    async def one(index: int, messages: list[Message]) -> None:
        async with semaphore:
            try:
                response = await client.chat.completions.create(
                    model=server.model_name,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=max_tokens,
                    **options,
                )
            except openai.APIError as exc:
                result.failures.append(f"prompt {index}: {type(exc).__name__}: {exc}")
                if progress is not None:
                    progress.advance()
                    progress.fail("request")
                return
        result.outputs[index] = response.choices[0].message.content or ""
        result.prompt_token_ids[index] = (response.model_extra or {}).get("prompt_token_ids")
        result.token_ids[index] = (response.choices[0].model_extra or {}).get("token_ids")
        tokens = response.usage.completion_tokens if response.usage else 0
        result.output_tokens += tokens
        if progress is not None:
            progress.advance(1, tokens)

    started = time.monotonic()
    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    finally:
        await client.close()
    result.seconds = time.monotonic() - started
    return result
