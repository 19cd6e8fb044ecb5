"""The operator process's state: one typed object in kopf's memo (`memo.state`), made by the startup handler.

Whoever starts the operator hands its settings over as memo keys (`eagle3 operator` in operator_main.py,
the tests and benchmarks): `kube`, `metrics`, `defaults`, `namespaces`, `peering`, `progress_reader`,
`resync_seconds`, `progress_seconds`, `api_timeout_seconds`, `connection` (read by the login handler, which
runs before startup). `OperatorState.start` reads them once; from then on the handlers use `state_of(memo)`
only. What the reconciles share is `reconcile` (eagle3_operator.reconcile.state); the rest is the handlers'
own: the resync and live-progress tasks, the peering gate, and a handler's context for the Events of
reconciles started outside kopf's handlers.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from eagle3_contract.api.defaults import OperatorDefaults
from eagle3_operator import stage_metrics
from eagle3_operator.k8s import TOTAL_SECONDS, Kube
from eagle3_operator.metrics import OperatorMetrics
from eagle3_operator.peering import Peering
from eagle3_operator.reconcile.executor import serves_disruption_budgets
from eagle3_operator.reconcile.server_features import server_features
from eagle3_operator.reconcile.state import Key, ReconcileState

RESYNC_SECONDS = 60.0
logger = logging.getLogger(__name__)
MEMO_KEY = "state"


@dataclass
class OperatorState:
    reconcile: ReconcileState
    progress_reader: stage_metrics.Reader
    peering: Peering | None = None  # kopf's peering gate (operator_main.py); None: standalone
    owns_kube: bool = False  # the client was made here, and is closed at cleanup
    resync_seconds: float = RESYNC_SECONDS
    progress_seconds: float | None = None  # None: stage_metrics.PROGRESS_SECONDS
    # a handler's context (handlers._remember_context), for the Events of the resync's reconciles
    contexts: dict[str, contextvars.Context] = field(default_factory=dict)
    relisted: asyncio.Event = field(default_factory=asyncio.Event)  # a watch listed: sweep for ghosts soon
    resync_beat: float = field(default_factory=time.monotonic)  # the resync last moved on
    resync: asyncio.Task[None] | None = None
    progress_task: asyncio.Task[None] | None = None
    # kopf's indexes (eagle3_runs and the children's), as the startup handler got them: the retries read them
    indices: dict[str, Any] | None = None
    retries: dict[Key, asyncio.Task[None]] = field(default_factory=dict)  # a scheduled retry per run
    failures: dict[Key, int] = field(default_factory=dict)  # transient failures in a row per run

    @classmethod
    async def start(cls, memo: kopf.Memo) -> OperatorState:
        """The state of an operator started with `memo`'s settings; the API client is connected here unless
        one was handed over."""
        api_seconds = api_timeout_seconds(memo)
        kube: Kube | None = memo.get("kube")
        owns_kube = kube is None
        if kube is None:
            kube = await Kube.connect(api_seconds)
        reader: stage_metrics.Reader | None = memo.get("progress_reader")
        features = server_features(await kube.version())
        for fallback in features.fallbacks():
            logger.warning("Kubernetes %s: %s", features.version or "of an unknown version", fallback)
        reconcile = ReconcileState(
            kube=kube,
            features=features,
            metrics=memo.get("metrics") or OperatorMetrics(),
            defaults=memo.get("defaults") or OperatorDefaults(),
            namespaces=tuple(memo.get("namespaces") or ()),
            pod_monitors=await kube.serves("monitoring.coreos.com", "v1", "podmonitors"),
            disruption_budgets=await serves_disruption_budgets(kube),
        )
        return cls(
            reconcile=reconcile,
            progress_reader=reader or stage_metrics.Reader.open(),
            peering=memo.get("peering"),
            owns_kube=owns_kube,
            resync_seconds=float(memo.get("resync_seconds") or RESYNC_SECONDS),
            progress_seconds=memo.get("progress_seconds"),
        )

    async def close(self) -> None:
        """Stop the tasks; close the clients made here."""
        for task in (self.resync, self.progress_task, *self.retries.values()):
            if task is not None:
                task.cancel()
        await self.progress_reader.close()
        if self.owns_kube:
            await self.reconcile.kube.close()


def api_timeout_seconds(memo: kopf.Memo) -> float:
    """The bound of every API call (`api_timeout_seconds` in memo, else k8s.TOTAL_SECONDS)."""
    return float(memo.get("api_timeout_seconds") or TOTAL_SECONDS)


def state_of(memo: kopf.Memo) -> OperatorState | None:
    """The operator's state in `memo` (a handler's copy shares the operator's); None before startup."""
    state = memo.get(MEMO_KEY)
    return state if isinstance(state, OperatorState) else None
