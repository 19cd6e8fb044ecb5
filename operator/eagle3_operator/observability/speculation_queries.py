"""The dashboard's canary and speculation-length expressions, as pure functions of a `queries.Scope`.

Live, by `track` (the PodMonitor's target label: `stable` for the incumbent's pods, `canary` for the canary
Deployment's), from vLLM's series: the two figures the operator decides on are canary_queries' own
expressions (mean acceptance length, output tokens/s of a request), over the dashboard's rate interval
instead of the canary's observation window, and the finished requests per second.
The operator's own series (speculation_metrics): the figures it decided on (status.canary), its phase, and
evaluate's sweep (status.checkpoint.speculation) with the schedule it justifies, and its acceptance per
category (status.checkpoint.categories).
"""

from __future__ import annotations

from dataclasses import replace

from eagle3_operator.observability import canary_queries as cq
from eagle3_operator.observability import queries as q
from eagle3_operator.observability.queries import DASHBOARD, Scope, selector

TPOT_COUNT = cq.TPOT_COUNT
TPOT_SUM = cq.TPOT_SUM
REQUEST_SUCCESS = cq.REQUEST_SUCCESS

CANARY_PHASE = "eagle3_run_canary_phase"
CANARY_LENGTH = "eagle3_run_canary_acceptance_length"
CANARY_SPEED = "eagle3_run_canary_output_tokens_per_second"
CANARY_REQUESTS = "eagle3_run_canary_requests"
CANARY_DECISION = "eagle3_run_canary_decision_seconds"
CANARY_RATIO = "eagle3_run_canary_ratio"
SWEEP_LENGTH = "eagle3_run_sweep_acceptance_length"
SWEEP_SPEED = "eagle3_run_sweep_output_tokens_per_second"
SWEEP_SPEEDUP = "eagle3_run_sweep_speedup"
SPECULATION_LENGTH = "eagle3_run_speculation_length"
EVALUATED_SPEEDUP = "eagle3_run_speedup"
CHOICE_LENGTH = "eagle3_run_choice_acceptance_length"
CHOICE_SPEED = "eagle3_run_choice_output_tokens_per_second"
CATEGORY_LENGTH = "eagle3_run_category_acceptance_length"
CATEGORY_RATE = "eagle3_run_category_acceptance_rate"
CATEGORY_SPEEDUP = "eagle3_run_category_speedup"

TRACK_BY = cq.TRACK_BY
TRACKED = f'{cq.TRACK_LABEL}!=""'  # series the canary's PodMonitor labelled (a scrape without it has none)
CELL_BY = f"{q.LIVE_BY}, k, concurrency"
RANGE_BY = f"{q.LIVE_BY}, min_batch_size, max_batch_size"
CHOICE_BY = f"{q.LIVE_BY}, draft, chosen"
CATEGORY_BY = f"{q.LIVE_BY}, category"


def tracked(s: Scope) -> Scope:
    """`s` with its vLLM matchers limited to series that have a track."""
    return replace(s, vllm=", ".join(m for m in (s.vllm, TRACKED) if m))


# --- Live, by track (vLLM). ---------------------------------------------------------------------------------
def track_acceptance_length(s: Scope = DASHBOARD) -> str:
    """1 + accepted tokens / drafts, per run and track (the operator's expression, canary_queries)."""
    return cq.acceptance_length(tracked(s), by=TRACK_BY)


def track_output_tokens_per_second(s: Scope = DASHBOARD) -> str:
    """Output tokens per second of one request (1 / its mean time per output token), per run and track."""
    return cq.output_tokens_per_second(tracked(s), by=TRACK_BY)


def track_requests_per_second(s: Scope = DASHBOARD) -> str:
    """Finished requests per second, per run and track."""
    t = tracked(s)
    return f"sum by ({TRACK_BY}) (rate({selector(REQUEST_SUCCESS, t.vllm)}[{t.window}]))"


# --- The operator's decision (status.canary). ---------------------------------------------------------------
def canary_phase(s: Scope = DASHBOARD) -> str:
    """The canary's current phase, one series per run (its `phase` label)."""
    return f"max by ({q.LIVE_BY}, phase) ({selector(CANARY_PHASE, s.run)}) == 1"


def canary_figure(metric: str, s: Scope = DASHBOARD) -> str:
    """One of the figures the operator read over the canary's window, per run and track."""
    return f"max by ({TRACK_BY}) ({selector(metric, s.run)})"


def canary_ratio(s: Scope = DASHBOARD) -> str:
    """The canary over the incumbent per figure: the median ratio and its interval's bounds (`bound`)."""
    return f"max by ({q.LIVE_BY}, figure, bound) ({selector(CANARY_RATIO, s.run)})"


def canary_decision_seconds(s: Scope = DASHBOARD) -> str:
    return f"max by ({q.LIVE_BY}) ({selector(CANARY_DECISION, s.run)})"


# --- evaluate's sweep (status.checkpoint.speculation). ------------------------------------------------------
def sweep_cells(metric: str, s: Scope = DASHBOARD) -> str:
    """One figure of every k by concurrency cell (k 0: the verifier alone), per run."""
    return f"max by ({CELL_BY}) ({selector(metric, s.evaluated)})"


def evaluated_speedup(s: Scope = DASHBOARD) -> str:
    """evaluate's headline speedup, with the k and the concurrency it was measured at, per run."""
    return f"max by ({CELL_BY}) ({selector(EVALUATED_SPEEDUP, s.evaluated)})"


def speculation_schedule(s: Scope = DASHBOARD) -> str:
    """The tuned k per batch-size range (0: speculation off), per run."""
    return f"max by ({RANGE_BY}) ({selector(SPECULATION_LENGTH, s.evaluated)})"


# --- evaluate's choice among drafts (draft.candidates, training.checkpointSelection). ----------------------
def choice(metric: str, s: Scope = DASHBOARD) -> str:
    """One figure of every draft evaluate chose from, per run (`chosen` 1: the one exported)."""
    return f"max by ({CHOICE_BY}) ({selector(metric, s.evaluated)})"


# --- evaluate's acceptance per category (status.checkpoint.categories). -----------------------------------
def category(metric: str, s: Scope = DASHBOARD) -> str:
    """One figure of every category of the held-out prompts, per run."""
    return f"max by ({CATEGORY_BY}) ({selector(metric, s.evaluated)})"
