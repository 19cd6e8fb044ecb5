"""Exclusive leadership: the active operator holds a coordination.k8s.io/v1 Lease (issue 41).

kopf's peering (eagle3_operator.peering) decides which operator ought to act: the highest priority among the
live keep-alives. That decision is eventually consistent: each operator makes it alone from the keep-alives
it has seen so far, so two operators that start together can both un-pause until each sees the other's write
(on the real node under `make test`'s load both chart replicas reported active for a moment). The Lease makes
it exclusive: an operator that kopf's peering un-pauses acts only while it holds the Lease, which it takes
and renews by compare-and-swap (a replace carries the resourceVersion it read; the API server refuses a stale
one with HTTP 409), as client-go's leader election does.

- Its timing is client-go's default (lease 15 s, renew deadline 10 s, retry 2 s); $EAGLE3_LEASE_SECONDS
  sets the lease, the deadline follows in proportion, the retry too up to 2 s.
- Clocks of different machines are never compared: a candidate takes over a Lease whose record has not
  changed for the lease's duration by its own monotonic clock, or one its holder released. The holder stops
  acting once no renewal succeeded for the renew deadline, counted from the start of the last renewal that
  did; the deadline is shorter than the duration, so the holder pauses before anyone may take over.
- Every operator reads the Lease each retry, standbys too (without writing), so that the one kopf un-pauses
  after a killed holder's keep-alive expired finds the Lease expired already.
- A holder that kopf pauses, or that stops, releases the Lease (holder cleared) for a standby to take at once.

The gate is a toggle in kopf's own pause ToggleSet (kopf_pause): on (paused) unless the Lease is held, so
kopf's handlers and the operator's own tasks follow one decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from eagle3_operator.k8s import ApiError, Kube

logger = logging.getLogger(__name__)

LEASE_NAME = "eagle3-operator"
LEASE_SECONDS = 15  # client-go's LeaseDuration; its RenewDeadline and RetryPeriod scale with it
LEASE_ENV = "EAGLE3_LEASE_SECONDS"
MAX_RETRY_SECONDS = 2.0
TOGGLE_NAME = "eagle3-operator Lease"
CLUSTER_WIDE_NAMESPACE = "default"
MANAGED_BY = {"app.kubernetes.io/managed-by": "eagle3-operator"}

Claim = Literal["create", "renew", "take", "release", "wait", "none"]


@dataclass(frozen=True)
class LeaseTiming:
    duration: float  # leaseDurationSeconds: how long a record that does not change holds
    deadline: float  # the holder stops acting when no renewal succeeded for this long
    retry: float  # how often the Lease is read, and renewed by its holder

    @classmethod
    def of(cls, duration: int) -> LeaseTiming:
        """client-go's defaults (15 s, 10 s, 2 s): the deadline in proportion, the retry too, up to 2 s (a
        longer Lease waits longer for a killed holder, not for a released one)."""
        return cls(float(duration), duration * 2 / 3, min(duration * 2 / 15, MAX_RETRY_SECONDS))


def lease_seconds(environ: Mapping[str, str] = os.environ) -> int:
    """LEASE_SECONDS, or $EAGLE3_LEASE_SECONDS (tests: quick take-overs)."""
    text = environ.get(LEASE_ENV)
    if not text:
        return LEASE_SECONDS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"${LEASE_ENV} is {text!r}: give a whole number of seconds (1 or more), or unset it")
    return value


def lease_namespace(namespaces: Sequence[str]) -> str:
    """Where the operators that peer together keep their Lease: the first of the watched namespaces in
    order (the same for every replica, however its --namespace flags are ordered), else, for operators that
    watch the whole cluster and peer in the one ClusterKopfPeering, `default`, which every cluster has (and
    not the operator's own namespace: two cluster-wide releases share one peering, so one Lease too)."""
    return min(namespaces) if namespaces else CLUSTER_WIDE_NAMESPACE


@dataclass(frozen=True)
class Observed:
    """The Lease as this operator saw it: its resourceVersion, holder and duration, and when (this operator's
    monotonic clock) that resourceVersion was first seen."""

    version: str
    holder: str
    duration: float
    since: float
    body: Mapping[str, Any]


def observe(previous: Observed | None, body: Mapping[str, Any] | None, now: float) -> Observed | None:
    """The Lease read at `now`; a record seen before keeps the time it was first seen."""
    if body is None:
        return None
    version = str((body.get("metadata") or {}).get("resourceVersion") or "")
    spec = body.get("spec") or {}
    since = previous.since if previous is not None and previous.version == version else now
    duration = float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
    return Observed(version, str(spec.get("holderIdentity") or ""), duration, since, body)


def plan_claim(seen: Observed | None, me: str, wanted: bool, now: float) -> Claim:
    """What to write: `wanted` is kopf's peering letting this operator act."""
    if seen is None:
        return "create" if wanted else "none"
    mine = seen.holder == me
    if not wanted:
        return "release" if mine else "none"
    if mine:
        return "renew"
    if not seen.holder or now - seen.since >= seen.duration:
        return "take"
    return "wait"


def micro_time(when: datetime) -> str:
    """A MicroTime as the API server writes one."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_lease(
    namespace: str, me: str, duration: int, now: datetime, previous: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The Lease held by `me` from `now`; a replace of `previous` (its resourceVersion: the compare-and-swap)
    keeps its acquireTime where `me` held it already, and counts a change of holder in leaseTransitions."""
    old = dict((previous or {}).get("spec") or {})
    kept = old.get("holderIdentity") == me
    transitions = int(old.get("leaseTransitions") or 0) + (0 if kept or not old.get("holderIdentity") else 1)
    metadata: dict[str, Any] = {"name": LEASE_NAME, "namespace": namespace, "labels": dict(MANAGED_BY)}
    if previous is not None:
        metadata["resourceVersion"] = (previous.get("metadata") or {}).get("resourceVersion")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": me,
            "leaseDurationSeconds": duration,
            "acquireTime": old.get("acquireTime") if kept and old.get("acquireTime") else micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        },
    }


def build_release(previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """`previous` with no holder (client-go's release): the next candidate takes it at once."""
    spec = dict(previous.get("spec") or {})
    spec.update(holderIdentity=None, renewTime=micro_time(now), leaseDurationSeconds=1)
    return {**previous, "spec": spec}


class Lease:
    """This operator's hold on the Lease `eagle3-operator` in `namespace`, as a toggle of kopf's pause set."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        me: str,
        duration: int = LEASE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.me = kube, namespace, me
        self.duration, self.timing, self.clock = duration, LeaseTiming.of(duration), clock
        self.seen: Observed | None = None
        self.valid_until: float | None = None  # held, and acting allowed, until then (this clock)
        self.toggle: Any = None  # kopf's Toggle: on (paused) unless the Lease is held

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{LEASE_NAME}"

    def held(self) -> bool:
        return self.valid_until is not None and self.clock() < self.valid_until

    def holder(self) -> str | None:
        """Who holds the Lease as last read (None: nobody, or not read yet)."""
        return (self.seen.holder or None) if self.seen is not None else None

    async def step(self, wanted: bool) -> None:
        """One round: read the Lease, write what `plan_claim` says, and turn the toggle to match."""
        started = self.clock()
        try:
            body = await self.kube.lease("get", self.namespace, LEASE_NAME)
            self.seen = observe(self.seen, body, started)
            claim = plan_claim(self.seen, self.me, wanted, started)
            if claim == "release":
                await self._pause()
            if claim in ("create", "renew", "take", "release"):
                await self._write(claim, started)
        except ApiError as err:  # unreachable, refused: the hold runs out at its deadline
            logger.warning("could not read or write the %s: %s", self.where, err)
        await self._expire()

    async def _expire(self) -> None:
        """Stop acting once the hold ran out (no renewal succeeded for the renew deadline)."""
        if self.valid_until is not None and self.clock() >= self.valid_until:
            logger.warning(
                "operator %s could not renew the %s for %.0f s: it stops acting",
                self.me,
                self.where,
                self.timing.deadline,
            )
            self.valid_until = None
        await self._turn()

    async def _write(self, claim: Claim, started: float) -> None:
        now = datetime.now(UTC)
        previous = self.seen.body if self.seen is not None else None
        if claim == "release":
            released = build_release(previous or {}, now)
            written = await self.kube.lease("replace", self.namespace, LEASE_NAME, released)
            logger.info("operator %s released the %s", self.me, self.where)
            self.seen = observe(self.seen, written, started)
            return
        body = build_lease(self.namespace, self.me, self.duration, now, previous)
        verb = "create" if claim == "create" else "replace"
        written = await self.kube.lease(verb, self.namespace, LEASE_NAME, body)
        if written is None:  # HTTP 409: another operator wrote first; read again next round
            self.valid_until = None
            return
        if self.valid_until is None:
            logger.info("operator %s holds the %s", self.me, self.where)
        self.seen = observe(self.seen, written, started)
        self.valid_until = started + self.timing.deadline

    async def _pause(self) -> None:
        self.valid_until = None
        await self._turn()

    async def _turn(self) -> None:
        if self.toggle is not None:
            await self.toggle.turn_to(not self.held())

    async def release(self) -> None:
        """Give the Lease up where this operator holds it (a graceful stop)."""
        if self.seen is None or self.seen.holder != self.me:
            return
        await self._pause()
        try:
            await self._write("release", self.clock())
        except ApiError as err:
            logger.warning("could not release the %s (it expires by itself): %s", self.where, err)

    @contextlib.asynccontextmanager
    async def following(self, toggles: Any, wanted: Callable[[], bool]) -> AsyncIterator[None]:
        """Hold the Lease while `wanted()` (kopf's peering un-pauses this operator) for the duration of the
        block; the toggle joins kopf's pause set `toggles`, and the Lease is released on the way out."""
        self.toggle = await toggles.make_toggle(True, name=TOGGLE_NAME)
        task = asyncio.create_task(self._run(wanted), name="eagle3-operator lease")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.release()
            await toggles.drop_toggle(self.toggle)
            self.toggle = None

    async def _run(self, wanted: Callable[[], bool]) -> None:
        """A round each retry period, cut short where the API server does not answer before the hold runs
        out (an API call's own timeout is longer than the renew deadline)."""
        while True:
            limit = self.timing.deadline
            if self.valid_until is not None:
                limit = min(limit, max(self.valid_until - self.clock(), 0.0))
            try:
                async with asyncio.timeout(limit):
                    await self.step(wanted())
            except TimeoutError:
                logger.warning("the %s got no answer within %.1f s", self.where, limit)
            await self._expire()
            await asyncio.sleep(self.timing.retry)
