"""Records: an exchange's bytes parsed (on the writer's thread) into what the pipeline trains on."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .config import Exchange


def _acceptance(metrics: Any) -> dict[str, Any]:
    spec = (metrics or {}).get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return {}
    drafts, accepted = spec.get("num_draft_tokens"), spec.get("num_accepted_draft_tokens")
    return {
        "acceptanceLength": spec.get("mean_acceptance_length"),
        "draftTokens": drafts,
        "acceptedTokens": accepted,
    }


def _streamed_answer(body: bytes) -> tuple[dict[str, Any], str | None, str | None, Any]:
    """(message, finish reason, model, metrics) from a server-sent event stream of chunks."""
    content: list[str] = []
    reasoning: list[str] = []
    finish = model = metrics = None
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        chunk = json.loads(line[5:])
        model = chunk.get("model", model)
        metrics = chunk.get("metrics") or metrics
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            finish = choice.get("finish_reason") or finish
    message = {"role": "assistant", "content": "".join(content)}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    return message, finish, model, metrics


def record_of(exchange: Exchange) -> dict[str, Any] | None:
    """The record of an exchange; None for one that is not a single answered chat (an error, n > 1)."""
    if exchange.status != 200:
        return None
    request = json.loads(exchange.request)
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return None
    if (request.get("n") or 1) != 1:
        return None
    if exchange.streamed:
        message, finish, model, metrics = _streamed_answer(exchange.response)
    else:
        body = json.loads(exchange.response)
        [choice] = body.get("choices") or [None]
        if choice is None:
            return None
        got = choice.get("message") or {}
        message = {"role": "assistant", "content": got.get("content") or ""}
        if got.get("reasoning_content") or got.get("reasoning"):
            message["reasoning_content"] = got.get("reasoning_content") or got.get("reasoning")
        finish, model, metrics = choice.get("finish_reason"), body.get("model"), body.get("metrics")
    served = datetime.fromtimestamp(exchange.served_at, UTC).isoformat(timespec="milliseconds")
    return {
        "servedAt": served.replace("+00:00", "Z"),
        "model": model,
        "messages": request["messages"],
        **({"tools": request["tools"]} if isinstance(request.get("tools"), list) else {}),
        "response": message,
        "finishReason": finish,
        **_acceptance(metrics),
    }
