"""The dashboard's panels: each a grafana-foundation-sdk builder over the queries of `queries`.

Units and descriptions are part of the contract with the reader: every acceptance panel states its formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.models import common, dashboard

from eagle3_operator.observability import queries as q

DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN_LEGEND = "{{namespace}}/{{run}}"

ACCEPTANCE_RATE_FORMULA = (
    "Acceptance rate = accepted draft tokens / proposed draft tokens "
    f"(rate({q.ACCEPTED}) / rate({q.DRAFT_TOKENS})), per run."
)
ACCEPTANCE_LENGTH_FORMULA = (
    "Mean acceptance length = 1 + accepted draft tokens / drafts "
    f"(1 + rate({q.ACCEPTED}) / rate({q.DRAFTS})): tokens produced per verifier step, per run. "
    "Not draft tokens / drafts, which is just the number of speculative tokens."
)
POSITION_FORMULA = (
    "Acceptance at draft position i = accepted tokens at position i / drafts "
    f"(rate({q.ACCEPTED_PER_POS}{{position=i}}) / rate({q.DRAFTS})): the share of drafts whose token i was "
    "accepted; the sum over positions plus 1 is the mean acceptance length."
)


Panel = stat.Panel | timeseries.Panel


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = RUN_LEGEND


def _query(target: Target, ref_id: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(target.expr).legend_format(target.legend).ref_id(ref_id).range()


def thresholds_of(*steps: tuple[float | None, str]) -> dashboard_builders.ThresholdsConfig:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard.ThresholdsMode.ABSOLUTE)
        .steps([dashboard.Threshold(value=v, color=c) for v, c in steps])
    )


def graph(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    width: int = 12,
    min_val: float | None = None,
    max_val: float | None = None,
    thresholds: dashboard_builders.ThresholdsConfig | None = None,
) -> timeseries.Panel:
    """A time-series panel, one query per target (ref ids A, B, ...)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .targets([_query(t, chr(ord("A") + i)) for i, t in enumerate(targets)])
    )
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    if thresholds is not None:
        style = common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        panel = panel.thresholds(thresholds).thresholds_style(style)
    return panel


def single(
    title: str,
    description: str,
    unit: str,
    target: Target,
    *,
    width: int = 6,
    decimals: float = 2,
    thresholds: dashboard_builders.ThresholdsConfig | None = None,
) -> stat.Panel:
    """A stat panel: the last value of each series (one per run), named by its legend."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .decimals(decimals)
        .span(width)
        .height(5)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .targets([_query(target, "A")])
    )
    if thresholds is not None:
        panel = panel.thresholds(thresholds).color_mode(common.BigValueColorMode.BACKGROUND)
    return panel


LIVE_FLOOR = thresholds_of((None, "red"), (q.ACCEPTANCE_FLOOR, "green"))


LIVE_VS_EVALUATED = (
    "Live mean acceptance length / the one the evaluate stage measured (eagle3_run_acceptance_length) for "
    "the serving run, like for like: sampled at evaluation.sampling where the run has that figure, else "
    f"greedy. Below {q.ACCEPTANCE_FLOOR:.0%} (over {q.ACCEPTANCE_WINDOW}, for 10 minutes) fires "
    "Eagle3AcceptanceBelowEvaluated. " + ACCEPTANCE_LENGTH_FORMULA
)


def acceptance_stats() -> list[Panel]:
    """The live acceptance of the drafts now, beside the evaluated one."""
    return [
        single("Acceptance rate now", ACCEPTANCE_RATE_FORMULA, "percentunit", Target(q.acceptance_rate())),
        single(
            "Mean acceptance length now",
            ACCEPTANCE_LENGTH_FORMULA,
            "none",
            Target(q.mean_acceptance_length()),
        ),
        single(
            "Live / evaluated acceptance length now",
            LIVE_VS_EVALUATED,
            "percentunit",
            Target(q.live_over_evaluated()),
            decimals=0,
            thresholds=LIVE_FLOOR,
        ),
        single(
            "Evaluated acceptance length",
            "The mean acceptance length the evaluate stage measured for each run "
            "(eagle3_run_acceptance_length): greedy, and sampled at evaluation.sampling where set.",
            "none",
            Target(q.evaluated_acceptance_lengths(), "{{run}} {{sampling}}"),
        ),
    ]


def acceptance_graphs() -> list[Panel]:
    """The live acceptance of the drafts over time, beside the evaluated one."""
    return [
        graph(
            "Acceptance rate",
            ACCEPTANCE_RATE_FORMULA,
            "percentunit",
            [Target(q.acceptance_rate())],
            min_val=0,
        ),
        graph(
            "Mean acceptance length: live vs evaluated",
            ACCEPTANCE_LENGTH_FORMULA + " 'evaluated': the evaluate stage's value for the same run (sampled "
            "where measured, else greedy).",
            "none",
            [
                Target(q.mean_acceptance_length(), "live {{namespace}}/{{run}}"),
                Target(q.evaluated_acceptance_length(), "evaluated ({{sampling}}) {{namespace}}/{{run}}"),
            ],
            min_val=1,
        ),
        graph(
            "Acceptance by draft position",
            POSITION_FORMULA + " 'evaluated': the evaluate stage's (eagle3_run_acceptance_by_position).",
            "percentunit",
            [
                Target(q.acceptance_by_position(), "{{namespace}}/{{run}} position {{position}}"),
                Target(
                    q.evaluated_acceptance_by_position(),
                    "evaluated ({{sampling}}) {{namespace}}/{{run}} position {{position}}",
                ),
            ],
            min_val=0,
            max_val=1,
        ),
        graph(
            "Live / evaluated acceptance length",
            LIVE_VS_EVALUATED,
            "percentunit",
            [Target(q.live_over_evaluated())],
            min_val=0,
            thresholds=LIVE_FLOOR,
        ),
    ]


def throughput_panels() -> list[Panel]:
    tokens = "Tokens per second over the rate interval, per run (vLLM's counters, all replicas summed)."
    return [
        graph(
            "Accepted tokens/s",
            f"Draft tokens the verifier accepted per second ({q.ACCEPTED}). {tokens}",
            "tps",
            [Target(q.accepted_tokens_per_second())],
            min_val=0,
        ),
        graph(
            "Generation tokens/s",
            f"Output tokens generated per second ({q.GENERATION_TOKENS}); prompt tokens for scale. {tokens}",
            "tps",
            [
                Target(q.generation_tokens_per_second(), "generated {{namespace}}/{{run}}"),
                Target(q.prompt_tokens_per_second(), "prompt {{namespace}}/{{run}}"),
            ],
            min_val=0,
        ),
    ]


def serving_panels() -> list[Panel]:
    """vLLM's latency and load."""
    p50, p95 = "p50 {{namespace}}/{{run}}", "p95 {{namespace}}/{{run}}"
    return [
        graph(
            "Time to first token (p50, p95)",
            "Quantiles of the time from a request's arrival to its first output token (vLLM's histogram).",
            "s",
            [Target(q.ttft_quantile(0.5), p50), Target(q.ttft_quantile(0.95), p95)],
            min_val=0,
        ),
        graph(
            "Inter-token latency (p50, p95)",
            "Quantiles of the time between two output tokens of a request (vLLM's histogram); speculative "
            "decoding lowers it when drafts are accepted.",
            "s",
            [Target(q.itl_quantile(0.5), p50), Target(q.itl_quantile(0.95), p95)],
            min_val=0,
        ),
        graph(
            "Running and waiting requests",
            "Requests being decoded and requests queued, per run (all replicas summed).",
            "short",
            [
                Target(q.requests_running(), "running {{namespace}}/{{run}}"),
                Target(q.requests_waiting(), "waiting {{namespace}}/{{run}}"),
            ],
            min_val=0,
        ),
        graph(
            "KV-cache usage",
            "The fullest KV cache among a run's replicas (1 = full: requests wait or are preempted).",
            "percentunit",
            [Target(q.kv_cache_usage())],
            min_val=0,
            max_val=1,
        ),
    ]


def stage_panels() -> list[Panel]:
    """The operator: runs and their stages."""
    stage = "{{namespace}}/{{run}} {{stage}}"
    return [
        graph(
            "Runs by phase",
            "Eagle3Runs in each phase (the selected namespaces).",
            "short",
            [Target(q.runs_by_phase(), "{{phase}}")],
            min_val=0,
        ),
        graph(
            "Stage duration (p50, p95) by stage",
            "Quantiles of finished stage Jobs' wall-clock durations, over every stage the operator saw "
            "finish since it started (stages finish a few times a day, so a short rate window would be "
            "empty).",
            "s",
            [
                Target(q.stage_duration_quantile(0.5), "p50 {{stage}}"),
                Target(q.stage_duration_quantile(0.95), "p95 {{stage}}"),
            ],
            min_val=0,
        ),
        graph(
            "Stage attempts and failures",
            "Stage Jobs started (OOM retries included) and failed attempts by reason: OutOfMemory (retried "
            "with half the token budget), DeadlineExceeded, Error.",
            "short",
            [
                Target(q.stage_attempts(), "attempts " + stage),
                Target(q.stage_failures(), "failed {{reason}} " + stage),
            ],
            width=8,
            min_val=0,
        ),
        graph(
            "Running stages: elapsed / expected time",
            "How long the running stage's current attempt has taken, as a share of its expected time: the "
            "elapsed time plus the ETA its pod reports (eagle3_stage_eta_seconds) where it reports one, else "
            "the operator's expected time (activeDeadlineSeconds, else the operator's default). With an "
            "ETA it is the share done by time; without one, above 100% is overdue and fires Eagle3RunStuck "
            "(which compares with the operator's expected time only).",
            "percentunit",
            [Target(q.stage_elapsed_fraction(), stage)],
            width=8,
            min_val=0,
            thresholds=thresholds_of((None, "green"), (1.0, "red")),
        ),
        graph(
            "Pods not running",
            "1 while a pod of the stage (serve: the vLLM Deployment) does not run, by reason: an image that "
            "cannot be pulled, a missing Secret, no node that fits, a crash loop. Neither a Job nor a "
            "Deployment fails for these; the run's status.stages.<stage>.blockedBy (for vLLM: "
            "status.serving.blockedBy) holds the message. Ten minutes of it fire Eagle3PodNotRunning.",
            "short",
            [Target(q.pods_blocked(), stage + " {{reason}}")],
            width=8,
            min_val=0,
        ),
    ]


def result_panels() -> list[Panel]:
    """What the stages measured, and the operator's own latency."""
    stage = "{{namespace}}/{{run}} {{stage}}"
    return [
        single(
            "Best validation loss",
            "The train stage's best validation loss, per run.",
            "none",
            Target(q.validation_loss()),
            width=8,
            decimals=3,
        ),
        single(
            "Hidden-state bytes",
            "Bytes of verifier hidden states the extract stage stored, per run.",
            "bytes",
            Target(q.hidden_state_bytes()),
            width=8,
            decimals=1,
        ),
        single(
            "Tokens processed",
            "Tokens each stage processed, per run and stage.",
            "short",
            Target(q.tokens_processed(), stage),
            width=8,
            decimals=0,
        ),
        graph(
            "Operator reconcile latency (p50, p95)",
            "Time the operator takes to reconcile one Eagle3Run (all namespaces).",
            "s",
            [
                Target(q.reconcile_latency_quantile(0.5), "p50"),
                Target(q.reconcile_latency_quantile(0.95), "p95"),
            ],
            min_val=0,
            width=24,
        ),
    ]
