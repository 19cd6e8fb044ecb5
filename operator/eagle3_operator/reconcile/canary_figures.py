"""serving.canary's live figures, read from Prometheus before planning (the planner, canary.py, stays pure):
each track's totals over the observation window [started, now] (instant queries at `now`) and its figures in
every complete sub-window since `started` (one range query per figure and track, its step the sub-window:
canary_verdict.window_seconds). Ten queries per reconcile of an observed canary, whatever its length."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from eagle3_contract.api.spec import Canary
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.observability.canary_queries import track_scope
from eagle3_operator.prometheus import PrometheusError, query_track_figures, query_track_windows
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
    first = datetime.fromisoformat(started).timestamp() + step  # the end of the first sub-window
    run = names.run_label(ref.name)
    at = end.timestamp()  # evaluated at `now`, as status says: the figures can be asked again and agree
    try:
        incumbent, candidate, stable_windows, canary_windows = await asyncio.gather(
            query_track_figures(url, track_scope(ref.namespace, run, names.TRACK_STABLE, window), at),
            query_track_figures(url, track_scope(ref.namespace, run, names.TRACK_CANARY, window), at),
            _windows(url, track_scope(ref.namespace, run, names.TRACK_STABLE, step), first, count, step),
            _windows(url, track_scope(ref.namespace, run, names.TRACK_CANARY, step), first, count, step),
        )
    except PrometheusError as err:
        logger.info("canary of %s/%s: no live figures: %s", ref.namespace, ref.name, err)
        return dataclasses.replace(observed, canary_figures=CanaryFigures(problem=str(err)))
    figures = CanaryFigures(incumbent, candidate, stable_windows, canary_windows)
    return dataclasses.replace(observed, canary_figures=figures)


async def _windows(url: str, scope: Any, first: float, count: int, step: float) -> TrackWindows:
    length, speed = await query_track_windows(url, scope, first, count, step)
    return TrackWindows(acceptance_length=length, output_tokens_per_second=speed)
