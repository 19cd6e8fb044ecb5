"""The operator's peering: the default priority, the "am I active" rule (checked against kopf's own), the
re-draw of a tie, and the gate the background tasks ask (eagle3_operator.peering), with plain data."""

from __future__ import annotations

import asyncio
import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet
from kopf._cogs.structs.references import Resource
from kopf._core.engines.peering import process_peering_event

from eagle3_operator import peering, rbac
from eagle3_operator.k8s import ApiError
from eagle3_operator.lease import LEASE_NAME, Lease
from eagle3_operator.peering import (
    PEERING_NAME,
    TAIL,
    Peering,
    default_priority,
    lifetime_seconds,
    peers,
    redrawn,
    standing,
    yields_tie,
)

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def record(priority: int, seen: datetime = NOW, lifetime: int = 30) -> dict[str, Any]:
    """A peer's record as kopf's keep-alive writes it (kopf._core.engines.peering.Peer.as_dict)."""
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


# The default priority: earlier-started operators rank higher, and two never tie in practice.


def test_an_earlier_started_operator_ranks_higher_whatever_the_random_tails():
    earlier = default_priority(started=1_700_000_000.000, tail=0)
    later = default_priority(started=1_700_000_000.001, tail=TAIL - 1)
    assert earlier > later
    assert default_priority(started=1_700_000_000.001, tail=0) > later  # the tail orders the same millisecond


def test_operators_started_in_the_same_millisecond_get_different_priorities():
    drawn = {default_priority(started=1_700_000_000.0) for _ in range(50)}
    assert len(drawn) > 40  # 50 draws out of TAIL values: a repeat or two at most


def test_default_priorities_are_negative_so_an_explicit_one_outranks_them_and_they_fit_a_json_number():
    value = default_priority()
    assert value < 0
    assert abs(value) < 2**53  # exact as a float too (kubectl, JSON tools)


def test_the_peering_lifetime_is_30s_unless_the_environment_says_otherwise():
    assert lifetime_seconds({}) == 30
    assert lifetime_seconds({peering.LIFETIME_ENV: "3"}) == 3
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError, match="EAGLE3_PEERING_LIFETIME_SECONDS"):
            lifetime_seconds({peering.LIFETIME_ENV: bad})


# The "am I active" rule.


def test_a_live_peer_of_a_higher_priority_keeps_this_operator_standing_by():
    found = peers({"a": record(10), "me": record(5)}, NOW)
    result = standing(found, "me", 5, NOW + timedelta(seconds=1))
    assert not result.active and result.above == ("a",)
    assert str(result) == "standby behind a"


def test_a_peer_whose_keep_alive_expired_no_longer_counts():
    found = peers({"a": record(10, seen=NOW, lifetime=30)}, NOW)
    assert not standing(found, "me", 5, NOW + timedelta(seconds=29)).active
    assert standing(found, "me", 5, NOW + timedelta(seconds=30)).active


def test_lower_peers_and_the_operators_own_record_leave_it_active():
    found = peers({"b": record(1), "me": record(99)}, NOW)
    assert standing(found, "me", 5, NOW).active  # its own (older, higher) record is no peer


def test_a_peer_of_the_same_priority_pauses_both_and_exactly_one_of_them_re_draws():
    found = peers({"pod-a/1": record(7), "pod-b/1": record(7)}, NOW)
    a = standing(found, "pod-a/1", 7, NOW)
    b = standing(found, "pod-b/1", 7, NOW)
    assert not a.active and a.tied == ("pod-b/1",)
    assert not b.active and b.tied == ("pod-a/1",)
    assert [yields_tie("pod-a/1", a.tied), yields_tie("pod-b/1", b.tied)] == [False, True]
    assert not yields_tie("pod-a/1", ())


def test_a_re_drawn_priority_is_lower_by_at_most_the_tail():
    rng = random.Random(1)
    assert all(100 - TAIL <= redrawn(100, rng) < 100 for _ in range(100))


def test_records_kopf_leaves_incomplete_are_read_with_kopfs_defaults():
    found = {p.identity: p for p in peers({"old": {"priority": 3}, "odd": "x", "naive": record(1)}, NOW)}
    assert set(found) == {"old", "naive"}
    assert found["old"].lifetime == timedelta(seconds=60) and found["old"].alive(NOW)
    naive = peers({"n": {"priority": 1, "lastseen": "2025-01-01T12:00:00"}}, NOW)[0]
    assert naive.lastseen == NOW  # no zone: UTC, as kopf writes


CASES = [
    ({"a": record(10)}, 5),  # a higher live peer
    ({"a": record(10, seen=NOW - timedelta(seconds=31))}, 5),  # a higher dead peer
    ({"a": record(5)}, 5),  # the same priority
    ({"a": record(1), "b": record(2)}, 5),  # only lower peers
    ({"me": record(100)}, 5),  # only itself
    ({}, 5),  # nobody
]


@pytest.mark.parametrize(("status", "priority"), CASES)
async def test_the_rule_is_kopfs_own(status, priority):
    """kopf's peering processor, fed the same record, pauses exactly when the rule says standby."""
    settings = kopf.OperatorSettings()
    settings.peering.name, settings.peering.priority = PEERING_NAME, priority
    paused = Toggle(False)
    now = datetime.now(UTC)
    status = {
        k: v | {"lastseen": (now - (NOW - datetime.fromisoformat(v["lastseen"]))).isoformat()}
        for k, v in status.items()
    }  # fmt: skip  (the same ages, from now: kopf reads the clock)
    body = {"metadata": {"name": PEERING_NAME}, "status": status}
    pressure = asyncio.Event()
    pressure.set()  # kopf sleeps until a peer expires unless woken: no sleep, no keep-alive call
    resource = Resource("kopf.dev", "v1", "kopfpeerings", namespaced=True)
    await process_peering_event(
        raw_event={"type": "MODIFIED", "object": body},
        namespace="ns",
        resource=resource,
        identity="me",
        settings=settings,
        autoclean=False,
        stream_pressure=pressure,
        conflicts_found=paused,
    )
    ours = standing(peers(status, now), "me", priority, datetime.now(UTC))
    assert paused.is_on() == (not ours.active), ours


# The gate: the peering object read through the API client.


class FakeKube:
    """The operator's API client, as far as the gate uses it: peering objects by namespace."""

    def __init__(self, objects: dict[str | None, dict[str, Any]]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str | None, dict[str, Any] | None]] = []
        self.fail: ApiError | None = None

    async def peering(
        self, verb: str, namespace: str | None, name: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        assert name == PEERING_NAME
        self.calls.append((verb, namespace, body))
        if self.fail is not None:
            raise self.fail
        if verb == "get":
            return self.objects.get(namespace)
        if verb == "create":
            if namespace in self.objects:
                return None
            self.objects[namespace] = dict(body or {})
            return self.objects[namespace]
        status = self.objects[namespace].setdefault("status", {})
        status.update((body or {}).get("status", {}))
        return self.objects[namespace]


def gate(
    kube: FakeKube, me: str, priority: int, namespaces: tuple[str, ...] = ("ns",), holds: bool = True
) -> Peering:
    """The gate, holding its Lease unless `holds` is False (the Lease's rounds: tests/unit/test_lease.py)."""
    settings = kopf.OperatorSettings()
    settings.peering.name = PEERING_NAME
    settings.peering.priority, settings.peering.lifetime = priority, 30
    lease = Lease(kube, namespaces[0] if namespaces else "default", me)  # type: ignore[arg-type]
    lease.valid_until = math.inf if holds else None
    return Peering(kube, settings, me, namespaces, lease)  # type: ignore[arg-type]


def live(priority: int) -> dict[str, Any]:
    return record(priority, seen=datetime.now(UTC))


async def kopf_decides(g: Peering, **paused: bool) -> dict[str, Toggle]:
    """kopf's own pause state for the gate to follow: a ToggleSet as kopf makes it (`any`), with a toggle per
    peering object named as kopf names them (`eagle3-operator@<namespace>`), on where kopf pauses."""
    toggles = ToggleSet(any)
    await toggles.make_toggle(False, name="peering CRD is missing")
    g.follow(toggles)
    return {ns: await toggles.make_toggle(on, name=f"{PEERING_NAME}@{ns}") for ns, on in paused.items()}


async def test_the_gate_creates_the_missing_peering_objects_only():
    kube = FakeKube({"a": {"metadata": {"name": PEERING_NAME}}})
    await gate(kube, "me", 1, ("a", "b")).ensure()
    created = [(ns, body) for verb, ns, body in kube.calls if verb == "create"]
    assert [ns for ns, _ in created] == ["a", "b"]
    assert kube.objects["b"] == {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": PEERING_NAME, "namespace": "b"},
    }
    cluster = FakeKube({})
    await gate(cluster, "me", 1, ()).ensure()
    assert cluster.objects[None]["kind"] == "ClusterKopfPeering"


async def test_the_gate_is_a_standby_until_kopf_has_decided_for_every_peering_object():
    """Issue 41: two operators that read the peering object before either keep-alive both took themselves for
    active. Before kopf has made its decision for each peering object, nothing acts, whatever the object
    says (here: nobody else in it), and no request is made."""
    kube = FakeKube({"a": {"status": {}}, "b": {"status": {}}})
    g = gate(kube, "me", 5, ("a", "b"))
    assert not await g.active() and g.probe()["role"] == "starting"  # kopf's tasks not even started
    await kopf_decides(g, a=False)  # kopf has decided for one of the two objects only
    assert not await g.active() and g.probe()["role"] == "starting"
    assert not kube.calls


async def test_the_gate_follows_kopfs_pause_at_once_both_ways():
    kube = FakeKube({"a": {"status": {"other": live(9)}}, "b": {"status": {}}})
    g = gate(kube, "me", 5, ("a", "b"))
    toggles = await kopf_decides(g, a=True, b=False)
    assert not await g.active()
    lease = {"name": f"Lease a/{LEASE_NAME}", "holder": None}
    assert g.probe() == {"identity": "me", "priority": 5, "role": "standby", "lease": lease}
    assert str(g.last) == "standby behind other"  # the reason, from the peering object
    await toggles["a"].turn_to(False)  # kopf resumes the operator: at once, no read needed
    calls = len(kube.calls)
    assert await g.active() and g.probe()["role"] == "active" and len(kube.calls) == calls
    await toggles["b"].turn_to(True)  # and pauses it again after it was active: at once too
    assert g.probe()["role"] == "standby" and not await g.active()


async def test_where_kopf_lets_it_act_it_still_waits_for_the_lease_and_says_so():
    """Issue 41: kopf's decision is eventually consistent; the Lease makes it exclusive."""
    kube = FakeKube({"ns": {"status": {}}})
    g = gate(kube, "me", 5, holds=False)
    await kopf_decides(g, ns=False)
    assert g.wanted() and not await g.active() and g.probe()["role"] == "standby"
    assert str(g.last) == f"standby: waiting for the Lease ns/{LEASE_NAME}"
    g.lease.valid_until = math.inf
    assert await g.active() and g.probe()["role"] == "active"
    g.lease.valid_until = 0.0  # the hold ran out (no renewal within the deadline): at once, not next round
    assert not await g.active()


async def test_kopfs_pause_stands_even_where_the_peering_object_shows_nobody_above():
    """kopf may pause on an event a later read does not show yet (or an earlier one): its word counts."""
    g = gate(FakeKube({"ns": {"status": {"lower": live(1)}}}), "me", 5)
    await kopf_decides(g, ns=True)
    assert not await g.active() and str(g.last) == "standby: paused by kopf's peering"


async def test_without_its_peering_object_the_operator_stands_by_as_kopf_does():
    g = gate(FakeKube({}), "me", 5)
    await kopf_decides(g, ns=True)  # kopf's peering is mandatory: paused until the object says otherwise
    assert not await g.active() and g.last is not None and g.last.missing


async def test_a_tied_operator_whose_identity_sorts_last_re_draws_publishes_it_and_stands_by():
    kube = FakeKube({"ns": {"status": {"pod-a/1": live(7)}}})
    loser = gate(kube, "pod-b/1", 7)
    await kopf_decides(loser, ns=True)  # kopf pauses every operator of a tied priority
    assert not await loser.active()
    assert loser.priority < 7 and loser.settings.peering.priority == loser.priority  # kopf's keep-alives too
    patches = [body for verb, _, body in kube.calls if verb == "patch"]
    assert patches and patches[0]["status"]["pod-b/1"]["priority"] == loser.priority


async def test_the_operator_whose_identity_sorts_first_keeps_its_priority_on_a_tie():
    kube = FakeKube({"ns": {"status": {"pod-b/1": live(7)}}})
    keeper = gate(kube, "pod-a/1", 7)
    await kopf_decides(keeper, ns=True)
    assert not await keeper.active()  # paused until the peer's re-draw arrives
    assert keeper.priority == 7 and not [c for c in kube.calls if c[0] == "patch"]


async def test_when_the_server_does_not_answer_kopfs_decision_still_holds():
    kube = FakeKube({"ns": {"status": {}}})
    g = gate(kube, "me", 5)
    toggles = await kopf_decides(g, ns=False)
    kube.fail = ApiError(503, "get", "kopfpeerings.kopf.dev ns/eagle3-operator", "unavailable")
    assert await g.active()  # kopf's decision needs no read
    await toggles["ns"].turn_to(True)
    assert not await g.active()  # paused: the reason cannot be read, the pause stands


async def test_the_background_tasks_act_without_peering_and_follow_kopf_with_it():
    assert await peering.acting(None)
    g = gate(FakeKube({"ns": {"status": {"boss": live(9)}}}), "me", 5)
    toggles = await kopf_decides(g, ns=True)
    assert not await peering.acting(g)
    await toggles["ns"].turn_to(False)
    assert await peering.acting(g)


def test_the_rbac_rules_let_the_operator_peer_and_hold_its_lease():
    def verbs(group: str, resource: str) -> set[str]:
        return {
            verb
            for rule in rbac.RULES
            if group in rule["apiGroups"] and resource in rule["resources"]
            for verb in rule["verbs"]
        }

    for plural in ("kopfpeerings", "clusterkopfpeerings"):  # kopf watches and patches, the operator creates
        assert {"get", "list", "watch", "create", "patch"} <= verbs("kopf.dev", plural)
    assert verbs("coordination.k8s.io", "leases") == {"get", "create", "update"}  # no list, watch or delete


# What `eagle3 status` says of a run no operator has begun: whether one runs (peering.presence).

NS = f"KopfPeering team-a/{PEERING_NAME}"
CLUSTER = f"ClusterKopfPeering {PEERING_NAME}"


def test_a_live_peer_is_an_operator_alive_the_highest_priority_first():
    body = {"status": {"pod-a/1": record(5, NOW - timedelta(seconds=12)), "pod-b/1": record(9, NOW)}}
    text = peering.presence([peering.PeeringRead(NS), peering.PeeringRead(CLUSTER, body)], NOW)
    assert text == "operator pod-b/1 alive (last seen 0 s ago), pod-a/1 standing by"
    one = {"status": {"pod-a/1": record(5, NOW - timedelta(seconds=12))}}
    assert (
        peering.presence([peering.PeeringRead(NS, one)], NOW) == "operator pod-a/1 alive (last seen 12 s ago)"
    )


def test_a_peering_object_with_no_live_peer_is_no_operator_running():
    dead = {"status": {"pod-a/1": record(5, NOW - timedelta(minutes=5), lifetime=30)}}
    text = peering.presence([peering.PeeringRead(NS, dead), peering.PeeringRead(CLUSTER)], NOW)
    assert text == (
        f"no operator is running (peering '{PEERING_NAME}' has no live peer; pod-a/1 was last seen 5 min "
        "ago): install the chart or run `eagle3 operator`"
    )
    empty = peering.presence([peering.PeeringRead(NS), peering.PeeringRead(CLUSTER, {})], NOW)
    assert empty.startswith(f"no operator is running (peering '{PEERING_NAME}' has no live peer): install")


def test_no_peering_object_that_could_be_read_is_unknown_not_an_error():
    text = peering.presence([peering.PeeringRead(NS, error="HTTP 403"), peering.PeeringRead(CLUSTER)], NOW)
    assert text == f"whether an operator is running is unknown ({NS}: HTTP 403; no {CLUSTER})"
