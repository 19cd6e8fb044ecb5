"""PromQL of serving.canary: each track's live figures over a window, as pure functions of a `Scope`.

The run's PodMonitor labels every vLLM series with `track`: `canary` on the canary Deployment's pods,
`stable` on the incumbent's (builders/serving.py). The operator reads one track at a time over the
observation window (`track_scope`: namespace, run and track matchers, a window of N seconds); a dashboard
passes its own Scope and groups by TRACK_BY to draw the tracks side by side.

  mean acceptance length    = 1 + accepted tokens / drafts
  output tokens/s (request) = 1 / vLLM's mean time per output token of a request: its histogram's
                              count / sum. A per-request speed, so it does not depend on how the Service
                              splits the traffic between the tracks (a total tokens/s would).
  finished requests         = increase of vllm:request_success_total (every finish reason)

The decision compares the tracks sub-window by sub-window on the same figures, but not through rate() or
increase(): over a sub-window of a few scrapes those drop whatever a counter gained between the last scrape
before the sub-window and the first one in it, and extrapolate the rest to the sub-window's edges. One run of
the Prometheus tier (1 s scrapes, 7 s sub-windows, four requests a wave): a sub-window whose raw counters
finished 7 requests at 5.98 output tokens/s per request read as 167 through rate(), because the three slow
ones finished in that gap; others read as no request at all. So `window_counters` asks for the counters
themselves, summed per counter over the track's pods, in one range query whose points are the sub-windows'
edges; each sub-window is the difference of its edges (eagle3_operator.prometheus.query_edges,
reconcile.canary_figures): every increase counts in exactly one sub-window, with no extrapolation, and a
sub-window's finished requests are a whole number.
"""

from __future__ import annotations

from eagle3_operator.observability.queries import ACCEPTED, DRAFTS, Scope, selector

TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"
TPOT_COUNT = f"{TIME_PER_OUTPUT_TOKEN}_count"  # requests finished (one observation each)
TPOT_SUM = f"{TIME_PER_OUTPUT_TOKEN}_sum"
# the counters a sub-window's figures are differences of (window_counters)
WINDOW_COUNTERS = (DRAFTS, ACCEPTED, TPOT_COUNT, TPOT_SUM)
REQUEST_SUCCESS = "vllm:request_success_total"
TRACK_LABEL = "track"  # the PodMonitor's target label (eagle3.dev/track of the pod, else `stable`)
TRACK_BY = "namespace, run, track"


def track_matchers(namespace: str, run: str, track: str) -> str:
    """The vLLM matchers of one run's track (values as the PodMonitor writes them)."""
    return f'namespace="{_quoted(namespace)}", run="{_quoted(run)}", {TRACK_LABEL}="{_quoted(track)}"'


def track_scope(namespace: str, run: str, track: str, window_seconds: float) -> Scope:
    """One track of one run over the last `window_seconds` (the canary's observation window, or one of its
    sub-windows: whole milliseconds, 1 s at the least)."""
    return Scope(vllm=track_matchers(namespace, run, track), window=range_text(window_seconds))


def range_text(seconds: float) -> str:
    """A PromQL range of `seconds`: `600s`, or `3333ms` where it is not whole seconds (1 s at the least)."""
    millis = max(1000, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _sum(function: str, metric: str, s: Scope, by: str) -> str:
    return f"sum by ({by}) ({function}({selector(metric, s.vllm)}[{s.window}]))"


def acceptance_length(s: Scope, by: str = TRACK_BY) -> str:
    """Mean acceptance length over the window: 1 + accepted tokens / drafts."""
    return f"1 + {_sum('increase', ACCEPTED, s, by)} / {_sum('increase', DRAFTS, s, by)}"


def output_tokens_per_second(s: Scope, by: str = TRACK_BY) -> str:
    """Output tokens per second of a request while it decodes: 1 / the mean time per output token."""
    count = _sum("rate", TPOT_COUNT, s, by)
    total = _sum("rate", TPOT_SUM, s, by)
    return f"{count} / {total}"


def finished_requests(s: Scope, by: str = TRACK_BY) -> str:
    """Requests finished over the window (every finish reason)."""
    return _sum("increase", REQUEST_SUCCESS, s, by)


def window_counters(matchers: str) -> str:
    """WINDOW_COUNTERS of the series `matchers` select (one track), each summed over the track's pods and
    named by its `__name__`: asked as a range query whose points are the sub-windows' edges."""
    names = "|".join(WINDOW_COUNTERS)  # vLLM's names hold no regular-expression metacharacter but `:`
    return f'sum by (__name__) ({{__name__=~"{names}", {matchers}}})'
