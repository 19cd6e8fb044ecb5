"""serving.canary's live figures, read from Prometheus before planning (the planner, canary.py, stays pure):
each track's totals over the observation window [started, now] (instant queries at `now`) and its figures in
every complete sub-window since `started`: its counters at the sub-windows' edges (one range query per
track, its step the sub-window: canary_verdict.window_seconds; canary_queries.window_counters), each
sub-window the difference of its two edges (`track_windows`). Eight queries per reconcile of an observed
canary, whatever its length."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from eagle3_contract.api.spec import Canary
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.observability.canary_queries import TPOT_COUNT, TPOT_SUM, track_matchers, track_scope
from eagle3_operator.observability.queries import ACCEPTED, DRAFTS
from eagle3_operator.prometheus import PrometheusError, query_track_edges, query_track_figures
from eagle3_operator.reconcile.canary_verdict import complete_windows, window_seconds
from eagle3_operator.reconcile.observe import CanaryFigures, Observed, TrackWindows

logger = logging.getLogger(__name__)


async def with_canary_figures(
    observed: Observed, ref: RunRef, spec: Any, known: Mapping[str, Any], now: str
) -> Observed:
    """While a canary is observed (its window started), both tracks' live figures over the window [started,
    now], in total and sub-window by sub-window; a Prometheus that cannot answer leaves them unset, with why
    (the canary keeps being observed and the decision waits)."""
    last = known.get("canary") or {}
    serving = (spec.get("serving") or {}) if isinstance(spec, Mapping) else {}
    raw = serving.get("canary") if isinstance(serving, Mapping) else None
    started, url = last.get("started"), raw.get("prometheusUrl") if isinstance(raw, Mapping) else None
    if last.get("phase") != "Observing" or observed.canary is None or not started or not url:
        return observed
    canary = Canary.model_validate(raw)
    end = datetime.fromisoformat(now)
    window = int((end - datetime.fromisoformat(started)).total_seconds())
    step, count = window_seconds(canary), complete_windows(canary, started, now)
    first = datetime.fromisoformat(started).timestamp()  # the first sub-window's first edge
    run = names.run_label(ref.name)
    at = end.timestamp()  # evaluated at `now`, as status says: the figures can be asked again and agree
    stable, new = (track_matchers(ref.namespace, run, t) for t in (names.TRACK_STABLE, names.TRACK_CANARY))
    try:
        incumbent, candidate, stable_edges, canary_edges = await asyncio.gather(
            query_track_figures(url, track_scope(ref.namespace, run, names.TRACK_STABLE, window), at),
            query_track_figures(url, track_scope(ref.namespace, run, names.TRACK_CANARY, window), at),
            query_track_edges(url, stable, first, count, step),
            query_track_edges(url, new, first, count, step),
        )
    except PrometheusError as err:
        logger.info("canary of %s/%s: no live figures: %s", ref.namespace, ref.name, err)
        return dataclasses.replace(observed, canary_figures=CanaryFigures(problem=str(err)))
    windows = track_windows(stable_edges, count), track_windows(canary_edges, count)
    figures = CanaryFigures(incumbent, candidate, *windows)
    return dataclasses.replace(observed, canary_figures=figures)


def track_windows(edges: Mapping[str, Sequence[float | None]], count: int) -> TrackWindows:
    """A track's figures in each of `count` sub-windows from its counters at their edges (edge k and k + 1
    bound sub-window k): the increases of drafts, accepted tokens and the time-per-output-token histogram's
    count and sum. A sub-window where a counter is unknown at an edge or went down (a pod restarted or left:
    its counters reset or its series ended) has no figures; one without drafts has no acceptance length, one
    without a finished request no speed (canary_verdict asks a few more of each track before pairing them).

    By hand rather than with increase(): over a sub-window of a few scrapes increase() leaves out what a
    counter gained between the last scrape before it and the first in it, and extrapolates the rest
    (canary_queries); the differences of the counters' own values at the edges tile the observation."""
    drafts, accepted, finished, seconds = (
        _increases(edges.get(name, ()), count) for name in (DRAFTS, ACCEPTED, TPOT_COUNT, TPOT_SUM)
    )
    length: list[float | None] = []
    speed: list[float | None] = []
    requests: list[int | None] = []
    for d, a, n, s in zip(drafts, accepted, finished, seconds, strict=True):
        length.append(round(1.0 + a / d, 4) if d and a is not None else None)
        speed.append(round(n / s, 3) if n and s else None)
        requests.append(round(n) if n is not None else None)
    return TrackWindows(tuple(length), tuple(speed), tuple(requests))


def _increases(values: Sequence[float | None], count: int) -> list[float | None]:
    edges = [*values[: count + 1], *[None] * (count + 1 - len(values))]
    out: list[float | None] = []
    for before, after in itertools.pairwise(edges):
        known = before is not None and after is not None and after >= before
        out.append(after - before if known and after is not None and before is not None else None)
    return out
