"""kopf's pause state found where kopf keeps it (eagle3_operator.kopf_pause), against the pinned kopf."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from eagle3_contract.patch_guard import LibraryChanged
from eagle3_operator import kopf_pause
from eagle3_operator.kopf_pause import KOPF_PIN, PauseState, pause_state
from tests.patch_guards import another_version, check_both_directions


async def test_the_pause_state_is_kopfs_own_toggle_set_among_the_tasks_kopf_spawns():
    tasks = await kopf.spawn_tasks(registry=kopf.OperatorRegistry(), standalone=True, clusterwide=True)
    try:
        toggles = pause_state(tasks)
        assert isinstance(toggles, ToggleSet) and not toggles.is_on()
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_kopf_that_moved_it_is_named_with_the_pin():
    async def idle() -> None:
        await asyncio.sleep(3600)

    task = asyncio.create_task(idle(), name="daemon killer")
    try:
        with pytest.raises(RuntimeError, match=KOPF_PIN.replace(".", r"\.")):
            pause_state([task])
    finally:
        task.cancel()


async def test_no_decision_before_kopf_made_a_toggle_for_every_peering_object():
    toggles = ToggleSet(any)
    state = PauseState(toggles, "eagle3-operator", ["a", "b"])
    assert state.paused() is None
    await toggles.make_toggle(True, name="eagle3-operator@a")
    assert state.paused() is None
    b = await toggles.make_toggle(False, name="eagle3-operator@b")
    assert state.paused() is True
    await b.turn_to(True)
    await toggles.drop_toggles([t for t in toggles if t.name == "eagle3-operator@a"])
    assert state.paused() is None  # kopf stopped watching a's object (its namespace went): undecided again


def test_kopfs_tasks_are_as_the_pause_state_reads_them_and_another_kopf_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert KOPF_PIN == "kopf==1.45.2"
    check_both_directions(monkeypatch, tmp_path, kopf_pause.GUARD)


async def test_another_kopf_is_refused_before_kopf_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    async def spawn_tasks(**options: Any) -> None:
        raise AssertionError("kopf started with a kopf the pause state was not verified against")

    monkeypatch.setattr(kopf, "spawn_tasks", spawn_tasks)
    another_version(monkeypatch, kopf_pause.GUARD)
    with pytest.raises(LibraryChanged, match=r"kopf==1\.45\.2"):
        await kopf_pause.operator({}, lambda toggles: contextlib.nullcontext())
