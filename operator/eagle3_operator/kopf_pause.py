"""kopf's own answer to "is this operator paused", for the operator's parts that are not kopf handlers.

kopf pauses its handlers while a live peer outranks this operator (kopf._core.engines.peering). Its decision
is a ToggleSet that `kopf.spawn_tasks` makes and keeps to itself: kopf 1.45 has no public accessor. The
resync, the live progress reads, the retries and /healthz must follow that decision, not a second reading of
the peering object. Issue 41 found two operators started within 85 ms that both read the object before either
keep-alive was written; both took themselves for active for 30 s while kopf paused one.

`operator` runs kopf as `kopf.operator` does (spawn_tasks, then run_tasks), inside a context that gets the
ToggleSet as soon as the tasks exist: the gate follows it, and adds the Lease's own toggle to it
(eagle3_operator.lease), so that kopf's handlers wait for the Lease too. `pause_state` finds it: it is the
`operator_paused` argument of kopf's "daemon killer" root task, which every kopf operator spawns.

A fenced workaround around kopf==1.45.2 (pyproject.toml): `operator` checks its `GUARD` (that version and
the source of the two kopf functions it reads into, eagle3_contract.patch_guard) before kopf starts, and
`pause_state` still fails loudly, naming the pin, where it finds no toggle set. Remove it when kopf exposes
its pause state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import kopf

from eagle3_contract.patch_guard import PatchGuard, Source

TASK = "daemon killer"  # kopf._core.reactor.running.spawn_tasks: daemons.daemon_killer(operator_paused=...)
GUARD = PatchGuard(
    patch=__name__,
    distribution="kopf",
    version="1.45.2",
    sources=(
        Source(
            "kopf._core.reactor.running:spawn_tasks",
            "670392fe4bfcaf986f99a6d5e4ea69d8da145cbe890acf2335a4c81bb0091c18",
            f"it names a root task {TASK!r}, made with aiotasks.guard(coro=daemons.daemon_killer(..., "
            "operator_paused=<the ToggleSet every handler waits on>))",
        ),
        Source(
            "kopf._cogs.aiokits.aiotasks:guard",
            "b9c8df94ef0cabf811dbd81a869b3ea2549ba3157026aaaa7ffd2c8ef3531483",
            "the guarded coroutine is its local `coro`, awaited in its frame",
        ),
    ),
    remove_when="kopf exposes its pause state",
)
KOPF_PIN = f"kopf=={GUARD.version}"


class PauseState:
    """kopf's pause decision, read-only. kopf starts a peered operator paused (its peering is mandatory),
    and decides per peering object as the object's events arrive; before it has made the toggle of every
    peering object named in `scopes`, the decision is not made yet (None)."""

    def __init__(self, toggles: Any, peering_name: str, scopes: Iterable[str | None]) -> None:
        self._toggles = toggles
        self._names = {f"{peering_name}@{scope}" for scope in scopes}

    def paused(self, ignoring: str | None = None) -> bool | None:
        """True: kopf pauses the operator's handlers; False: it runs them; None: not decided yet. With
        `ignoring`, as if the toggle of that name were off (kopf's peering alone, without the Lease's)."""
        names = {toggle.name for toggle in self._toggles}
        if not self._names <= names:
            return None
        return any(toggle.is_on() for toggle in self._toggles if ignoring is None or toggle.name != ignoring)


def pause_state(tasks: Collection[asyncio.Task[Any]]) -> Any:
    """kopf's `operator_paused` ToggleSet among the root tasks `kopf.spawn_tasks` returned."""
    task = next((t for t in tasks if t.get_name() == TASK), None)
    guarded = task.get_coro() if task is not None else None
    frame = getattr(guarded, "cr_frame", None)
    inner = frame.f_locals.get("coro") if frame is not None else None  # aiotasks.guard(coro=...)
    inner_frame = getattr(inner, "cr_frame", None)
    toggles = inner_frame.f_locals.get("operator_paused") if inner_frame is not None else None
    if not (hasattr(toggles, "is_on") and hasattr(toggles, "__iter__")):
        raise RuntimeError(
            f"kopf's pause state was not found among its tasks (the {TASK!r} task's operator_paused): this "
            f"operator is built against {KOPF_PIN}; install that version"
        )
    return toggles


async def operator(
    options: dict[str, Any], follow: Callable[[Any], AbstractAsyncContextManager[None]]
) -> None:
    """`kopf.operator(**options)`, its tasks run inside `follow(ToggleSet)`, entered once they exist (before
    they run) and left once they all ended. Raises LibraryChanged, before kopf starts, where kopf is not the
    one GUARD names."""
    GUARD.check()
    existing = set(asyncio.all_tasks())
    tasks = await kopf.spawn_tasks(**options)
    async with follow(pause_state(tasks)):
        await kopf.run_tasks(tasks, ignored=existing)
