"""The operator's Prometheus metrics (docs/metrics.md): one registry per operator process, in kopf's memo.

Counters count transitions the operator sees, once each: a stage attempt when its Job is created or first
seen, a failure when its Job is first seen failed; each counted failure also sets its (run, stage, reason)'s
last-failure timestamp, which the failure alerts read (a counter's first scrape can already hold the failure,
and `increase()` does not see it). `OperatorMetrics` remembers, per run, the Job names it counted; what a run
already had when this process first reconciled it (Jobs started, Jobs failed, a draft serving) happened
before the process started and is remembered without being counted, so a restarted operator starts its
counters at zero (as Prometheus expects of a restart), never counts an old failure again, nor alerts on one.
Per-run gauges are read from the status each reconcile writes, so a restart rebuilds them: the run's phase
(`eagle3_run_phase`, 1 for the current phase and 0 for the others, as kube-state-metrics does) and the
evaluated figures (acceptance by `sampling`: greedy, and sampled at evaluation.sampling when the run has it;
per draft position; the speedup), and the canary's, the sweep's and the categories' (speculation_metrics). A
run has a bounded set of series (its phases, its stages, k positions, sweep cells, at most 17 categories) and
loses every one when it is deleted (`forget_run`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.metrics import MetricWrapperBase

from eagle3_contract.api.status import RunPhase, StagePhase
from eagle3_contract.reasons import FAILURE_REASONS
from eagle3_contract.results import EvaluateResult, ExtractResult, TrainResult, result_of
from eagle3_operator.builders import names
from eagle3_operator.reconcile.run_report import (
    RunReport,
    blocked_pods,
    evaluated_acceptance,
    failure_reason,
    rolled_out_before,
    running_stages,
    serving_draft,
    stage_results,
)
from eagle3_operator.speculation_metrics import (
    CANARY_SLOTS,
    CATEGORY_SLOTS,
    CHOICE_SLOTS,
    SWEEP_SLOTS,
    Sample,
    SpeculationGauges,
    canary_samples,
    category_samples,
    choice_samples,
    sweep_samples,
)

STAGE_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 172800, float("inf"))
M = TypeVar("M", bound=MetricWrapperBase)
RUN = ("namespace", "run")


@dataclass
class RunMemory:
    """What the metrics remember of one run between reconciles."""

    phase: RunPhase | None = None
    jobs: set[str] = field(default_factory=set)  # Jobs whose attempt is counted (or predates this process)
    failed: set[str] = field(default_factory=set)  # Jobs whose failure is counted (or predates this process)
    stages: set[str] = field(default_factory=set)  # stages whose counters exist (at zero at least)
    series: dict[str, tuple[MetricWrapperBase, tuple[str, ...]]] = field(default_factory=dict)
    rollout: tuple[str, str, float] | None = None  # (checkpoint, sha256, unix time first seen serving)


class OperatorMetrics:
    """Every metric of the operator, in its own registry; `observe` records one reconcile of one run."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.memory: dict[tuple[str, str], RunMemory] = {}
        self.namespaces: set[str] = set()
        self.reconciles = Counter(
            "eagle3_operator_reconciles", "Reconciliations of Eagle3Runs, by result.", ["result"], registry=r
        )
        self.latency = Histogram(
            "eagle3_operator_reconcile_duration_seconds", "Time to reconcile one Eagle3Run.", registry=r
        )
        self.runs = Gauge("eagle3_operator_runs", "Eagle3Runs by phase.", ["namespace", "phase"], registry=r)
        self.stage_seconds = Histogram(
            "eagle3_operator_stage_duration_seconds", "Wall-clock duration of the stage Jobs that succeeded.",
            ["namespace", "stage"], buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.attempts = Counter(
            "eagle3_operator_stage_attempts", "Stage Jobs started (out-of-memory retries included).",
            [*RUN, "stage"], registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "eagle3_operator_stage_failures", "Stage Jobs that failed, by reason: OutOfMemory, "
            "DeadlineExceeded or Error.", [*RUN, "stage", "reason"], registry=r,
        )  # fmt: skip
        self._run_gauges(r)
        self.speculation = SpeculationGauges(r)

    def _run_gauges(self, r: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, [*RUN, *labels], registry=r)

        self.last_failure = gauge(
            "eagle3_run_stage_last_failure_timestamp_seconds", "When this process last counted a failed Job "
            "of the stage for the reason.", "stage", "reason",
        )  # fmt: skip
        self.started = gauge(
            "eagle3_run_stage_started_timestamp_seconds", "When the running stage's attempt started.", "stage"
        )
        self.expected = gauge(
            "eagle3_run_stage_expected_seconds", "How long the running stage is expected to take.", "stage"
        )
        self.phase = gauge(
            "eagle3_run_phase", "1 for the run's current phase, 0 for the others (status.phase).", "phase"
        )
        self.acceptance = gauge(
            "eagle3_run_acceptance_length", "Evaluated mean acceptance length, greedy or sampled (at "
            "evaluation.sampling).", "model", "sampling",
        )  # fmt: skip
        self.acceptance_rate = gauge(
            "eagle3_run_acceptance_rate", "Evaluated acceptance rate, greedy or sampled.", "model", "sampling"
        )
        self.acceptance_position = gauge(
            "eagle3_run_acceptance_by_position", "Evaluated acceptance at each draft position (accepted at "
            "the position / drafts), greedy or sampled.", "model", "sampling", "position",
        )  # fmt: skip
        self.speedup = gauge(
            "eagle3_run_speedup",
            "Evaluated output tokens per second with the draft at k / the verifier alone's, both with "
            "`concurrency` requests in flight (greedy; the result's speedup and speedupConcurrency).",
            "model", "k", "concurrency",
        )  # fmt: skip
        self.validation_loss = gauge("eagle3_run_validation_loss", "Best validation loss of training.")
        self.hidden_bytes = gauge("eagle3_run_hidden_state_bytes", "Bytes of extracted hidden states.")
        self.tokens = gauge("eagle3_run_tokens_processed", "Tokens a stage processed.", "stage")
        self.blocked = gauge(
            "eagle3_run_pod_blocked", "1 while a pod of the stage (serve: the vLLM Deployment) does not run, "
            "by the kubelet's or scheduler's reason (status blockedBy).", "stage", "reason",
        )  # fmt: skip
        self.draft = Info("eagle3_serving_draft", "The draft a run serves.", list(RUN), registry=r)
        self.rollout = gauge(
            "eagle3_serving_draft_rollout_timestamp_seconds", "When the run's serving draft was rolled out.",
            "sha256",
        )  # fmt: skip

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def observe(self, report: RunReport) -> None:
        """Record one reconcile of one run."""
        first = (report.namespace, report.run) not in self.memory
        memory = self.memory.setdefault((report.namespace, report.run), RunMemory())
        self._phase(report, memory)
        for stage, seconds in report.finished:
            if seconds is not None:
                self.stage_seconds.labels(report.namespace, stage).observe(seconds)
        self._attempts(report, memory, first)
        self._results(report, memory)
        self._running(report, memory)
        self._blocked(report, memory)
        self._serving(report, memory, first)
        ns, run, status = report.namespace, report.run, report.status
        self._samples(memory, CANARY_SLOTS, canary_samples(self.speculation, ns, run, status))
        self._samples(memory, SWEEP_SLOTS, sweep_samples(self.speculation, ns, run, report.model, status))
        self._samples(memory, CHOICE_SLOTS, choice_samples(self.speculation, ns, run, report.model, status))
        self._samples(
            memory, CATEGORY_SLOTS, category_samples(self.speculation, ns, run, report.model, status)
        )

    def forget_run(self, namespace: str, name: str) -> None:
        """A deleted run: every series with its `run` label goes, and it leaves its phase."""
        memory = self.memory.pop((namespace, names.run_label(name)), None)
        if memory is None:
            return
        if memory.phase is not None:
            self.runs.labels(namespace, memory.phase.value).dec()
        for slot in list(memory.series):
            self._drop(memory, slot)

    def _series(self, memory: RunMemory, slot: str, metric: M, *labels: str) -> M:
        """The child of `metric` the run's `slot` holds now; the slot's previous labels, if others, go."""
        old = memory.series.get(slot)
        if old is not None and (old[0] is not metric or old[1] != labels):
            self._drop(memory, slot)
        memory.series[slot] = (metric, labels)
        return metric.labels(*labels)

    def _drop(self, memory: RunMemory, slot: str) -> None:
        old = memory.series.pop(slot, None)
        if old is not None:
            with contextlib.suppress(KeyError):
                old[0].remove(*old[1])

    def _phase(self, report: RunReport, memory: RunMemory) -> None:
        if report.namespace not in self.namespaces:  # every phase of a namespace exists, at zero at least
            self.namespaces.add(report.namespace)
            for phase in RunPhase:
                self.runs.labels(report.namespace, phase.value).inc(0)
        if memory.phase != report.phase:
            if memory.phase is not None:
                self.runs.labels(report.namespace, memory.phase.value).dec()
            self.runs.labels(report.namespace, report.phase.value).inc()
            memory.phase = report.phase
            for phase in RunPhase:
                labels = (report.namespace, report.run, phase.value)
                self._series(memory, f"phase/{phase.value}", self.phase, *labels).set(phase == report.phase)

    def _attempts(self, report: RunReport, memory: RunMemory, first: bool) -> None:
        """Count each Job once as an attempt and, if it failed, once as a failure (see the module doc)."""
        ns, run = report.namespace, report.run
        for stage, st in report.status.stages.items():
            if stage not in memory.stages and st.phase != StagePhase.SKIPPED:
                memory.stages.add(stage)  # zero first, for the dashboard's counts
                self._series(memory, f"attempts/{stage}", self.attempts, ns, run, stage).inc(0)
                for reason in FAILURE_REASONS:
                    self._series(memory, f"failures/{stage}/{reason}", self.failures, ns, run, stage, reason)
        if first:
            memory.jobs |= {job.name for job in report.jobs}
            memory.failed |= {job.name for job in report.jobs if job.phase == StagePhase.FAILED}
        for name, stage in [*report.created, *((job.name, job.stage) for job in report.jobs)]:
            if name not in memory.jobs:
                memory.jobs.add(name)
                self._series(memory, f"attempts/{stage}", self.attempts, ns, run, stage).inc()
        for job in report.jobs:
            if job.phase == StagePhase.FAILED and job.name not in memory.failed:
                memory.failed.add(job.name)
                labels = (ns, run, job.stage, failure_reason(job))
                slot = "/".join(labels[2:])
                self._series(memory, f"failures/{slot}", self.failures, *labels).inc()
                self._series(memory, f"last_failure/{slot}", self.last_failure, *labels).set(report.now)

    def _results(self, report: RunReport, memory: RunMemory) -> None:
        """Per-run figures from the stages' results; a figure stays until a new result replaces it."""
        ns, run = report.namespace, report.run
        results = stage_results(report.status)
        evaluate = result_of(results, EvaluateResult)
        train = result_of(results, TrainResult) or TrainResult()
        extract = result_of(results, ExtractResult) or ExtractResult()
        if evaluate is not None and report.model is not None:
            self._evaluated(report, memory, evaluate, report.model)
        for slot, gauge, figure in (
            ("validation_loss", self.validation_loss, train.best_val_loss),
            ("hidden_state_bytes", self.hidden_bytes, extract.bytes),
        ):
            if figure is not None:
                self._series(memory, slot, gauge, ns, run).set(figure)
        for stage, result in results.items():
            tokens = result.tokens_processed
            if tokens is not None:
                self._series(memory, f"tokens/{stage}", self.tokens, ns, run, stage).set(tokens)

    def _evaluated(self, report: RunReport, memory: RunMemory, result: EvaluateResult, model: str) -> None:
        """evaluate's figures by sampling (greedy; sampled when measured) and draft position, and the speedup.
        A new result replaces them all: a figure it lacks (no sampled measurement, fewer positions) goes."""
        ns, run = report.namespace, report.run
        kept: set[str] = set()
        for sampling, figures in evaluated_acceptance(result).items():
            for slot, metric, value in (
                (f"acceptance_length/{sampling}", self.acceptance, figures.length),
                (f"acceptance_rate/{sampling}", self.acceptance_rate, figures.rate),
            ):
                if value is not None:
                    self._series(memory, slot, metric, ns, run, model, sampling).set(value)
                    kept.add(slot)
            for position, value in enumerate(figures.by_position):
                slot = f"acceptance_position/{sampling}/{position}"
                labels = (ns, run, model, sampling, str(position))
                self._series(memory, slot, self.acceptance_position, *labels).set(value)
                kept.add(slot)
        if result.speedup is not None:
            at = (str(result.num_speculative_tokens or ""), str(result.speedup_concurrency or ""))
            self._series(memory, "speedup", self.speedup, ns, run, model, *at).set(result.speedup)
            kept.add("speedup")
        self._keep_only(
            memory, ("acceptance_length/", "acceptance_rate/", "acceptance_position/", "speedup"), kept
        )

    def _keep_only(self, memory: RunMemory, prefixes: tuple[str, ...], kept: set[str]) -> None:
        """Drop the run's series of slots starting with one of `prefixes` that are not in `kept`."""
        for slot in [s for s in memory.series if s.startswith(prefixes) and s not in kept]:
            self._drop(memory, slot)

    def _samples(self, memory: RunMemory, prefix: str, samples: list[Sample]) -> None:
        """Set `samples`; the run's other series under slots starting with `prefix` go."""
        for sample in samples:
            self._series(memory, sample.slot, sample.gauge, *sample.labels).set(sample.value)
        self._keep_only(memory, (prefix,), {sample.slot for sample in samples})

    def _running(self, report: RunReport, memory: RunMemory) -> None:
        """Started and expected seconds of the running stages; the series of the others go."""
        ns, run = report.namespace, report.run
        running = running_stages(report.status, report.deadlines)
        for stage, (started, expected) in running.items():
            self._series(memory, f"started/{stage}", self.started, ns, run, stage).set(started)
            self._series(memory, f"expected/{stage}", self.expected, ns, run, stage).set(expected)
        for slot in [s for s in memory.series if s.startswith(("started/", "expected/"))]:
            if slot.split("/", 1)[1] not in running:
                self._drop(memory, slot)

    def _blocked(self, report: RunReport, memory: RunMemory) -> None:
        """1 for each stage (and `serve`) whose pod does not run now; the series of the others go."""
        blocked = blocked_pods(report.status)
        for stage, why in blocked.items():
            labels = (report.namespace, report.run, stage, why.reason)
            self._series(memory, f"blocked/{stage}", self.blocked, *labels).set(1)
        for slot in [s for s in memory.series if s.startswith("blocked/")]:
            if slot.split("/", 1)[1] not in blocked:
                self._drop(memory, slot)

    def _serving(self, report: RunReport, memory: RunMemory, first: bool) -> None:
        """The draft the serving Deployment points at, and when the operator first saw it there."""
        draft = serving_draft(report.status)
        if draft is None:
            self._drop(memory, "draft")
            self._drop(memory, "rollout")
            memory.rollout = None
            return
        if report.model is not None:
            info = {"model": report.model, "checkpoint": draft.checkpoint, "sha256": draft.sha256}
            self._series(memory, "draft", self.draft, report.namespace, report.run).info(info)
        if memory.rollout is None or memory.rollout[:2] != (draft.checkpoint, draft.sha256):
            seen = (rolled_out_before(report.status, draft) if first else None) or report.now
            memory.rollout = (draft.checkpoint, draft.sha256, seen)
        rollout = self._series(memory, "rollout", self.rollout, report.namespace, report.run, draft.sha256)
        rollout.set(memory.rollout[2])
