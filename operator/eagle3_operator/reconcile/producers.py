"""Online extraction: the hidden-state producers (and the Mooncake master) around the train stage.

They exist only while the train stage needs them: created when the walk is about to start the train Job, which
is held back until a producer (and the master) is available; kept while that Job is pending or running (a
producer that crashes is replaced by its Deployment, and the trainer waits for it); deleted, freeing their
GPUs, once the stage finished, failed for good, or is skipped or reused. Each belongs to one train stage hash
(`eagle3.dev/hash`): producers of an older hash are deleted and, once gone, created anew.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import BlockedBy, ProducersPhase, ProducersStatus, StagePhase
from eagle3_contract.stages import Stage, StagePlan
from eagle3_operator.builders import names
from eagle3_operator.builders.mooncake import build_mooncake_master, build_mooncake_service, mooncake_address
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.producers import build_producers, build_producers_service, producers_endpoint
from eagle3_operator.reconcile.actions import Action, object_ref
from eagle3_operator.reconcile.observe import DeploymentView, Observed
from eagle3_operator.reconcile.stage_walk import Progress

LIVE = (StagePhase.PENDING, StagePhase.RUNNING)


@dataclass(frozen=True)
class Component:
    """The producers or the Mooncake master: their Deployment as wanted and as observed. The wanted objects
    are built when first asked for: most reconciles of most runs (offline, or not training) never do."""

    stage: str
    name: str
    build: Callable[[], dict[str, Any]]
    build_service: Callable[[], dict[str, Any]]
    observed: DeploymentView | None

    @functools.cached_property
    def desired(self) -> dict[str, Any]:
        return self.build()

    @functools.cached_property
    def service(self) -> dict[str, Any]:
        return self.build_service()

    def current(self, train_hash: str) -> DeploymentView | None:
        """The observed Deployment if it serves `train_hash`."""
        return self.observed if self.observed is not None and self.observed.hash == train_hash else None


def _mooncake(spec: Eagle3RunSpec) -> bool:
    return spec.extraction.transfer == "mooncake"


def _components(
    ref: RunRef, spec: Eagle3RunSpec, observed: Observed, train_hash: str, configmap: str
) -> list[Component]:
    producers = Component(
        names.PRODUCERS_STAGE,
        names.producers_name(ref.name),
        functools.partial(build_producers, ref, spec, train_hash, configmap),
        functools.partial(build_producers_service, ref),
        observed.workloads.get(names.PRODUCERS_STAGE),
    )
    master = Component(
        names.MOONCAKE_STAGE,
        names.mooncake_name(ref.name),
        functools.partial(build_mooncake_master, ref, spec, train_hash),
        functools.partial(build_mooncake_service, ref),
        observed.workloads.get(names.MOONCAKE_STAGE),
    )
    return [producers, master]


def _stage(body: dict[str, Any]) -> str | None:
    stage = body["metadata"].get("labels", {}).get(names.LABEL_STAGE)
    return str(stage) if stage is not None else None


def _train_create(progress: Progress) -> Action | None:
    """The action creating the train Job in this plan, if the walk started (or retries) it."""
    for action in progress.actions:
        body = action.body
        if action.verb == "create" and body["kind"] == "Job" and _stage(body) == Stage.TRAIN.value:
            return action
    return None


def _trains_now(progress: Progress, observed: Observed, train: StagePlan) -> bool:
    """The train Job of the current hash is being created, or is pending or running (not being deleted)."""
    if progress.blocked_at != Stage.TRAIN.value or progress.failed is not None:
        return False
    if _train_create(progress) is not None:
        return True
    deleted = {a.body["metadata"]["name"] for a in progress.actions if a.verb == "delete"}
    return any(
        j.stage == Stage.TRAIN.value and j.hash == train.hash and j.phase in LIVE and j.name not in deleted
        for j in observed.jobs
    )


def _converge(ref: RunRef, part: Component, observed: Observed, train_hash: str) -> list[Action]:
    """Create a missing Service and Deployment (the Service first, as the rendezvous Service before its
    Job: the endpoint resolves from the pods' start); delete a Deployment of another train hash (created
    anew once gone); scale one whose replicas differ."""
    actions: list[Action] = []
    if ("Service", part.name) not in observed.objects:
        actions.append(Action("create", part.service))
    view = part.observed
    if view is None:
        actions.append(Action("create", part.desired))
    elif view.hash != train_hash:
        actions.append(Action("delete", object_ref("apps/v1", "Deployment", part.name, ref)))
    elif view.replicas != part.desired["spec"]["replicas"]:
        scale = object_ref("apps/v1", "Deployment", part.name, ref)
        actions.append(Action("patch", scale | {"spec": {"replicas": part.desired["spec"]["replicas"]}}))
    return actions


def _teardown(ref: RunRef, part: Component, observed: Observed) -> list[Action]:
    actions = []
    if part.observed is not None:
        actions.append(Action("delete", object_ref("apps/v1", "Deployment", part.name, ref)))
    if ("Service", part.name) in observed.objects:
        actions.append(Action("delete", object_ref("v1", "Service", part.name, ref)))
    return actions


def _why_not(spec: Eagle3RunSpec, train: StagePlan, progress: Progress) -> str:
    """Why the run needs no producers now (the start of the status message of deleted ones)."""
    if spec.extraction.mode != "online":
        return "extraction.mode is offline"
    if train.skipped:
        return f"the train stage is skipped ({train.skipped})"
    phase = progress.stages[Stage.TRAIN.value].phase if Stage.TRAIN.value in progress.stages else None
    if phase == StagePhase.SUCCEEDED:
        return "the train stage succeeded"
    if phase == StagePhase.FAILED:
        return "the train stage failed"
    if progress.suspended:
        return "spec.suspend is true: the train stage does not start"
    if progress.blocked_at == Stage.TRAIN.value:
        return "the train Job has ended"
    return f"the train stage is not running (the run is at stage {progress.blocked_at})"


def _deleted(
    spec: Eagle3RunSpec, train: StagePlan, progress: Progress, previous: ProducersStatus | None, gpus: int
) -> ProducersStatus | None:
    if previous is None:
        return None
    if previous.phase == ProducersPhase.DELETED:
        return previous
    message = f"{_why_not(spec, train, progress)}: the producers are deleted, their {gpus} GPU(s) freed"
    return previous.model_copy(
        update={
            "phase": ProducersPhase.DELETED,
            "replicas": 0,
            "ready_replicas": 0,
            "available_replicas": 0,
            "blocked_by": None,
            "message": message,
        }
    )


def _hold(progress: Progress, waiting: str, blocked: BlockedBy | None) -> None:
    """Take the train Job out of the plan until the producers answer; the stage says what it waits for."""
    create = _train_create(progress)
    assert create is not None
    progress.actions.remove(create)
    stage = progress.stages[Stage.TRAIN.value]
    progress.stages[Stage.TRAIN.value] = stage.model_copy(
        update={
            "job_name": None,
            "attempts": max(stage.attempts - 1, 0),
            "message": f"waiting for {waiting} before the train Job starts",
        }
    )
    progress.stalled = blocked  # the Progressing condition names the producer pod (status.producers too)


def _waiting(spec: Eagle3RunSpec, parts: list[Component], train_hash: str) -> str | None:
    """What the train Job still waits for (None: a producer and, with mooncake, the master are available)."""
    producers, master = parts
    current = producers.current(train_hash)
    available = current.available_replicas if current is not None else 0
    missing = []
    if available < 1:
        missing.append(f"the hidden-state producers (0 of {spec.extraction.servers} available)")
    mooncake = master.current(train_hash)
    if _mooncake(spec) and (mooncake is None or mooncake.available_replicas < 1):
        missing.append("the Mooncake master")
    return " and ".join(missing) or None


def plan_producers(
    ref: RunRef,
    spec: Eagle3RunSpec,
    plans: list[StagePlan],
    progress: Progress,
    observed: Observed,
    configmap: str,
    previous: ProducersStatus | None,
) -> tuple[list[Action], ProducersStatus | None]:
    """The producers' (and master's) actions and status; holds the walk's train Job (removing its create
    from `progress`) while no producer is available."""
    train = next(p for p in plans if p.stage == Stage.TRAIN)
    parts = _components(ref, spec, observed, train.hash, configmap)
    gpus = spec.extraction.servers * spec.verifier.tensor_parallel_size
    online = spec.extraction.mode == "online" and train.skipped is None
    if not (online and _trains_now(progress, observed, train)):
        actions = [a for part in parts for a in _teardown(ref, part, observed)]
        return actions, _deleted(spec, train, progress, previous, gpus)
    producers, master = parts
    actions = _converge(ref, producers, observed, train.hash)
    if _mooncake(spec):
        actions = _converge(ref, master, observed, train.hash) + actions  # the master before its clients
    else:
        actions += _teardown(ref, master, observed)
    blocked = observed.workload_blocked_by.get(names.PRODUCERS_STAGE) or (
        observed.workload_blocked_by.get(names.MOONCAKE_STAGE) if _mooncake(spec) else None
    )
    waiting = _waiting(spec, parts, train.hash)
    if waiting is not None and _train_create(progress) is not None:
        _hold(progress, waiting, blocked)
    current = producers.current(train.hash)
    ready = current.ready_replicas if current is not None else 0
    available = current.available_replicas if current is not None else 0
    if waiting is None:
        message = f"{available} of {spec.extraction.servers} producer(s) available to the train stage"
    else:
        message = f"waiting for {waiting}"
    status = ProducersStatus(
        phase=ProducersPhase.RUNNING if available > 0 else ProducersPhase.PENDING,
        deployment=producers.name,
        endpoint=producers_endpoint(ref),
        mooncake_master=mooncake_address(ref) if _mooncake(spec) else None,
        train_hash=train.hash,
        replicas=spec.extraction.servers,
        ready_replicas=ready,
        available_replicas=available,
        blocked_by=blocked,
        message=message,
    )
    return actions, status
