"""What starts a reconcile, and which events are worth one: a run's own, a child's, the resync, live progress.

A run's own event (handlers.run_event) carries the API server's body and reconciles from it. Everything else
reconciles the run from kopf's `eagle3_runs` index, the watch cache, with no read of the server: the executor
reads the run only before it writes a child (executor._confirm), which is where a run deleted while a watch
was away, or a spec newer than the cache's, would do harm. So the operator's requests grow with what it
writes, not with the events it sees (issue 40: a GET per child event and per run per resync round was 143
requests per run at 500 runs, and grew with the number of runs).

Two more guards keep events from multiplying into reconciles:
- an event that brings the planner nothing new is no news (`run_news`, `child_news`): a version already
  handled (a re-list delivers every object again, and so does every watch connect of kmock, the API mock),
  the echo of the operator's own status patch or of its own create;
- requests coalesce per run (`reconcile_indexed`): while one reconcile of the run waits for the run's lock
  and has not read the indexes yet, a new request is covered by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from eagle3_operator.k8s import ApiError
from eagle3_operator.reconcile.executor import forget_run, kopf_error, reconcile, reconcile_locked
from eagle3_operator.reconcile.relist import RUNS_INDEX, list_ghosts
from eagle3_operator.reconcile.state import Key, ReconcileState


def _seen(state: ReconcileState, meta: Mapping[str, Any]) -> bool:
    """Whether this version of the object was handled already (and remember it as handled)."""
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if not uid or not version:
        return False
    if state.versions.get(uid) == version:
        return True
    state.versions[uid] = version
    return False


def run_news(state: ReconcileState, key: Key, event_type: str | None, body: Mapping[str, Any]) -> bool:
    """Whether a run's own event asks for a reconcile: the run was created or listed (the operator's start, a
    re-list), or its spec has a generation this process has not reconciled (an edit). Not a version already
    handled, a run being deleted (its children go with it), nor the echo of a status patch: its generation
    is the one the status this process wrote was planned from."""
    meta = body.get("metadata") or {}
    if _seen(state, meta):
        return False
    if event_type != "MODIFIED":
        return True
    if meta.get("deletionTimestamp"):
        return False
    cached = state.statuses.get(key)
    planned = cached[1].get("observedGeneration") if cached and cached[0] == meta.get("uid") else None
    return planned is None or planned != meta.get("generation")


def child_news(state: ReconcileState, key: Key, event_type: str | None, body: Mapping[str, Any]) -> bool:
    """Whether a child's event can change its run's plan: not a version of it already handled, nor the
    first sight of an object this process created, as it created it (the plan that created it assumed it;
    executor.recently_created). A version is remembered until the object's deletion (or until the re-list's
    sweep finds it deleted)."""
    meta = body.get("metadata") or {}
    if event_type == "DELETED":
        state.versions.pop(meta.get("uid") or "", None)
        return True
    if _seen(state, meta):
        return False
    created = (body.get("kind"), meta.get("name")) in state.pending.get(key, {})
    return not (created and not body.get("status"))


async def reconcile_indexed(key: Key, state: ReconcileState, logger: Any, indices: Mapping[str, Any]) -> None:
    """Reconcile the run the `eagle3_runs` index holds under `key`, from the index's copy.

    A request made while an earlier one waits for the run's lock, before it has read the indexes, returns at
    once: that reconcile reads the indexes after this request's event, so it covers it. A burst of a run's
    child events then costs one reconcile after the one under way, not one per event."""
    if key in state.queued or not _live(state, indices, key):
        return  # covered by a reconcile that has not started; or no run to reconcile (a stale entry)
    state.queued.add(key)
    lock = state.locks.setdefault(key, asyncio.Lock())
    try:
        await lock.acquire()
    finally:
        state.queued.discard(key)  # acquired (it reads the indexes from here on) or cancelled
    try:
        for run in _live(state, indices, key):
            await reconcile_locked(run, state, logger, indices, confirmed=False)
    finally:
        lock.release()


def _live(state: ReconcileState, indices: Mapping[str, Any], key: Key) -> list[dict[str, Any]]:
    """The index's runs under `key`, but stale entries of runs found gone and runs being deleted."""
    return [
        run
        for run in list(indices[RUNS_INDEX].get(key, []))
        if run["metadata"].get("uid") not in state.gone and not run["metadata"].get("deletionTimestamp")
    ]


async def reconcile_current(
    listed: Mapping[str, Any], state: ReconcileState, logger: Any, indices: Mapping[str, Any]
) -> None:
    """Reconcile a run that the re-list found and no index holds (a watch that went silent missed it): the
    listing has its metadata only, so the run is read from the API server first. A 404 forgets it."""
    meta = listed["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
    if uid and uid in state.gone:
        return
    try:
        current = await state.kube.get_run(namespace, name)
    except ApiError as err:
        if not err.not_found:  # NotServed too: a restarted API server's 404 before it loaded the CRD
            raise kopf_error(state, err) from err
        logger.info(
            "run %s/%s is gone (HTTP 404); forgetting it and creating nothing for it", namespace, name
        )
        forget_run(state, namespace, name, uid)
        return
    if uid and current["metadata"].get("uid") != uid:
        state.gone.add(uid)  # deleted and created again under the same name: reconcile the new one
    if not current["metadata"].get("deletionTimestamp"):
        await reconcile(current, state, logger, indices)


async def sweep_ghosts(
    state: ReconcileState, indices: Mapping[str, Any], logger: Any
) -> list[dict[str, Any]]:
    """Re-list what kopf's indexes (`indices`: eagle3_runs and the children's) hold and remember the entries
    of objects deleted unseen as gone (relist.py); a run among them is forgotten. Returns the runs the list
    holds that the index never saw (slim bodies), for the resync to reconcile. A failed list skips this
    sweep (the next resync round tries again): a partial listing would take live objects for deleted."""
    served = {k: v for k, v in indices.items() if state.serves(k)}
    try:
        relisted = await list_ghosts(state.kube, served, state.namespaces)
    except ApiError as err:
        logger.warning("re-listing the runs and their children failed (the next round retries): %s", err)
        return []
    ghosts, held = relisted.ghosts, relisted.held
    gone: set[str] = state.gone
    new = ghosts - gone
    for key in list(indices[RUNS_INDEX]):
        for run in list(indices[RUNS_INDEX].get(key, [])):
            meta = run["metadata"]
            if meta.get("uid") in new:
                logger.info("run %s/%s was deleted unseen; forgetting it", meta["namespace"], meta["name"])
                forget_run(state, meta["namespace"], meta["name"], meta["uid"])
    if new:
        logger.warning(
            "%d objects were deleted while a watch was away (kopf's indexes still held them); ignoring them",
            len(new),
        )
    back = gone & relisted.listed  # taken for deleted (a 404 of a run's own call), yet listed: it is there
    if back:
        logger.warning(
            "%d objects taken for deleted are listed by the API server; reconciling them again", len(back)
        )
    gone.intersection_update(held)  # uids no index holds any more need no remembering
    gone.difference_update(back)
    gone.update(ghosts)
    for uid in ghosts:
        state.versions.pop(uid, None)
    return relisted.unseen_runs
