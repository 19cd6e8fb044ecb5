"""What every reconcile of one operator process shares: the API client, the metrics, and what it remembers
of the runs between reconciles.

One object, made at startup (eagle3_operator.state) and held in kopf's memo: kopf hands each handler its
object's shallow copy of the operator's memo, so everything that changes lives in this object, which every
copy shares. Its fields:
- `locks`: one reconcile of a run at a time;
- `queued`: runs with a reconcile waiting for its lock that has not read the indexes yet (it covers every
  request made meanwhile: trigger.py);
- `versions`: the resourceVersion of each child whose event was handled (a replay of it is no news);
- `statuses`: the status this process last wrote for a run (with the run's uid), newer than kopf's body;
- `pending`: the children it created that the watches have not shown yet (PENDING_SECONDS in executor.py);
- `gone`: uids of runs and children found deleted (their stale index entries are skipped);
- `unsure`: runs whose last status patch got no answer (the next reconcile reads the server's status);
- `progress`: the live progress of running stage attempts (eagle3_operator.stage_metrics fills it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from eagle3_contract.api.defaults import OperatorDefaults
from eagle3_contract.api.status import StageProgress
from eagle3_operator.k8s import Kube
from eagle3_operator.reconcile.run_report import RunReport
from eagle3_operator.reconcile.server_features import ServerFeatures

Key = tuple[str, str]  # a run in every index: its namespace and its `eagle3.dev/run` label
Created = tuple[float, dict[str, Any]]  # when a child was created (monotonic), and its body


class RunMetrics(Protocol):
    """What a reconcile tells the operator's metrics (eagle3_operator.metrics.OperatorMetrics)."""

    reconciles: Counter
    latency: Histogram

    def observe(self, report: RunReport) -> None: ...

    def forget_run(self, namespace: str, name: str) -> None: ...


@dataclass
class ReconcileState:
    kube: Kube
    metrics: RunMetrics
    defaults: OperatorDefaults = field(default_factory=OperatorDefaults)
    namespaces: tuple[str, ...] = ()  # watched namespaces; () for the whole cluster
    pod_monitors: bool = False  # the cluster serves PodMonitors (the Prometheus operator's CRD)
    disruption_budgets: bool = False  # the cluster serves policy/v1 PodDisruptionBudgets
    features: ServerFeatures = field(default_factory=ServerFeatures)  # what the server's version offers Jobs
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    queued: set[Key] = field(default_factory=set)
    versions: dict[str, str] = field(default_factory=dict)
    statuses: dict[Key, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    pending: dict[Key, dict[tuple[str, str], Created]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    unsure: set[Key] = field(default_factory=set)
    progress: dict[Key, dict[str, StageProgress]] = field(default_factory=dict)

    def serves(self, index: str) -> bool:
        """Whether the cluster serves the kind of an optional index (PodMonitors, PodDisruptionBudgets)."""
        return {
            "owned_pod_monitors": self.pod_monitors,
            "owned_disruption_budgets": self.disruption_budgets,
        }.get(index, True)
