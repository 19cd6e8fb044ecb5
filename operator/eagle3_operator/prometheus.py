"""The one module that talks to Prometheus: instant and range queries over its HTTP API (GET /api/v1/query,
/api/v1/query_range).

serving.canary reads each track's live figures here before planning (the planner stays pure): its totals over
the observation window (instant queries) and its counters at every sub-window's edge (one range query per
track whose step is the sub-window, canary_queries.window_counters). A few lines of aiohttp (which kopf
already depends on) rather than a client library: prometheus-api-client pulls pandas and matplotlib into the
operator's image and is synchronous (it would block kopf's event loop), and the other clients add nothing this
small query needs.

Every call is bounded (QUERY_SECONDS): an unreachable Prometheus costs a reconcile seconds, never holds it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import aiohttp

from eagle3_contract.api.status import TrackFigures
from eagle3_operator.observability import canary_queries
from eagle3_operator.observability.queries import Scope

logger = logging.getLogger(__name__)
QUERY_PATH = "/api/v1/query"
RANGE_PATH = "/api/v1/query_range"
QUERY_SECONDS = 10.0


class PrometheusError(Exception):
    """A query that got no usable answer: what failed, where, and what to check."""


async def query_vector(
    url: str, expr: str, at: float | None = None, timeout_seconds: float = QUERY_SECONDS
) -> list[dict[str, Any]]:
    """The instant vector `expr` evaluates to (at `at`, a Unix time, else now): Prometheus's result list,
    each `{"metric": {...}, "value": [time, "text"]}`. PrometheusError when it cannot be read."""
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    return await _query(url, QUERY_PATH, params, "vector", timeout_seconds)


async def query_matrix(
    url: str, expr: str, start: float, end: float, step: float, timeout_seconds: float = QUERY_SECONDS
) -> list[dict[str, Any]]:
    """The range query of `expr` at start, start + step, ... up to end (Unix times): Prometheus's result
    list, each `{"metric": {...}, "values": [[time, "text"], ...]}`. PrometheusError when it cannot be
    read."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
    return await _query(url, RANGE_PATH, params, "matrix", timeout_seconds)


async def _query(
    url: str, path: str, params: dict[str, str], kind: str, timeout_seconds: float
) -> list[dict[str, Any]]:
    endpoint = url.rstrip("/") + path
    timeout = aiohttp.ClientTimeout(total=timeout_seconds)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(endpoint, params=params) as response,
        ):
            text = await response.text()
            try:
                answer = await response.json(content_type=None)
            except ValueError:
                answer = None
    except (aiohttp.ClientError, TimeoutError) as err:
        why = "no answer in time" if isinstance(err, TimeoutError) else f"{type(err).__name__}: {err}"
        raise PrometheusError(
            f"Prometheus at {url} does not answer ({why}); check serving.canary.prometheusUrl or the "
            "operator's --prometheus-url, and that the operator can reach it"
        ) from None
    return _result(url, response.status, answer, text, kind, path)


def _result(url: str, status: int, answer: Any, text: str, kind: str, path: str) -> list[dict[str, Any]]:
    if not isinstance(answer, dict):
        raise PrometheusError(
            f"Prometheus at {url} answered HTTP {status} with no JSON ({text[:200]!r}); is {url} a "
            f"Prometheus server's base URL (its {path})?"
        )
    if answer.get("status") != "success":
        raise PrometheusError(
            f"Prometheus at {url} refused the query (HTTP {status}, {answer.get('errorType')}: "
            f"{answer.get('error')})"
        )
    data = answer.get("data") or {}
    if data.get("resultType") != kind:
        raise PrometheusError(f"Prometheus at {url} answered a {data.get('resultType')}, not a {kind}")
    result: list[dict[str, Any]] = list(data.get("result") or [])
    return result


async def query_value(
    url: str, expr: str, at: float | None = None, timeout_seconds: float = QUERY_SECONDS
) -> float | None:
    """The value of a one-series `expr`; None when it has no series yet or is not a number (0/0)."""
    for series in await query_vector(url, expr, at, timeout_seconds):
        value = float(series["value"][1])
        return value if math.isfinite(value) else None
    return None


async def query_track_figures(
    url: str, scope: Scope, at: float | None = None, timeout_seconds: float = QUERY_SECONDS
) -> TrackFigures:
    """One track's mean acceptance length, output tokens/s per request and finished requests over the
    scope's window (canary_queries); a figure with no data yet is None."""
    length, speed, requests = await asyncio.gather(
        query_value(url, canary_queries.acceptance_length(scope), at, timeout_seconds),
        query_value(url, canary_queries.output_tokens_per_second(scope), at, timeout_seconds),
        query_value(url, canary_queries.finished_requests(scope), at, timeout_seconds),
    )
    return TrackFigures(
        acceptance_length=round(length, 4) if length is not None else None,
        output_tokens_per_second=round(speed, 3) if speed is not None else None,
        requests=round(requests) if requests is not None else None,
    )


async def query_edges(
    url: str, expr: str, start: float, count: int, step: float, timeout_seconds: float = QUERY_SECONDS
) -> dict[str, tuple[float | None, ...]]:
    """Each series of `expr`, by its `__name__`: its value at start, start + step, ... start + count * step
    (the edges of `count` sub-windows; a counter's value there is its last sample at or before it), None
    where it had none (no sample yet, or not a number)."""
    if count < 1:
        return {}
    out: dict[str, list[float | None]] = {}
    for series in await query_matrix(url, expr, start, start + count * step, step, timeout_seconds):
        values = out.setdefault(str((series.get("metric") or {}).get("__name__", "")), [None] * (count + 1))
        for at, text in series.get("values") or []:
            index, value = round((float(at) - start) / step), float(text)
            if 0 <= index <= count and math.isfinite(value):
                values[index] = value
    return {name: tuple(values) for name, values in out.items()}


async def query_track_edges(
    url: str, matchers: str, start: float, count: int, step: float, timeout_seconds: float = QUERY_SECONDS
) -> dict[str, tuple[float | None, ...]]:
    """One track's canary_queries.WINDOW_COUNTERS at the edges of `count` sub-windows of `step` seconds, the
    first starting at `start` (query_edges): the differences of consecutive edges are the sub-windows'."""
    return await query_edges(
        url, canary_queries.window_counters(matchers), start, count, step, timeout_seconds
    )
