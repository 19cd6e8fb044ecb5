"""The operator's Prometheus metrics. One registry per operator process, held in kopf's memo."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from eagle3_operator.api.status import RunPhase

STAGE_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 172800, float("inf"))


@dataclass
class OperatorMetrics:
    """Reconcile count and latency, runs by phase, stage durations and per-run acceptance length."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    phases: dict[tuple[str, str], RunPhase] = field(default_factory=dict)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "eagle3_operator_reconciles", "Reconciliations of Eagle3Runs, by result.", ["result"], registry=r
        )
        self.latency = Histogram(
            "eagle3_operator_reconcile_duration_seconds", "Time to reconcile one Eagle3Run.", registry=r
        )
        self.runs = Gauge("eagle3_operator_runs", "Eagle3Runs by phase.", ["phase"], registry=r)
        self.stage_seconds = Histogram(
            "eagle3_operator_stage_duration_seconds",
            "Wall-clock duration of finished stage Jobs.",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.acceptance = Gauge(
            "eagle3_run_acceptance_length",
            "Mean acceptance length measured by the evaluate stage.",
            ["namespace", "run"],
            registry=r,
        )
        for phase in RunPhase:
            self.runs.labels(phase.value).set(0)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def observe_run(
        self,
        namespace: str,
        name: str,
        phase: RunPhase,
        acceptance: float | None,
        finished: Iterable[tuple[str, float | None]],
    ) -> None:
        """Record a run's reconciled state; `finished` are stages that finished in this reconciliation."""
        key = (namespace, name)
        old = self.phases.get(key)
        if old != phase:
            if old is not None:
                self.runs.labels(old.value).dec()
            self.runs.labels(phase.value).inc()
            self.phases[key] = phase
        if acceptance is not None:
            self.acceptance.labels(namespace, name).set(acceptance)
        for stage, seconds in finished:
            if seconds is not None:
                self.stage_seconds.labels(stage).observe(seconds)

    def forget_run(self, namespace: str, name: str) -> None:
        old = self.phases.pop((namespace, name), None)
        if old is not None:
            self.runs.labels(old.value).dec()
        with contextlib.suppress(KeyError):
            self.acceptance.remove(namespace, name)
