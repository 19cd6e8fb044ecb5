"""The dashboard's canary and speculation-length rows: incumbent vs canary, and evaluate's sweep.

Canary: vLLM's live figures by `track` side by side (stable: the incumbent, canary: the new draft), the very
figures the operator decides on, then what it decided on (status.canary) and its phase. Speculation length:
evaluate's sweep as a table of k by concurrency cells, and the tuned schedule vLLM serves.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import prometheus, table
from grafana_foundation_sdk.models import dashboard
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from eagle3_operator.observability import panels as p
from eagle3_operator.observability import queries as q
from eagle3_operator.observability import speculation_queries as sq

TRACK_LEGEND = "{{track}} {{namespace}}/{{run}}"
TRACKS = (
    "Track stable: the incumbent Deployment's pods; track canary: the new draft's canary Deployment "
    "(the PodMonitor's `track` label). The Service splits the traffic between them by replica count."
)
DECISION = (
    "The operator compares the tracks sub-window by sub-window (serving.canary.duration / windows) from the "
    "canary's first ready replica: per figure (mean acceptance length, output tokens/s per request), the "
    "median of the canary / incumbent ratios with its 95 % interval. Once serving.canary.duration has "
    "passed and it finished serving.canary.minRequests requests, it promotes the canary when both intervals "
    "lie above 1 - serving.canary.tolerance, rolls it back when either lies below, else extends it once "
    "(then NotDistinguishable); a draft regressing a category of its evaluated acceptance is refused at "
    "once (status.canary, the Canary condition, docs/serving.md)."
)


def canary_live() -> list[p.Panel]:
    """Incumbent vs canary, live from vLLM."""
    return [
        p.graph(
            "Canary vs incumbent: mean acceptance length",
            "Mean acceptance length = 1 + accepted draft tokens / drafts "
            f"(1 + rate({q.ACCEPTED}) / rate({q.DRAFTS})), per run and track. {TRACKS}",
            "none",
            [p.Target(sq.track_acceptance_length(), TRACK_LEGEND)],
            width=8,
            min_val=1,
        ),
        p.graph(
            "Canary vs incumbent: output tokens/s per request",
            f"Output tokens per second of one request while it decodes: rate({sq.TPOT_COUNT}) / "
            f"rate({sq.TPOT_SUM}), 1 / vLLM's mean time per output token, so independent of the traffic "
            f"split. {TRACKS}",
            "tps",
            [p.Target(sq.track_output_tokens_per_second(), TRACK_LEGEND)],
            width=8,
            min_val=0,
        ),
        p.graph(
            "Canary vs incumbent: finished requests/s",
            f"Requests finished per second (rate({sq.REQUEST_SUCCESS})), per run and track. {TRACKS}",
            "reqps",
            [p.Target(sq.track_requests_per_second(), TRACK_LEGEND)],
            width=8,
            min_val=0,
        ),
    ]


def canary_decision() -> list[p.Panel]:
    """The figures the operator read over the canary's window, its phase and its time to decision."""

    def figure(title: str, what: str, unit: str, metric: str, decimals: float) -> p.Panel:
        return p.single(
            title,
            f"{what}, as the operator read it from Prometheus over the canary's observation window "
            f"({metric}; status.canary.incumbent and .canary). {DECISION}",
            unit,
            p.Target(sq.canary_figure(metric), TRACK_LEGEND),
            width=5,
            decimals=decimals,
        )

    return [
        p.single(
            "Canary phase",
            "The canary's phase (status.canary.phase): Observing, Promoted or RolledBack. " + DECISION,
            "none",
            p.Target(sq.canary_phase(), "{{namespace}}/{{run}}: {{phase}}"),
            width=4,
            decimals=0,
        ),
        figure("Canary decision: acceptance length", "Mean acceptance length", "none", sq.CANARY_LENGTH, 2),
        figure("Canary decision: output tokens/s", "Output tokens/s per request", "tps", sq.CANARY_SPEED, 1),
        figure("Canary decision: requests", "Requests finished", "short", sq.CANARY_REQUESTS, 0),
        p.single(
            "Canary time to decision",
            "Seconds from the canary's first ready replica (the start of its window) to its promotion or "
            f"roll-back ({sq.CANARY_DECISION}, status.canary.secondsToDecision).",
            "s",
            p.Target(sq.canary_decision_seconds()),
            width=5,
            decimals=0,
        ),
    ]


def canary_intervals() -> list[p.Panel]:
    """What the decision compares: both figures' median ratio and 95 % interval, as status.canary has them."""
    return [
        p.graph(
            "Canary comparison: canary / incumbent with the 95 % interval",
            f"Per figure, the median of the canary's figure over the incumbent's, sub-window by sub-window "
            f"(bound ratio), and its 95 % interval (bounds low and high), as the operator last compared them "
            f"({sq.CANARY_RATIO}; status.canary.acceptanceRatio, .speedRatio). {DECISION}",
            "none",
            [p.Target(sq.canary_ratio(), "{{namespace}}/{{run}} {{figure}} {{bound}}")],
            width=24,
            min_val=0,
        ),
    ]


def _instant(expr: str, ref_id: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format("__auto")
        .ref_id(ref_id)
        .instant()
        .format(PromQueryFormat.TABLE)
    )


def _table(
    title: str, description: str, unit: str, targets: list[tuple[str, str]], keys: list[str], width: int
) -> table.Panel:
    """A table of instant queries merged on their labels: one row per label set, a column per query
    (named by `targets`' second element)."""
    refs = [chr(ord("A") + i) for i in range(len(targets))]
    names = {f"Value #{ref}": name for ref, (_, name) in zip(refs, targets, strict=True)}
    order = {key: i for i, key in enumerate([*keys, *names.values()])}
    organize = {"excludeByName": {"Time": True}, "renameByName": names, "indexByName": order}
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(p.DATASOURCE)
        .unit(unit)
        .decimals(2)
        .span(width)
        .height(9)
        .targets([_instant(expr, ref) for ref, (expr, _) in zip(refs, targets, strict=True)])
        .with_transformation(dashboard.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(dashboard.DataTransformerConfig(id_val="organize", options=organize))
    )


def sweep_panels() -> list[p.Panel | table.Panel]:
    """evaluate's headline speedup, its sweep and the schedule serving.speculationLength tuned serves, the
    drafts it chose the exported one from, and its acceptance per category."""
    return [
        _table(
            "Drafts compared: candidates or epochs",
            "The drafts evaluate measured to choose the one exported (the checkpointSelection of "
            "evaluate's result): with draft.candidates each method's best checkpoint, the fastest "
            "exported; with training.checkpointSelection acceptance each of the last epochs, the most "
            "accepted exported. Output tokens/s of all requests at evaluate's concurrency and the mean "
            "acceptance length, on the same held-out prompts; chosen 1: the one exported.",
            "none",
            [
                (sq.choice(sq.CHOICE_SPEED), "output tokens/s"),
                (sq.choice(sq.CHOICE_LENGTH), "acceptance length"),
            ],
            ["namespace", "run", "draft", "chosen"],
            24,
        ),
        p.single(
            "Evaluated speedup",
            f"The evaluate stage's speedup ({sq.EVALUATED_SPEEDUP}; the result's speedup and "
            "speedupConcurrency, as `eagle3 run` and `eagle3 status` show it): output tokens/s with the "
            "draft at k over the verifier alone's, both at the concurrency named. With evaluation.sweep it "
            "is the sweep's cell at evaluate's k nearest evaluate's own concurrency, the same figure as in "
            "the table beside it.",
            "none",
            p.Target(sq.evaluated_speedup(), "{{run}}: k {{k}}, {{concurrency}} in flight"),
            width=4,
        ),
        _table(
            "Speculation sweep: k x concurrency",
            "evaluate's sweep (evaluation.sweep, status.checkpoint.speculation.cells): per number of "
            "speculative tokens k and concurrency, the output tokens/s of all requests, the mean acceptance "
            "length and the speedup over the verifier alone at the same concurrency (k 0: the verifier "
            "alone, speedup 1).",
            "none",
            [
                (sq.sweep_cells(sq.SWEEP_SPEED), "output tokens/s"),
                (sq.sweep_cells(sq.SWEEP_LENGTH), "acceptance length"),
                (sq.sweep_cells(sq.SWEEP_SPEEDUP), "speedup"),
            ],
            ["namespace", "run", "concurrency", "k"],
            12,
        ),
        _table(
            "Tuned speculation length by batch size",
            "The best k per batch-size range derived from the sweep (status.checkpoint.speculation"
            ".schedule): what serving.speculationLength tuned passes to vLLM as "
            "num_speculative_tokens_per_batch_size; k 0: no k beat the verifier alone there, speculation "
            "is off.",
            "none",
            [(sq.speculation_schedule(), "k")],
            ["namespace", "run", "min_batch_size", "max_batch_size"],
            8,
        ),
        _table(
            "Acceptance per category",
            "evaluate's acceptance per category of the held-out prompts (status.checkpoint.categories: a "
            "dataset row's category, its file in a directory of files, evaluation.categories, other for the "
            "rest): each category's prompts answered as a run of their own, with the draft (the "
            "speculative-decoding counters' difference over that run) and by the verifier alone (the "
            "speedup's baseline). A category well below the others is one the draft was not trained for.",
            "none",
            [
                (sq.category(sq.CATEGORY_LENGTH), "acceptance length"),
                (sq.category(sq.CATEGORY_RATE), "acceptance rate"),
                (sq.category(sq.CATEGORY_SPEEDUP), "speedup"),
            ],
            ["namespace", "run", "category"],
            24,
        ),
    ]
