"""The Lease that fences kopf's peering (eagle3_operator.lease): the claim rule, the records, and operators
racing for it through an API server that does what the real one does with a replace (a compare-and-swap on
the resourceVersion: HTTP 409 for a stale one). Clocks are the test's: every operator has its own."""

from __future__ import annotations

import asyncio
import copy
import itertools
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from eagle3_operator.k8s import ApiError, ApiUnreachable
from eagle3_operator.lease import (
    LEASE_ENV,
    LEASE_NAME,
    TOGGLE_NAME,
    Lease,
    LeaseTiming,
    Observed,
    build_lease,
    build_release,
    lease_namespace,
    lease_seconds,
    observe,
    plan_claim,
)

NOW = datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)


def seen(holder: str, since: float = 0.0, duration: float = 15.0, version: str = "1") -> Observed:
    return Observed(version, holder, duration, since, {})


@pytest.mark.parametrize(
    ("found", "wanted", "now", "claim"),
    [
        (None, True, 0.0, "create"),  # nobody made it yet
        (None, False, 0.0, "none"),  # a standby writes nothing
        (seen("me"), True, 100.0, "renew"),  # its own, however old: the compare-and-swap decides
        (seen("me"), False, 0.0, "release"),  # kopf paused the holder: it lets go at once
        (seen("other", since=0.0), True, 14.9, "wait"),  # another's, changed within its duration
        (seen("other", since=0.0), True, 15.0, "take"),  # unchanged for its duration on this clock
        (seen("", since=0.0), True, 0.0, "take"),  # released
        (seen("other"), False, 99.0, "none"),  # expired, but kopf does not let this one act
    ],
)
def test_the_claim_rule(found, wanted, now, claim):
    assert plan_claim(found, "me", wanted, now) == claim


def test_a_record_seen_before_keeps_when_it_was_first_seen_and_a_new_one_starts_over():
    body = {"metadata": {"resourceVersion": "7"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 9}}
    first = observe(None, body, 10.0)
    assert first is not None and (first.holder, first.duration, first.since) == ("a", 9.0, 10.0)
    again = observe(first, body, 50.0)
    assert again is not None and again.since == 10.0  # the holder did not renew: its time runs
    renewed = observe(again, {**body, "metadata": {"resourceVersion": "8"}}, 51.0)
    assert renewed is not None and renewed.since == 51.0
    assert observe(renewed, None, 52.0) is None


def test_the_record_keeps_its_acquire_time_on_renewal_and_counts_a_change_of_holder():
    created = build_lease("ns", "a", 15, NOW)
    assert created["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-12-07T12:00:00.123456Z",
        "renewTime": "2026-12-07T12:00:00.123456Z",
        "leaseTransitions": 0,
    }
    assert "resourceVersion" not in created["metadata"] and created["metadata"]["name"] == LEASE_NAME
    stored = {**created, "metadata": {**created["metadata"], "resourceVersion": "3"}}
    later = NOW.replace(second=10)
    renewed = build_lease("ns", "a", 15, later, stored)
    assert renewed["metadata"]["resourceVersion"] == "3"  # the compare-and-swap
    assert renewed["spec"]["acquireTime"] == created["spec"]["acquireTime"]
    assert renewed["spec"]["renewTime"] == "2026-12-07T12:00:10.123456Z"
    taken = build_lease("ns", "b", 15, later, stored)
    assert (
        taken["spec"]["leaseTransitions"] == 1 and taken["spec"]["acquireTime"] == taken["spec"]["renewTime"]
    )
    released = build_release(stored, later)
    assert released["spec"]["holderIdentity"] is None and released["metadata"]["resourceVersion"] == "3"
    after_release = build_lease("ns", "b", 15, later, released)
    assert after_release["spec"]["leaseTransitions"] == 0  # nobody held it: no transition from anyone


def test_the_timing_is_client_gos_scaled_and_the_environment_can_shorten_it():
    assert LeaseTiming.of(15) == LeaseTiming(15.0, 10.0, 2.0)
    for seconds in (1, 3, 15, 360):
        timing = LeaseTiming.of(seconds)
        assert (
            timing.retry < timing.deadline < timing.duration
        )  # the holder pauses before anyone may take over
        assert timing.retry <= 2.0  # a released Lease is taken within a round, however long the Lease
    assert lease_seconds({}) == 15 and lease_seconds({LEASE_ENV: "4"}) == 4
    for bad in ("0", "x", "-2"):
        with pytest.raises(ValueError, match=LEASE_ENV):
            lease_seconds({LEASE_ENV: bad})


class Server:
    """The API server's Lease, as far as the operator's client uses it: a replace whose resourceVersion is
    stale, or a create of one that exists, is refused (None: the client's HTTP 409). Every call yields to the
    event loop first, so that the operators' rounds interleave between their read and their write."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.versions = itertools.count(1)
        self.fail: ApiError | None = None
        self.writes: list[str | None] = []  # the holder of each write that went through

    async def lease(
        self, verb: str, namespace: str, name: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        assert (namespace, name) == ("ns", LEASE_NAME)
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        if verb == "get":
            return copy.deepcopy(self.body)
        assert body is not None
        if verb == "create" and self.body is not None:
            return None
        if verb == "replace":
            if self.body is None:
                raise ApiError(404, verb, name, "not found")
            if body["metadata"].get("resourceVersion") != self.body["metadata"]["resourceVersion"]:
                return None
        self.body = copy.deepcopy(body)
        self.body["metadata"]["resourceVersion"] = str(next(self.versions))
        self.writes.append(self.body["spec"]["holderIdentity"])
        return copy.deepcopy(self.body)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def operators(server: Server, count: int, clock: Clock) -> list[Lease]:
    return [Lease(server, "ns", f"op-{i}", 15, clock) for i in range(count)]  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [2, 3, 5])
async def test_operators_that_all_want_it_at_once_end_with_exactly_one_holder(count):
    """Issue 41: kopf's peering let two operators act for a moment. However their rounds interleave (each
    yields between its read and its write), one write wins and the others lose their compare-and-swap."""
    server, clock = Server(), Clock()
    leases = operators(server, count, clock)
    for _ in range(3):
        await asyncio.gather(*(lease.step(True) for lease in leases))
        assert [lease.held() for lease in leases].count(True) == 1
        clock.now += 2.0
    holder = next(lease for lease in leases if lease.held())
    assert server.body is not None and server.body["spec"]["holderIdentity"] == holder.me
    assert set(server.writes) == {holder.me}  # the losers never wrote over it


async def test_a_holder_that_cannot_renew_stops_acting_before_anyone_may_take_over():
    server, clock = Server(), Clock()
    first, second = operators(server, 2, clock)
    await first.step(True)
    await second.step(True)  # a standby that kopf lets act, too (its peering has not caught up)
    assert first.held() and not second.held()
    server.fail = ApiUnreachable("get", "lease", TimeoutError())
    stopped, taken = None, None
    for tick in range(40):  # half a second apart, the server unreachable for the first holder only
        clock.now += 0.5
        await first.step(True)
        server.fail, saved = None, server.fail
        await second.step(True)
        server.fail = saved
        assert not (first.held() and second.held()), tick
        stopped = stopped if stopped is not None or first.held() else clock.now
        taken = taken if taken is not None or not second.held() else clock.now
    assert stopped is not None and taken is not None
    assert stopped - 1000.0 == pytest.approx(first.timing.deadline, abs=0.5)
    assert taken > stopped and taken - 1000.0 >= first.timing.duration


async def test_a_holder_kopf_pauses_releases_it_and_a_standby_takes_it_at_once():
    server, clock = Server(), Clock()
    first, second = operators(server, 2, clock)
    await first.step(True)
    await second.step(True)
    assert first.held() and not second.held()
    await first.step(False)  # kopf's peering now prefers the other one
    assert not first.held() and server.body is not None and server.body["spec"]["holderIdentity"] is None
    await second.step(True)  # no waiting for the duration: the record says nobody holds it
    assert second.held() and server.body["spec"]["leaseTransitions"] == 0


async def test_a_stale_record_is_taken_over_only_after_its_duration_on_the_takers_own_clock():
    """A record from an operator that was killed: its renewTime is not compared with this machine's clock."""
    server, clock = Server(), Clock()
    server.body = build_lease("ns", "gone", 15, datetime(2020, 1, 1, tzinfo=UTC))
    server.body["metadata"]["resourceVersion"] = "41"
    (lease,) = operators(server, 1, clock)
    await lease.step(True)
    assert not lease.held() and lease.holder() == "gone"
    clock.now += 14.0
    await lease.step(True)
    assert not lease.held()
    clock.now += 1.0
    await lease.step(True)
    assert lease.held() and server.body["spec"]["leaseTransitions"] == 1


async def test_the_lease_is_a_toggle_of_kopfs_pause_set_on_until_held_and_released_on_the_way_out():
    server, clock = Server(), Clock()
    (lease,) = operators(server, 1, clock)
    lease.timing = LeaseTiming(15.0, 10.0, 0.01)
    toggles = ToggleSet(any)
    peering = await toggles.make_toggle(False, name="eagle3-operator@ns")
    async with lease.following(toggles, lambda: peering.is_off()):
        assert [t.name for t in toggles if t.is_on()] == [TOGGLE_NAME]  # paused before the first round
        await asyncio.wait_for(toggles.wait_for(False), 60)
        assert lease.held()
        await peering.turn_to(True)  # kopf pauses it: the Lease goes
        await asyncio.wait_for(_until(lambda: not lease.held()), 60)
        await peering.turn_to(False)
        await asyncio.wait_for(toggles.wait_for(False), 60)
    assert server.body is not None and server.body["spec"]["holderIdentity"] is None
    assert [t.name for t in toggles] == ["eagle3-operator@ns"]


async def test_a_round_the_server_does_not_answer_is_cut_at_the_hold_and_the_operator_pauses():
    class Stalled(Server):
        stall = False

        async def lease(self, verb: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
            if self.stall:
                await asyncio.sleep(math.inf)
            return await super().lease(verb, *args, **kwargs)

    server = Stalled()
    lease = Lease(server, "ns", "me", 3)  # type: ignore[arg-type]  (the real clock: 2 s deadline)
    toggles = ToggleSet(any)
    async with lease.following(toggles, lambda: True):
        await asyncio.wait_for(toggles.wait_for(False), 60)
        server.stall = True  # every call hangs: an API call's own timeout (30 s) would come far too late
        # every call now hangs for ever: the operator pauses only because each round is cut at the hold's end
        # (an API call's own 30 s timeout would not even exist here); the bound says it happens, not how fast
        await asyncio.wait_for(toggles.wait_for(True), 60)
        assert not lease.held()
        server.stall = False


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_replicas_find_one_lease_however_their_namespaces_are_ordered():
    assert lease_namespace(["team-b", "team-a"]) == lease_namespace(["team-a", "team-b"]) == "team-a"
    assert (
        lease_namespace([]) == "default"
    )  # cluster-wide operators: one Lease for the one ClusterKopfPeering
