"""Every PromQL expression of the dashboard and of the alerting rules, as pure functions of a `Scope`.

A `Scope` holds the label matchers put on each family of series and the range of the `rate()`s:
`DASHBOARD` uses Grafana's template variables ($namespace, $model, $run) and `$__rate_interval`; the alerts
use `ALERTS`, with no matchers and fixed windows (`scoped(window)`). The same function renders the dashboard's
panel and the alert's expression, and the tests evaluate exactly what users see.

The arithmetic of speculative decoding, from vLLM's counters (one draft = one proposal of k tokens):
  acceptance rate          = accepted tokens / draft tokens           (in [0, 1])
  mean acceptance length   = 1 + accepted tokens / drafts             (tokens per verifier step, [1, k + 1])
  acceptance at position i = accepted tokens at position i / drafts   (in [0, 1], non-increasing in i)
draft tokens / drafts is just k, the number of speculative tokens: no query divides those two.
Live series are summed per (namespace, run): one line per serving run (its vLLM replicas and engines summed).
The stage programs' live progress (training, stage throughput) is in `progress_queries`, on the same Scope.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# --- Metric names (vLLM 0.32 and the operator, see docs/metrics.md). ----------------------------------------
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"

RECONCILE_BUCKET = "eagle3_operator_reconcile_duration_seconds_bucket"
RUNS = "eagle3_operator_runs"
STAGE_DURATION_BUCKET = "eagle3_operator_stage_duration_seconds_bucket"
STAGE_ATTEMPTS = "eagle3_operator_stage_attempts_total"
STAGE_FAILURES = "eagle3_operator_stage_failures_total"
LAST_FAILURE = "eagle3_run_stage_last_failure_timestamp_seconds"
STAGE_STARTED = "eagle3_run_stage_started_timestamp_seconds"
STAGE_EXPECTED = "eagle3_run_stage_expected_seconds"
ETA = "eagle3_stage_eta_seconds"  # a stage pod's (see progress_queries): the live ETA of the expected time
POD_BLOCKED = "eagle3_run_pod_blocked"
EVALUATED_LENGTH = "eagle3_run_acceptance_length"  # label sampling: greedy, or sampled (evaluation.sampling)
EVALUATED_RATE = "eagle3_run_acceptance_rate"
EVALUATED_BY_POSITION = "eagle3_run_acceptance_by_position"
EVALUATED_SPEEDUP = "eagle3_run_speedup"
RUN_PHASE = "eagle3_run_phase"
VALIDATION_LOSS = "eagle3_run_validation_loss"
HIDDEN_STATE_BYTES = "eagle3_run_hidden_state_bytes"
TOKENS_PROCESSED = "eagle3_run_tokens_processed"
SERVING_DRAFT_INFO = "eagle3_serving_draft_info"
CAPTURE_RECORDS = "eagle3_capture_records_total"  # serving.capture, on vLLM's /metrics: label outcome
CAPTURE_BYTES = "eagle3_capture_bytes_total"
ROLLOUT_TIMESTAMP = "eagle3_serving_draft_rollout_timestamp_seconds"


OOM_REASON = "OutOfMemory"
LIVE_BY = "namespace, run"  # the grouping of every live (vLLM) series, and the join key with the operator's
STAGE_BY = "namespace, run, stage"  # a run's stage: the operator's per-stage series and the stage pods'


@dataclass(frozen=True)
class Scope:
    """The matchers (without braces) for each family of series, and the range of the rates."""

    vllm: str = ""  # vLLM series: namespace, model_name, run
    run: str = ""  # the operator's per-run series and the stage pods': namespace, run
    evaluated: str = ""  # the operator's per-run series that carry `model`: namespace, run, model
    namespace: str = ""  # the operator's series without a run label: namespace
    window: str = "5m"


DASHBOARD = Scope(
    vllm='namespace=~"$namespace", model_name=~"$model", run=~"$run"',
    run='namespace=~"$namespace", run=~"$run"',
    evaluated='namespace=~"$namespace", run=~"$run", model=~"$model"',
    namespace='namespace=~"$namespace"',
    window="$__rate_interval",
)
ALERTS = Scope()


def scoped(window: str, scope: Scope = ALERTS) -> Scope:
    """`scope` with another rate window (the alerts' fixed windows)."""
    return replace(scope, window=window)


def selector(metric: str, matchers: str = "", extra: str = "") -> str:
    """`metric{matchers, extra}` (bare `metric` when there are none)."""
    inner = ", ".join(m for m in (matchers, extra) if m)
    return f"{metric}{{{inner}}}" if inner else metric


def sum_rate(metric: str, s: Scope, by: str = LIVE_BY) -> str:
    return f"sum by ({by}) (rate({selector(metric, s.vllm)}[{s.window}]))"


# --- Speculative decoding (live, from vLLM). ----------------------------------------------------------------
def acceptance_rate(s: Scope = DASHBOARD) -> str:
    """Accepted draft tokens / proposed draft tokens."""
    return f"{sum_rate(ACCEPTED, s)} / {sum_rate(DRAFT_TOKENS, s)}"


def mean_acceptance_length(s: Scope = DASHBOARD) -> str:
    """1 + accepted tokens / drafts: tokens produced per verifier forward pass."""
    return f"1 + {sum_rate(ACCEPTED, s)} / {sum_rate(DRAFTS, s)}"


def acceptance_by_position(s: Scope = DASHBOARD) -> str:
    """Accepted tokens at draft position i / drafts (one series per run and position)."""
    per_pos = sum_rate(ACCEPTED_PER_POS, s, by=f"{LIVE_BY}, position")
    return f"{per_pos} / on ({LIVE_BY}) group_left () {sum_rate(DRAFTS, s)}"


def accepted_tokens_per_second(s: Scope = DASHBOARD) -> str:
    return sum_rate(ACCEPTED, s)


def generation_tokens_per_second(s: Scope = DASHBOARD) -> str:
    return sum_rate(GENERATION_TOKENS, s)


def prompt_tokens_per_second(s: Scope = DASHBOARD) -> str:
    return sum_rate(PROMPT_TOKENS, s)


def drafts_per_second(s: Scope = DASHBOARD) -> str:
    return sum_rate(DRAFTS, s)


def _latency_quantile(bucket: str, q: float, s: Scope) -> str:
    return f"histogram_quantile({q}, {sum_rate(bucket, s, by=f'{LIVE_BY}, le')})"


def ttft_quantile(q: float, s: Scope = DASHBOARD) -> str:
    """Time to first token, quantile q (0.5, 0.95) over the window."""
    return _latency_quantile(TTFT_BUCKET, q, s)


def itl_quantile(q: float, s: Scope = DASHBOARD) -> str:
    """Inter-token latency, quantile q over the window."""
    return _latency_quantile(ITL_BUCKET, q, s)


def requests_running(s: Scope = DASHBOARD) -> str:
    return f"sum by ({LIVE_BY}) ({selector(REQUESTS_RUNNING, s.vllm)})"


def requests_waiting(s: Scope = DASHBOARD) -> str:
    return f"sum by ({LIVE_BY}) ({selector(REQUESTS_WAITING, s.vllm)})"


def kv_cache_usage(s: Scope = DASHBOARD) -> str:
    """The fullest KV cache among a run's replicas (a fraction, 1 = full)."""
    return f"max by ({LIVE_BY}) ({selector(KV_CACHE_USAGE, s.vllm)})"


# --- serving.capture (the capture package, on vLLM's /metrics: the run's labels, no model_name). -----------
def captured_records_per_second(s: Scope = DASHBOARD) -> str:
    return f"sum by ({LIVE_BY}, outcome) (rate({selector(CAPTURE_RECORDS, s.run)}[{s.window}]))"


def captured_bytes_per_second(s: Scope = DASHBOARD) -> str:
    return f"sum by ({LIVE_BY}) (rate({selector(CAPTURE_BYTES, s.run)}[{s.window}]))"


# --- The evaluated acceptance (operator) beside the live one. -----------------------------------------------
GREEDY, SAMPLED = 'sampling="greedy"', 'sampling="sampled"'


def evaluated_acceptance_length(s: Scope = DASHBOARD) -> str:
    """The evaluated mean acceptance length the live (sampled) traffic compares with, like for like: the
    measurement at evaluation.sampling where the run has one, else the greedy one; its `sampling` label says
    which."""
    by = f"{LIVE_BY}, sampling"
    sampled = f"max by ({by}) ({selector(EVALUATED_LENGTH, s.evaluated, SAMPLED)})"
    greedy = f"max by ({by}) ({selector(EVALUATED_LENGTH, s.evaluated, GREEDY)})"
    return f"({sampled} or on ({LIVE_BY}) {greedy})"


def evaluated_acceptance_lengths(s: Scope = DASHBOARD) -> str:
    """Every evaluated mean acceptance length of each run: greedy and (where measured) sampled."""
    return f"max by ({LIVE_BY}, sampling) ({selector(EVALUATED_LENGTH, s.evaluated)})"


def evaluated_acceptance_rate(s: Scope = DASHBOARD) -> str:
    return f"max by ({LIVE_BY}, sampling) ({selector(EVALUATED_RATE, s.evaluated)})"


def evaluated_acceptance_by_position(s: Scope = DASHBOARD) -> str:
    """The evaluated acceptance at each draft position, greedy and (where measured) sampled."""
    return f"max by ({LIVE_BY}, sampling, position) ({selector(EVALUATED_BY_POSITION, s.evaluated)})"


def evaluated_speedup(s: Scope = DASHBOARD) -> str:
    """Evaluated output tokens per second with the draft / without (greedy)."""
    return f"max by ({LIVE_BY}) ({selector(EVALUATED_SPEEDUP, s.evaluated)})"


def live_over_evaluated(s: Scope = DASHBOARD) -> str:
    """Live mean acceptance length / the serving run's evaluated one, like for like (1 = as evaluated)."""
    return f"({mean_acceptance_length(s)}) / on ({LIVE_BY}) {evaluated_acceptance_length(s)}"


def rollout_annotation(s: Scope = DASHBOARD) -> str:
    """Rollout time in ms (Grafana's "series value as timestamp"), with the info metric's checkpoint."""
    rollout = selector(ROLLOUT_TIMESTAMP, s.run)
    info = selector(SERVING_DRAFT_INFO, s.evaluated)
    return f"1000 * {rollout} * on (namespace, run, sha256) group_left (model, checkpoint) {info}"


# --- The pipeline (operator). -------------------------------------------------------------------------------
def runs_by_phase(s: Scope = DASHBOARD) -> str:
    return f"sum by (phase) ({selector(RUNS, s.namespace)})"


def stage_duration_quantile(q: float, s: Scope = DASHBOARD) -> str:
    """Quantile q of finished stages' durations by stage, over every stage since the operator started.

    Cumulative on purpose: stages finish a few times a day, so a rate over minutes would mostly be empty.
    """
    return f"histogram_quantile({q}, sum by (stage, le) ({selector(STAGE_DURATION_BUCKET, s.namespace)}))"


def stage_attempts(s: Scope = DASHBOARD) -> str:
    """Stage Jobs started per run and stage (OOM retries included)."""
    return f"sum by (namespace, run, stage) ({selector(STAGE_ATTEMPTS, s.run)})"


def stage_failures(s: Scope = DASHBOARD) -> str:
    """Failed stage Job attempts per run, stage and reason."""
    return f"sum by (namespace, run, stage, reason) ({selector(STAGE_FAILURES, s.run)})"


def stage_expected_seconds(s: Scope = DASHBOARD) -> str:
    """How long the running stage's current attempt should take in all: its elapsed time plus the ETA its
    pod reports, where it reports one; else the operator's expected seconds (activeDeadlineSeconds or the
    default). Labels: the operator's (namespace, run, stage)."""
    elapsed = f"(time() - {selector(STAGE_STARTED, s.run)})"
    eta = f"max by ({STAGE_BY}) ({selector(ETA, s.run)})"
    # `+ on (...)` keeps only those labels: the fallback is reduced to them too, so that `or` drops it where
    # an ETA exists (the operator's series also carry its scrape's job and instance)
    expected = f"max by ({STAGE_BY}) ({selector(STAGE_EXPECTED, s.run)})"
    return f"{elapsed} + on ({STAGE_BY}) {eta} or {expected}"


def stage_elapsed_fraction(s: Scope = DASHBOARD) -> str:
    """Time the running stage's current attempt has taken / its expected time (`stage_expected_seconds`):
    with a live ETA the share of the attempt done by time, else > 1 when overdue."""
    started = selector(STAGE_STARTED, s.run)
    return f"(time() - {started}) / on ({STAGE_BY}) ({stage_expected_seconds(s)})"


def pods_blocked(s: Scope = DASHBOARD) -> str:
    """Pods that do not run, by run, stage (serve: vLLM) and reason (ImagePullBackOff, Unschedulable, ...)."""
    return f"max by (namespace, run, stage, reason) ({selector(POD_BLOCKED, s.run)})"


def validation_loss(s: Scope = DASHBOARD) -> str:
    return f"max by ({LIVE_BY}) ({selector(VALIDATION_LOSS, s.run)})"


def hidden_state_bytes(s: Scope = DASHBOARD) -> str:
    return f"max by ({LIVE_BY}) ({selector(HIDDEN_STATE_BYTES, s.run)})"


def tokens_processed(s: Scope = DASHBOARD) -> str:
    return f"max by (namespace, run, stage) ({selector(TOKENS_PROCESSED, s.run)})"


def reconcile_latency_quantile(q: float, s: Scope = DASHBOARD) -> str:
    """The operator's reconcile latency (the operator's own series carry no namespace)."""
    return f"histogram_quantile({q}, sum by (le) (rate({RECONCILE_BUCKET}[{s.window}])))"


# --- Grafana template variables: `label_values(series selector, label)` (Grafana syntax, not PromQL). -------
def label_values(match: str, label: str) -> str:
    return f"label_values({match}, {label})"


NAMESPACE_VALUES = label_values(f'{{__name__=~"{RUNS}|{REQUESTS_RUNNING}"}}', "namespace")
MODEL_VALUES = label_values(selector(REQUESTS_RUNNING, 'namespace=~"$namespace"'), "model_name")
RUN_VALUES = label_values(
    f'{{__name__=~"{STAGE_ATTEMPTS}|{REQUESTS_RUNNING}", namespace=~"$namespace"}}', "run"
)


# --- Alert expressions (fixed windows, no template variables). ----------------------------------------------
ACCEPTANCE_WINDOW = "15m"
# Live / evaluated mean acceptance length below this fires Eagle3AcceptanceBelowEvaluated.
ACCEPTANCE_FLOOR = 0.8
NO_ACCEPTED_WINDOW = "10m"
FAILURE_WINDOW = "10m"  # a failure alert fires for this long after each failure
RUN_FAILED_FOR = "5m"  # Eagle3RunFailed: a run Failed this long (it fires until the run leaves Failed)


def duration_seconds(duration: str) -> int:
    """A simple Prometheus duration (`90s`, `10m`, `2h`, `1d`) in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = duration[:-1], duration[-1:]
    if unit not in units or not number.isdigit():
        raise ValueError(f"not a simple Prometheus duration: {duration!r}")
    return int(number) * units[unit]


def alert_acceptance_below_evaluated() -> str:
    """Live mean acceptance length < 0.8 x the run's evaluated one (sampled where measured, else greedy: the
    alert's `sampling` label), while drafts are being proposed."""
    s = scoped(ACCEPTANCE_WINDOW)
    evaluated = f"{ACCEPTANCE_FLOOR} * {evaluated_acceptance_length(s)}"
    return (
        f"({mean_acceptance_length(s)}) < on ({LIVE_BY}) group_left (sampling) {evaluated}\n"
        f"and on ({LIVE_BY}) {drafts_per_second(s)} > 0"
    )


def alert_run_failed() -> str:
    """The run is in phase Failed (eagle3_run_phase: 1 for the current phase)."""
    return f'{RUN_PHASE}{{phase="Failed"}} == 1'


def alert_no_accepted_tokens() -> str:
    """Tokens generated and drafts proposed, but not a single draft token accepted over the window."""
    s = scoped(NO_ACCEPTED_WINDOW)
    return (
        f"{accepted_tokens_per_second(s)} == 0\n"
        f"and on ({LIVE_BY}) {drafts_per_second(s)} > 0\n"
        f"and on ({LIVE_BY}) {generation_tokens_per_second(s)} > 0"
    )


def _failed_attempts(reason_matcher: str) -> str:
    """(run, stage, reason)s that had a failed attempt within the window; the value is its age in seconds.

    Read from the last-failure timestamp, not from `increase()` of the failures counter: a Job that fails
    before Prometheus's first scrape of its (zero) counter makes a series whose first sample is already 1,
    and `increase()` sees no increase in it. An old failure stays quiet: a fresh Prometheus reads its
    timestamp as old, and a restarted operator sets none for the failures that predate it."""
    last = selector(LAST_FAILURE, extra=reason_matcher)
    window = duration_seconds(FAILURE_WINDOW)
    return f"time() - max by (namespace, run, stage, reason) ({last}) < {window}"


def alert_stage_failed() -> str:
    """A stage Job attempt failed for another reason than running out of memory."""
    return _failed_attempts(f'reason!="{OOM_REASON}"')


def alert_stage_oom_retry() -> str:
    """A stage Job attempt ran out of memory (the operator retries it with half the budget)."""
    return _failed_attempts(f'reason="{OOM_REASON}"')


def alert_run_stuck() -> str:
    """The running stage's current attempt has taken longer than the stage's expected time."""
    return f"time() - {STAGE_STARTED} > on (namespace, run, stage) {STAGE_EXPECTED}"


def alert_pod_not_running() -> str:
    """A stage's or the serving Deployment's pod does not run: an image pull, a missing Secret, no node, a
    crash loop (status.stages.<stage>.blockedBy, status.serving.blockedBy; stage `serve` for vLLM)."""
    return f"{POD_BLOCKED} > 0"
