"""A running stage's live progress in status, the Progress/ETA columns, the Events and the expected time."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.status import Eagle3RunStatus, StageProgress
from eagle3_contract.stage_metrics import ENV_METRICS_PORT, METRICS_PORT
from eagle3_contract.stages import Stage
from eagle3_operator.builders import names
from eagle3_operator.reconcile.news import EPOCH_COMPLETED, STAGE_SUCCEEDED, progress_news
from eagle3_operator.reconcile.observe import observe_job
from eagle3_operator.reconcile.run_report import running_stages, unix_time
from eagle3_operator.reconcile.stage_walk import finished_progress
from tests.unit.reconcile.planner_world import RUN, World, tiny, ts


def status_of(document: dict[str, Any]) -> Eagle3RunStatus:
    """A status as the API server stores it, read as the operator reads it."""
    return Eagle3RunStatus.model_validate(document)


def train_progress(epochs_done: int, step: int, eta: float | None = 600.0, **extra: Any) -> StageProgress:
    return StageProgress(
        unit="steps", done=step, total=100, rate=0.5, eta_seconds=eta, updated=ts(30),
        epochs_done=epochs_done, epochs=10, step=step, val_loss=1.5 - 0.1 * epochs_done,
        estimated_acceptance_length=2.0, **extra,
    )  # fmt: skip


def running_prepare(world: World) -> str:
    world.step()
    job = world.start("prepare")
    return str(observe_job(job, list(world.pods.values())).progress_key)


def test_a_running_stage_shows_its_live_progress_and_the_columns_say_how_far_it_is() -> None:
    world = World(tiny())
    key = running_prepare(world)
    world.progress[key] = StageProgress(unit="rows", done=120, total=480, rate=4.0, eta_seconds=90.0)
    plan = world.step()
    prepare = plan.status.document()["stages"]["prepare"]
    assert prepare["progress"] == {"unit": "rows", "done": 120, "total": 480, "rate": 4.0, "etaSeconds": 90.0}
    assert (plan.status.document()["progress"], plan.status.document()["eta"]) == (
        "prepare 120/480 rows",
        "1m",
    )
    assert plan.actions == ()


def test_without_live_figures_the_stage_keeps_those_last_written_and_a_pending_one_says_so() -> None:
    world = World(tiny())
    world.step()
    assert (world.plan().status.document()["progress"], world.plan().status.document().get("eta")) == (
        "prepare pending",
        None,
    )
    key = running_prepare(world)
    world.progress[key] = StageProgress(unit="rows", done=120, total=480)
    world.step()
    world.progress.clear()  # the pod did not answer this round
    plan = world.step()
    assert plan.status.document()["stages"]["prepare"]["progress"]["done"] == 120
    assert plan.status.document()["progress"] == "prepare 120/480 rows"


def test_a_finished_stage_keeps_its_last_figures_as_complete() -> None:
    world = World(tiny())
    key = running_prepare(world)
    world.progress[key] = StageProgress(unit="rows", done=470, total=480, rate=4.0, eta_seconds=3.0)
    world.step()
    world.progress.clear()
    world.succeed("prepare", {"samples": 480})
    plan = world.step()
    assert plan.status.document()["stages"]["prepare"]["progress"] == {
        "unit": "rows",
        "done": 480,
        "total": 480,
    }
    assert plan.status.document()["progress"] == "extract pending"


def test_finished_progress_completes_the_epochs_and_drops_the_rate() -> None:
    done = finished_progress(train_progress(9, 90))
    assert done is not None
    assert (done.done, done.epochs_done, done.rate, done.eta_seconds) == (100, 10, None, None)
    assert finished_progress(None) is None
    assert finished_progress(StageProgress(unit="rows", done=7)).done == 7  # total unknown: what it did


def test_the_eta_column_is_for_people_and_an_unknown_eta_leaves_it_empty() -> None:
    world = World(tiny())
    key = running_prepare(world)
    world.progress[key] = StageProgress(
        unit="rows", done=1, total=10**6, rate=0.1, eta_seconds=3 * 3600 + 1200
    )
    assert world.plan().status.document()["eta"] == "3h20m"
    world.progress[key] = StageProgress(unit="rows", done=1)
    plan = world.plan()
    assert "eta" not in plan.status.document() and plan.status.document()["progress"] == "prepare 1 rows"


def test_an_epoch_completed_between_two_readings_is_one_event_and_a_finished_stage_another() -> None:
    before = {
        "stages": {
            "train": {
                "phase": "Running",
                "hash": "h",
                "progress": {"unit": "steps", "epochsDone": 5, "epochs": 10},
            }
        }
    }
    after = train_progress(6, 60, train_loss=1.3).model_dump(mode="json", by_alias=True, exclude_none=True)
    now = {"stages": {"train": {"phase": "Running", "hash": "h", "progress": after}}}
    [(reason, message)] = progress_news(status_of(before), status_of(now), {})
    assert reason == EPOCH_COMPLETED
    assert (
        message
        == "train epoch 6/10 completed: val loss 0.9, train loss 1.3, est. acceptance length 2, step 60"
    )
    skipped = {"stages": {"train": {"phase": "Running", "hash": "h", "progress": {**after, "epochsDone": 8}}}}
    assert progress_news(status_of(before), status_of(skipped), {})[0][1].startswith(
        "train epoch 6-8/10 completed"
    )
    assert progress_news(status_of(now), status_of(now), {}) == []  # nothing moved
    ended = {"stages": {"train": {"phase": "Succeeded", "hash": "h", "attempts": 2, "progress": after}}}
    [(reason, message)] = progress_news(status_of(now), status_of(ended), {"train": 7384.0})
    assert reason == STAGE_SUCCEEDED
    assert message.startswith("stage train succeeded in 2h03m (attempt 2): val loss 0.9")
    assert progress_news(status_of(ended), status_of(ended), {}) == []
    reused = {"stages": {"vocab": {"phase": "Succeeded", "hash": "v", "attempts": 1}}}
    assert progress_news(Eagle3RunStatus(), status_of(reused), {"vocab": 4.0}) == [
        (STAGE_SUCCEEDED, "stage vocab succeeded in 4s")
    ]


def test_evaluates_event_names_each_epochs_acceptance_beside_its_loss_and_the_one_shipped() -> None:
    checkpoints = [
        {"epoch": e, "checkpoint": f"checkpoints/{e}", "valLoss": loss, "acceptanceLength": length}
        for e, loss, length in ((3, 1.9, 2.95), (4, 1.8, 3.1), (5, 1.7, 2.7))
    ]
    choice = {"by": "acceptance", "epoch": 4, "checkpoint": "checkpoints/4", "valLossEpoch": 5}
    result = {"acceptanceLength": 3.1, "checkpointSelection": choice | {"checkpoints": checkpoints}}
    done = {"stages": {"evaluate": {"phase": "Succeeded", "hash": "e", "attempts": 1, "result": result}}}
    [(reason, message)] = progress_news(Eagle3RunStatus(), status_of(done), {"evaluate": 30.0})
    assert reason == STAGE_SUCCEEDED
    assert message == (
        "stage evaluate succeeded in 30s: acceptance length by epoch: epoch 3: 2.950 (val loss 1.900), "
        "epoch 4: 3.100 (val loss 1.800), epoch 5: 2.700 (val loss 1.700); epoch 4 ships; the lowest "
        "validation loss was epoch 5's"
    )
    plain = {"stages": {"evaluate": {"phase": "Succeeded", "hash": "e", "result": {"acceptanceLength": 3.1}}}}
    assert progress_news(Eagle3RunStatus(), status_of(plain), {})[0][1] == "stage evaluate succeeded"


def test_the_expected_time_of_a_running_stage_is_its_live_one_where_it_reports_an_eta() -> None:
    started = ts(0)
    live = {
        "phase": "Running",
        "startTime": started,
        "progress": {"unit": "steps", "updated": ts(600), "etaSeconds": 1800.0},
    }
    plain = {"phase": "Running", "startTime": started}
    out = running_stages(status_of({"stages": {"train": live, "extract": plain}}), {})
    assert out["train"] == (unix_time(started), 2400)
    assert out["extract"][1] > 0 and out["extract"][1] != 2400  # the stage's default


def test_the_stage_pods_pod_monitor_comes_with_the_first_job_and_lives_as_long_as_the_run() -> None:
    for served in (False, True):
        world = World(tiny(), pod_monitors_served=served)
        plan = world.step()
        monitors = [a.body for a in plan.actions if a.body["kind"] == "PodMonitor"]
        assert len(monitors) == int(served)
        world.run_to("none")
        assert world.step().actions == ()
    [monitor] = monitors
    assert monitor["metadata"]["name"] == names.stage_monitor_name(RUN.name) == "tiny-stages"
    assert monitor["metadata"]["ownerReferences"][0]["uid"] == RUN.uid
    selector = monitor["spec"]["selector"]
    assert selector["matchLabels"] == {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_RUN: "tiny"}
    [stages] = selector["matchExpressions"]
    assert stages["key"] == names.LABEL_STAGE and set(stages["values"]) == {s.value for s in Stage}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    relabeled = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabeled == {
        "run": ["__meta_kubernetes_pod_label_eagle3_dev_run"],
        "namespace": ["__meta_kubernetes_namespace"],
        "stage": ["__meta_kubernetes_pod_label_eagle3_dev_stage"],
    }


def test_every_stage_container_serves_its_progress_on_the_metrics_port() -> None:
    world = World(tiny())
    [job] = [a.body for a in world.step().actions if a.body["kind"] == "Job"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    assert {"name": ENV_METRICS_PORT, "value": str(METRICS_PORT)} in container["env"]
