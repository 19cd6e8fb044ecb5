"""High availability: of several operators one is active, the others stand by (kopf's own peering).

Every operator writes a keep-alive into kopf's peering object `eagle3-operator` (a ClusterKopfPeering when it
watches the whole cluster, a KopfPeering in each namespace it watches; their CRDs are crds/kopf-peering.yaml)
under its identity: its priority, when it was last seen and for how long that holds (`lifetime`). kopf pauses
the handlers of an operator that sees a live peer of a higher priority, and of all operators of the same
priority, so priorities must differ: by default an earlier-started operator ranks higher (a running one keeps
the work while a rolling update's new pod waits), and a tie is resolved by a re-draw (`Peering.active`).
A standby takes over when the active one leaves: at once after a graceful stop (kopf deletes its record),
`lifetime` seconds after its last keep-alive when it was killed.

kopf's decision is eventually consistent (each operator decides from the keep-alives it has seen), so it
is fenced: the operator kopf un-pauses acts only while it holds the Lease (eagle3_operator.lease), a toggle
in kopf's own pause set. kopf pauses only its own handlers. The operator's other parts (the periodic resync,
the live progress reads, the retries, /healthz) ask the gate, which answers with that one set (kopf_pause):
one source of truth for "am I active". The peering object is read only to say why this operator is paused,
and to re-draw a tie (kopf pauses every operator of a tied priority, for ever).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from eagle3_operator.k8s import ApiError, Kube
from eagle3_operator.kopf_pause import PauseState
from eagle3_operator.lease import TOGGLE_NAME, Lease

logger = logging.getLogger(__name__)

PEERING_NAME = "eagle3-operator"  # not kopf's "default": other kopf operators of the cluster are no peers
# A killed active operator is replaced this long after its last keep-alive at most (kopf renews 5-10 s early).
LIFETIME_SECONDS = 30
LIFETIME_ENV = "EAGLE3_PEERING_LIFETIME_SECONDS"
KOPF_LIFETIME_SECONDS = 60  # what kopf assumes of a record that names no lifetime
TAIL = 1000  # the random tail of a default priority, and the most a re-draw lowers one


def identity() -> str:
    """This operator's name among its peers: the pod (kopf's POD_ID, else the hostname) and the process."""
    return f"{os.environ.get('POD_ID') or socket.gethostname()}/{os.getpid()}"


def lifetime_seconds(environ: Mapping[str, str] = os.environ) -> int:
    """How long a keep-alive holds: LIFETIME_SECONDS, or $EAGLE3_PEERING_LIFETIME_SECONDS (tests: quick
    hand-overs)."""
    text = environ.get(LIFETIME_ENV)
    if not text:
        return LIFETIME_SECONDS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"${LIFETIME_ENV} is {text!r}: give a whole number of seconds (1 or more), or unset it"
        )
    return value


def default_priority(started: float | None = None, tail: int | None = None) -> int:
    """The priority of an operator started at `started` (seconds since the epoch): earlier ranks higher.

    Millisecond resolution and a random tail make a tie practically impossible; the value is negative, so
    any explicit `--priority` of 0 or more outranks every defaulted operator (e.g. a debugging one)."""
    started = time.time() if started is None else started
    tail = random.randrange(TAIL) if tail is None else tail
    return -(int(started * 1000) * TAIL + tail)


@dataclass(frozen=True)
class Peer:
    """One operator's record in the peering object's status, read as kopf reads it."""

    identity: str
    priority: int
    lastseen: datetime
    lifetime: timedelta

    def alive(self, now: datetime) -> bool:
        return self.lastseen + self.lifetime > now


def peers(status: Mapping[str, Any] | None, now: datetime) -> list[Peer]:
    """The records of a peering object's status (kopf's defaults for missing fields)."""
    found = []
    for name, record in (status or {}).items():
        if not isinstance(record, Mapping):
            continue
        found.append(
            Peer(
                identity=str(name),
                priority=int(record.get("priority") or 0),
                lastseen=_when(record.get("lastseen"), now),
                lifetime=timedelta(seconds=int(record.get("lifetime", KOPF_LIFETIME_SECONDS))),
            )
        )
    return found


def _when(stamp: Any, now: datetime) -> datetime:
    try:
        when = datetime.fromisoformat(str(stamp)) if stamp else now
    except ValueError:
        return now
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Standing:
    """Whether this operator is the active one, and if not, which live peers keep it waiting."""

    active: bool
    above: tuple[str, ...] = ()  # live peers of a higher priority
    tied: tuple[str, ...] = ()  # live peers of the same priority (kopf pauses all of them)
    missing: bool = False  # no peering object: kopf's mandatory peering keeps the operator paused
    starting: bool = False  # kopf has not decided yet (it starts a peered operator paused)
    lease: str | None = (
        None  # kopf's peering lets it act, but it does not hold the Lease: where, and who does
    )

    def __str__(self) -> str:
        if self.starting:
            return "starting: kopf's peering has not decided yet (no handler runs until it has)"
        if self.lease is not None:
            return f"standby: waiting for the {self.lease}"
        if self.missing:
            return f"standby: the peering object {PEERING_NAME} is missing"
        if self.active:
            return "active"
        if self.above:
            return f"standby behind {', '.join(self.above)}"
        if self.tied:
            return f"standby: same priority as {', '.join(self.tied)}"
        return "standby: paused by kopf's peering"


def standing(found: Iterable[Peer], me: str, priority: int, now: datetime) -> Standing:
    """kopf's rule (kopf._core.engines.peering.process_peering_event): a live peer of a higher priority, or
    of the same one, pauses this operator."""
    live = [p for p in found if p.identity != me and p.alive(now)]
    above = tuple(p.identity for p in live if p.priority > priority)
    tied = tuple(p.identity for p in live if p.priority == priority)
    return Standing(active=not above and not tied, above=above, tied=tied)


def yields_tie(me: str, tied: Sequence[str]) -> bool:
    """Of peers tied on one priority, all but the one whose identity sorts first re-draw: each decides alone,
    from the same record, so exactly one keeps the priority."""
    return bool(tied) and me > min(tied)


def redrawn(priority: int, rng: random.Random | None = None) -> int:
    """A lower priority than `priority`, by a random 1..TAIL (a defaulted one stays in its start order)."""
    return priority - (rng or random).randint(1, TAIL)


class Peering:
    """This operator's standing among its peers: kopf's decision (`kopf`, given once kopf's tasks exist:
    kopf_pause), explained from the peering objects it writes its keep-alives to (each watched namespace's
    KopfPeering, or the ClusterKopfPeering)."""

    def __init__(
        self,
        kube: Kube,
        settings: kopf.OperatorSettings,
        me: str,
        namespaces: Sequence[str],
        lease: Lease,
    ) -> None:
        self.kube, self.settings, self.me, self.lease = kube, settings, me, lease
        self.where: list[str | None] = list(namespaces) or [None]
        self.last: Standing | None = None
        self.kopf: PauseState | None = None

    @contextlib.asynccontextmanager
    async def following(self, toggles: Any) -> AsyncIterator[None]:
        """kopf's pause decision for this operator's peering objects (kopf_pause.operator's ToggleSet), fenced
        by the Lease (a toggle of the same set) while kopf runs."""
        self.follow(toggles)
        async with self.lease.following(toggles, self.wanted):
            yield

    def follow(self, toggles: Any) -> None:
        """kopf's pause decision for this operator's peering objects (with the Lease's toggle, if any)."""
        self.kopf = PauseState(toggles, str(self.settings.peering.name), self.where)

    def wanted(self) -> bool:
        """Whether kopf's peering lets this operator act (the Lease aside): it then takes the Lease."""
        return self.kopf is not None and self.kopf.paused(ignoring=TOGGLE_NAME) is False

    def decided(self) -> bool | None:
        """The decision: True active (kopf's peering lets it act and it holds the Lease), False paused, None
        not decided yet (or kopf not started)."""
        paused = self.kopf.paused() if self.kopf is not None else None
        return None if paused is None else not paused and self.lease.held()

    @property
    def priority(self) -> int:
        return int(self.settings.peering.priority)

    async def ensure(self) -> None:
        """Create the peering objects that do not exist yet (kopf writes into them, but creates none)."""
        for namespace in self.where:
            meta: dict[str, Any] = {"name": PEERING_NAME}
            kind = "KopfPeering" if namespace else "ClusterKopfPeering"
            if namespace:
                meta["namespace"] = namespace
            body = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta}
            if await self.kube.peering("create", namespace, PEERING_NAME, body) is not None:
                logger.info("created the %s %s%s", kind, f"{namespace}/" if namespace else "", PEERING_NAME)

    async def active(self) -> bool:
        """Whether this operator is the active one now: kopf's decision. While kopf pauses it, the peering
        objects are read for the reason, and a tie this operator must yield is re-drawn."""
        decided = self.decided()
        if decided:
            now = Standing(active=True)
        elif decided is None:
            now = Standing(active=False, starting=True)
        else:
            now = await self._why_paused()
        if self.last is None or str(now) != str(self.last):
            logger.info("this operator (%s, priority %s) is %s", self.me, self.priority, now)
        self.last = now
        return now.active

    async def _why_paused(self) -> Standing:
        """Who outranks this operator, as the peering objects say now; kopf's pause stands whatever they say
        (its decision may rest on an event this read does not see yet). Where kopf lets it act, the Lease
        is why it waits."""
        if self.wanted():
            holder = self.lease.holder()
            held_by = f" (held by {holder})" if holder and holder != self.me else ""
            return Standing(active=False, lease=f"{self.lease.where}{held_by}")
        try:
            found = await self._standing()
        except (ApiError, ValueError, TypeError) as err:  # unreachable, refused, a record kopf did not write
            logger.warning("could not read the peering object to say why kopf pauses this operator: %s", err)
            return Standing(active=False)
        return dataclasses.replace(found, active=False)

    async def _standing(self) -> Standing:
        standings = [await self._standing_in(namespace) for namespace in self.where]
        waiting = [s for s in standings if not s.active]
        return waiting[0] if waiting else standings[0]

    async def _standing_in(self, namespace: str | None) -> Standing:
        body = await self.kube.peering("get", namespace, PEERING_NAME)
        if body is None:
            return Standing(active=False, missing=True)
        now = datetime.now(UTC)
        found = peers(body.get("status"), now)
        result = standing(found, self.me, self.priority, now)
        if not result.above and yields_tie(self.me, result.tied):
            await self._redraw(result.tied)
            result = standing(found, self.me, self.priority, now)
        return result

    async def _redraw(self, tied: Sequence[str]) -> None:
        """Lower this operator's priority (kopf's keep-alives carry it from now on) and publish it at once,
        so that the peers re-evaluate (kopf un-pauses the one that keeps its priority)."""
        before, after = self.priority, redrawn(self.priority)
        self.settings.peering.priority = after
        logger.warning(
            "peers %s have this operator's priority %s: it re-draws %s and stands by",
            ", ".join(tied),
            before,
            after,
        )
        record = {
            "priority": after,
            "lifetime": int(self.settings.peering.lifetime),
            "lastseen": datetime.now(UTC).isoformat(),
        }
        for namespace in self.where:
            await self.kube.peering("patch", namespace, PEERING_NAME, {"status": {self.me: record}})

    def probe(self) -> dict[str, Any]:
        """What kopf's health endpoint shows of the peering: kopf's decision as it is now."""
        decided = self.decided()
        role = "starting" if decided is None else ("active" if decided else "standby")
        lease = {"name": self.lease.where, "holder": self.lease.holder()}
        return {"identity": self.me, "priority": self.priority, "role": role, "lease": lease}


async def acting(gate: Peering | None) -> bool:
    """Whether the operator's own background tasks may act: always without peering (`gate` None: standalone),
    else only while kopf runs this operator's handlers."""
    return True if gate is None else await gate.active()


@dataclass(frozen=True)
class PeeringRead:
    """One peering object as `eagle3 status` read it: `body` None where there is none, `error` (e.g. HTTP 403)
    where it could not be read."""

    where: str  # e.g. "KopfPeering team-a/eagle3-operator"
    body: Mapping[str, Any] | None = None
    error: str | None = None


def _ago(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 120:
        return f"{s} s ago"
    return f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def presence(reads: Sequence[PeeringRead], now: datetime) -> str:
    """Whether an operator runs, from the peering objects its keep-alives would be in: the live peers (the
    highest priority first: the active one), or none (with the last one seen), or unknown where no object
    could be read (none exists where kopf's peering CRDs are not installed, or access is refused)."""
    statuses = [read.body.get("status") for read in reads if read.body is not None]
    found = [peer for status in statuses if isinstance(status, Mapping) for peer in peers(status, now)]
    live = sorted((p for p in found if p.alive(now)), key=lambda p: -p.priority)
    if live:
        first, *others = live
        text = f"operator {first.identity} alive (last seen {_ago((now - first.lastseen).total_seconds())})"
        return text + (f", {', '.join(p.identity for p in others)} standing by" if others else "")
    if any(read.body is not None for read in reads):
        last = max(found, key=lambda p: p.lastseen, default=None)
        seen = (
            f"; {last.identity} was last seen {_ago((now - last.lastseen).total_seconds())}" if last else ""
        )
        return (
            f"no operator is running (peering '{PEERING_NAME}' has no live peer{seen}): install the chart or "
            "run `eagle3 operator`"
        )
    why = "; ".join(f"{r.where}: {r.error}" if r.error else f"no {r.where}" for r in reads)
    return f"whether an operator is running is unknown ({why})"
