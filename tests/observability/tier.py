"""The tier's whole stack, in the order a cluster would see it, and the moment every check looks at.

0. The real stage programs of stage_stack start: `hung` (a generate whose vLLM hangs) at once, the training's
   prepare, extract and vocab in the background.
1. The operator (against kmock) starts, and run `broken` fails at once; then Prometheus starts, scraping the
   operator's metrics endpoint (its first scrape already holds broken's failure), and the operator takes the
   other runs (see operator_stack) as far as they go before evaluation: `training` and `hung` to their
   running train and generate Jobs, whose pods are stage_stack's programs.
2. The two vLLM CPU servers start (concurrently); Prometheus reloads its config with them and `hung` as
   targets.
3. "Evaluation": held-out prompts to `good`'s server; the acceptance its counters show (before/after, as the
   evaluate stage measures) becomes the evaluate result of `good` and of `bad`, whose export then ships the
   muted draft. Both runs roll out and reach Serving.
   Meanwhile the canary runs (canary_stack) serve their incumbent; Prometheus scrapes both servers again as
   their tracks. A timed wave to both servers sets the canaries' sub-window; their canaries start then.
4. Live traffic to both servers, two waves each per canary sub-window (canary_stack), until both canaries are
   decided (after their last sub-window, or their extension's last). Then `hung` has been stalled (a rate
   of 0), and the train stage starts, a target too; once it has finished the epochs whose validation loss
   rose twice in a row, the raw counters, once settled, and the moment `end` at which Prometheus holds a
   sample of exactly those counters. Instant queries are evaluated at `end`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_contract.api.speculation import (
    BaselineCell,
    SpeculationTable,
    SweepCell,
    headline_cell,
    plan_schedule,
)
from eagle3_pipeline.data.draft_checkpoint import sha256_of
from eagle3_pipeline.serving.spec_metrics import (
    ACCEPTED,
    DRAFTS,
    GENERATION_TOKENS,
    Acceptance,
    SpecDecodeCounters,
)
from tests.observability import vllm_stack
from tests.observability.canary_stack import (
    DECISION_TIMEOUT_S,
    LEAD_S,
    WAVE_ROUNDS,
    WAVE_TOKENS,
    WINDOWS,
    CanaryRuns,
    canary_targets,
    wave_shape,
)
from tests.observability.operator_stack import CALL_TIMEOUT_S, NAMESPACE, RESYNC_S, OperatorStack
from tests.observability.prometheus import (
    PrometheusServer,
    Target,
    every_second,
    wait_for,
)
from tests.observability.stage_stack import RISING_AT, STALL_WAIT_S, StageStack
from tests.observability.vllm_stack import MODEL, NUM_SPECULATIVE_TOKENS, Served

EVALUATION_PROMPTS = 8
# one batch per wave (MAX_NUM_SEQS in flight), the same prompts in every wave, WAVE_ROUNDS waves to each
# server per sub-window of the canaries (canary_stack): the traffic lasts WINDOWS sub-windows (about 90 s on
# a quiet machine), or twice that where a canary is extended
WAVE_PROMPTS = vllm_stack.MAX_NUM_SEQS
WINDOW_REQUESTS = WAVE_ROUNDS * WAVE_PROMPTS  # each track's requests in a sub-window
SCRAPE_WAIT_S = 30.0
log = logging.getLogger(__name__)
# the alerts of the stage programs' metrics: a busy machine evaluates the rules a moment after the scrape
STAGE_ALERTS = ("Eagle3StageStalled", "Eagle3ValidationLossRising")
TRAIN_WAIT_S = 300.0  # the train stage's start (imports, the trainer) and its first epochs, on a busy machine
OPERATOR_NAMESPACE = "eagle3-system"
# evaluate's sweep as the tier's evaluate results carry it (status.checkpoint.speculation, the dashboard's
# sweep table): fixed figures, not measured here (the sweep itself is measured in tests/pipeline), so the
# operator's sweep series and the table's queries have data: k 3 pays at concurrency 1, nothing at 4.
SWEEP_CELLS = [
    SweepCell(num_speculative_tokens=k, concurrency=c, acceptance_length=al, output_tokens_per_second=t,
              speedup=t / base)
    for c, base, rows in (
        (1, 40.0, ((1, 1.4, 46.0), (3, 1.5, 52.0))),
        (4, 120.0, ((1, 1.4, 110.0), (3, 1.5, 90.0))),
    )
    for k, al, t in rows
]  # fmt: skip
SWEEP = SpeculationTable(
    cells=SWEEP_CELLS,
    baselines=[BaselineCell(concurrency=1, output_tokens_per_second=40.0), BaselineCell(concurrency=4,
               output_tokens_per_second=120.0)],
    schedule=plan_schedule(SWEEP_CELLS),
).model_dump(mode="json", by_alias=True, exclude_none=True)  # fmt: skip


HEADLINE = headline_cell(SWEEP_CELLS, NUM_SPECULATIVE_TOKENS, EVALUATION_PROMPTS)
assert HEADLINE is not None


@dataclass
class Tier:
    prometheus: PrometheusServer
    operator: OperatorStack
    servers: dict[str, Served]
    stages: StageStack
    evaluated: Acceptance | None = None
    raw: dict[str, SpecDecodeCounters] = field(default_factory=dict)
    started: float = 0.0  # unix time Prometheus started
    serving_since: float = 0.0  # unix time the vLLM targets were first scraped
    end: float = 0.0  # unix time at which Prometheus's latest samples are the raw counters
    timings: dict[str, float] = field(default_factory=dict)
    canaries: CanaryRuns | None = None

    def scalar(self, expr: str) -> float:
        """An instant query at `end` that must return exactly one series."""
        result = self.prometheus.query(expr, at=self.end)
        assert len(result) == 1, f"{expr}: expected one series, got {result}"
        return float(result[0]["value"][1])


def vllm_targets(servers: dict[str, Served]) -> list[Target]:
    """The labels the cluster's PodMonitor gives vLLM series: the pod's namespace and eagle3.dev/run."""
    return [
        Target(f"vllm-{run}", s.metrics_target, {"namespace": NAMESPACE, "run": run})
        for run, s in servers.items()
    ]


def first_scrapes(tier: Tier) -> bool:
    """Whether Prometheus has scraped every run's vLLM server once (its `up` series is there)."""
    return all(tier.prometheus.query(f'up{{job="vllm-{run}"}} == 1') for run in tier.servers)


def evaluate(tier: Tier, models: Path) -> dict[str, Any]:
    """Held-out prompts to `good`, measured as the evaluate stage measures: counters after minus before."""
    good = tier.servers["good"]
    before = good.settled_counters()
    tokens_before = good.completion_tokens
    vllm_stack.send_chats({"good": good}, vllm_stack.held_out_prompts(models, EVALUATION_PROMPTS))
    delta = good.settled_counters() - before
    tier.evaluated = acceptance = Acceptance.from_counters(delta)
    return {
        "acceptanceLength": acceptance.length,
        "acceptanceRate": acceptance.rate,
        "acceptanceByPosition": list(acceptance.by_position),
        "drafts": int(delta.drafts),  # as the evaluate stage writes it (the contract is strict)
        "outputTokens": good.completion_tokens - tokens_before,
        "speculation": SWEEP,
        # the headline speedup is the sweep's cell at evaluate's k nearest its concurrency, as evaluate's is
        "numSpeculativeTokens": NUM_SPECULATIVE_TOKENS,
        "speedup": HEADLINE.speedup,
        "speedupConcurrency": HEADLINE.concurrency,
        # as evaluate writes it for held-out prompts of several categories (the tiny corpus's task kinds):
        # each category's run, for the dashboard's "Acceptance per category" table
        "categories": [
            {
                "category": "add",
                "prompts": 8,
                "drafts": 20,
                "acceptedTokens": 30,
                "acceptanceLength": 2.5,
                "acceptanceRate": 0.5,
                "outputTokens": 60,
                "outputTokensPerSecond": 120.0,
                "speedup": 1.2,
            },
            {
                "category": "reverse",
                "prompts": 3,
                "drafts": 10,
                "acceptedTokens": 5,
                "acceptanceLength": 1.5,
                "acceptanceRate": 0.1667,
                "outputTokens": 20,
                "outputTokensPerSecond": 90.0,
                "speedup": None,
            },
        ],
        # as evaluate writes it for draft.candidates: each candidate's figures (the shipped one's measured
        # here, the other's a fixed figure), for the dashboard's "Drafts compared" table
        "checkpointSelection": {
            "by": "outputTokensPerSecond",
            "epoch": 5,
            "checkpoint": "candidates/eagle3/checkpoints/checkpoint_best",
            "checkpoints": [
                {
                    "epoch": 5,
                    "checkpoint": "candidates/eagle3/checkpoints/checkpoint_best",
                    "method": "eagle3",
                    "acceptanceLength": acceptance.length,
                    "outputTokensPerSecond": 120.0,
                },
                {
                    "epoch": 5,
                    "checkpoint": "candidates/peagle/checkpoints/checkpoint_best",
                    "method": "peagle",
                    "acceptanceLength": 1.2,
                    "outputTokensPerSecond": 100.0,
                },
            ],
        },
    }


def exports(servers: dict[str, Served]) -> dict[str, dict[str, Any]]:
    """Each run's export result: the sha256 and size of the draft its server serves."""
    out = {}
    for run, s in servers.items():
        weights = s.draft / "model.safetensors"
        out[run] = {"sha256": sha256_of(weights), "bytes": weights.stat().st_size}
    return out


def calibrate(tier: Tier, models: Path) -> float:
    """A sub-window's waves (canary_wave), timed, which also warm both servers' prefix caches."""
    begin = time.monotonic()
    canary_wave(tier, vllm_stack.held_out_prompts(models, WAVE_PROMPTS), 0, WAVE_TOKENS)
    return time.monotonic() - begin


def canary_wave(tier: Tier, prompts: list[list[dict[str, str]]], index: int, tokens: int) -> None:
    """A sub-window's traffic: WAVE_ROUNDS rounds of the prompts (`tokens` tokens each) to one server, then
    to the other, the order alternating from round to round and from sub-window to sub-window (AB BA in
    one, BA AB in the next): whatever slows the machine for a second or two then tends to land on both
    servers' waves of a sub-window, and a steady drift cancels. In a cluster each track has its own nodes;
    here the two servers share two cores, and answering at once each one's speed would be the other's turns
    on the cores (one loaded run, both at once: the per-request speed ratio swung from 0.38 to 1.14 between
    sub-windows)."""
    servers = list(tier.servers.items())
    for turn in range(WAVE_ROUNDS):
        for run, served in servers[::-1] if (index + turn) % 2 else servers:
            vllm_stack.send_chats({run: served}, prompts, tokens)


def live_traffic(tier: Tier, models: Path) -> None:
    """The waves of the same WAVE_PROMPTS prompts (canary_wave) in each canary sub-window, LEAD_S after the
    later run's sub-window starts (their grids are their status.canary.started plus whole sub-windows), for
    WINDOWS sub-windows; then on while a canary is undecided (extended, or short of paired sub-windows where a
    loaded machine made a wave overrun its own), until both are decided or twice the duration and the
    decision's timeout have passed. A sub-window whose start has passed is skipped."""
    runs = tier.canaries
    assert runs is not None
    prompts = vllm_stack.held_out_prompts(models, WAVE_PROMPTS)
    origin, step = max(runs.started.values()), runs.window_s
    waves: list[float] = []
    deadline = time.time() + 2 * WINDOWS * step + DECISION_TIMEOUT_S
    for index in itertools.count():
        if time.time() > deadline:
            break
        if index >= WINDOWS and not _undecided(tier, origin + WINDOWS * step if index == WINDOWS else None):
            break
        at = origin + index * step + LEAD_S
        if time.time() > at + 0.5:
            continue
        time.sleep(max(0.0, at - time.time()))
        begin = time.monotonic()
        canary_wave(tier, prompts, index, runs.tokens)
        waves.append(time.monotonic() - begin)
    tier.timings["canary_waves"] = len(waves)
    tier.timings["canary_wave_s_max"] = max(waves)
    tier.timings["canary_tokens"] = runs.tokens
    log.info("canary traffic: %d waves of %s s in %d s sub-windows", len(waves), waves, step)


def _undecided(tier: Tier, due: float | None) -> bool:
    """Whether a canary still waits: extended, or undecided (with `due`, the end of the first WINDOWS
    sub-windows, its first decision is waited for a few resyncs past it)."""
    assert tier.canaries is not None
    deadline = max(time.time(), due) + 5 * RESYNC_S if due is not None else 0.0
    while True:
        states = tier.operator.call(tier.canaries.states())
        decided = [phase != "Observing" for phase, _ in states.values()]
        if all(decided):
            return False
        if any(extended for _, extended in states.values()) or time.time() > deadline:
            return True
        time.sleep(0.5)


def settle(tier: Tier) -> None:
    """Raw counters of every server, then wait for a scrape that saw exactly them; `end` = that moment."""
    tier.raw = {run: s.settled_counters() for run, s in tier.servers.items()}

    def scraped() -> bool:
        for run, raw in tier.raw.items():
            for metric, value in (
                (DRAFTS, raw.drafts),
                (ACCEPTED, raw.accepted),
                (GENERATION_TOKENS, raw.generation_tokens),
            ):
                result = tier.prometheus.query(f'sum({metric}{{run="{run}"}})')
                if not result or float(result[0]["value"][1]) != value:
                    return False
        return True

    wait_for(scraped, SCRAPE_WAIT_S, "a scrape of the settled counters")
    tier.end = time.time()


def live_stages(tier: Tier) -> None:
    """`hung` stalled (rate 0), then the train stage started and through its first rising epochs."""

    def stalled() -> bool:
        return bool(tier.prometheus.query('eagle3_stage_units_per_second{run="hung"} == 0'))

    wait_for(stalled, STALL_WAIT_S, "hung's rate at 0 (the reporter's rate window after its failed row)")
    # its target before it starts: its first epochs can end within a scrape interval of its start
    training = tier.stages.train(lambda process: tier.prometheus.add_targets([process.target], wait=False))
    url = f"http://{training.target.address}/metrics"
    wait_for(lambda: tier.prometheus.targets_up().get(url) == "up", SCRAPE_WAIT_S, f"a scrape of {url}")

    def rising() -> bool:
        assert training.process is not None and training.process.poll() is None, training.tail()
        return bool(tier.prometheus.query(f'eagle3_train_epochs_done{{run="training"}} >= {RISING_AT}'))

    wait_for(rising, TRAIN_WAIT_S, f"the train stage's first {RISING_AT} epochs")

    def evaluated() -> bool:  # the rules saw it: ALERTS at `end` (set next) holds both stage alerts
        found = tier.prometheus.query(f'ALERTS{{alertname=~"{"|".join(STAGE_ALERTS)}"}}')
        return {s["metric"]["alertname"] for s in found} >= set(STAGE_ALERTS)

    wait_for(evaluated, SCRAPE_WAIT_S, f"{' and '.join(STAGE_ALERTS)} pending or firing")


@contextlib.contextmanager
def tier_stack(
    prometheus_bin: Path, models: Path, work: Path, rules: Path, drafts_base: Path
) -> Iterator[Tier]:
    """The whole stack (see the module doc); everything is stopped on exit, whatever happened. The drafts are
    made under `drafts_base` (the session's temp root: tests/pipeline's fitted draft is made once there)."""
    marks = {"start": time.monotonic()}
    with ExitStack() as stack:
        stages = StageStack(models, work / "stages")
        stack.callback(stages.close)
        stages.start()
        drafts = vllm_stack.make_drafts(models, drafts_base)
        marks["drafts"] = time.monotonic()
        fast_rules = every_second(rules, work / "rules.yaml")
        operator = OperatorStack()
        operator.start()
        stack.callback(operator.close)
        operator.call(operator.fail_fast(MODEL))  # before Prometheus's first scrape of the operator
        # scraped as docs/metrics.md says: the operator pod's namespace, and honor_labels for the runs' own
        target = Target("eagle3-operator", operator.metrics_target, {"namespace": OPERATOR_NAMESPACE}, True)
        prometheus = stack.enter_context(
            PrometheusServer(prometheus_bin, work / "prometheus", [], [fast_rules])
        )
        prometheus.add_targets([target])  # the other runs' series are seen before they exist
        started = time.time()
        assert operator.cluster is not None and operator.player is not None
        requests = WINDOWS * WINDOW_REQUESTS  # the canaries' minRequests: their first WINDOWS sub-windows
        canaries = CanaryRuns(operator.cluster, operator.player, MODEL, prometheus.url, requests)
        scenario = operator.submit(operator.before_evaluation(MODEL))  # while the vLLM servers start
        incumbents = operator.submit(canaries.serving())
        servers = stack.enter_context(vllm_stack.serving(drafts, work / "vllm"))
        scenario.result(timeout=CALL_TIMEOUT_S)
        incumbents.result(timeout=CALL_TIMEOUT_S)
        marks["vllm"] = time.monotonic()
        tier = Tier(prometheus, operator, servers, stages, started=started, canaries=canaries)
        wait_for(stages.hung.serving, SCRAPE_WAIT_S, "hung's generate serving its metrics")
        prometheus.add_targets(
            [*vllm_targets(servers), *canary_targets(servers, NAMESPACE), stages.hung.target]
        )
        # every rate() the panels take starts from a sample before the first request: traffic waits for the
        # servers' first scrape (a request before it would leave its tokens out of every rate's window)
        wait_for(lambda: first_scrapes(tier), SCRAPE_WAIT_S, "the vLLM servers' first scrape")
        tier.serving_since = time.time()
        evaluation = evaluate(tier, models)
        operator.call(operator.to_serving({"good": evaluation, "bad": evaluation}, exports(servers)))
        canaries.window_s = wave_shape(calibrate(tier, models))
        operator.call(canaries.start())
        live_traffic(tier, models)
        marks["traffic"] = time.monotonic()
        operator.call(canaries.decide(), timeout=DECISION_TIMEOUT_S + 10)
        marks["canary"] = time.monotonic()
        live_stages(tier)
        settle(tier)
        marks["stages"] = time.monotonic()
        tier.timings |= {
            "drafts_s": marks["drafts"] - marks["start"],
            "vllm_start_s": marks["vllm"] - marks["drafts"],
            "traffic_s": marks["traffic"] - marks["vllm"],
            "canary_after_traffic_s": marks["canary"] - marks["traffic"],
            "stages_s": marks["stages"] - marks["canary"],
        }
        log.info("tier timings: %s", {k: round(v, 1) for k, v in tier.timings.items()})
        yield tier
