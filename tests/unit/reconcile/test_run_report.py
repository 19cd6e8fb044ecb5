"""run_report: the figures the metrics read from a reconcile (plan, status, Jobs), as plain data."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.status import Eagle3RunStatus, RunPhase, StagePhase
from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_contract.policy import EXPECTED_SECONDS
from eagle3_contract.results import PrepareResult
from eagle3_contract.stages import Stage
from eagle3_operator.reconcile.observe import JobView, Termination
from eagle3_operator.reconcile.run_report import (
    ServingDraft,
    failure_reason,
    rolled_out_before,
    run_report,
    running_stages,
    serving_draft,
    stage_results,
    unix_time,
)
from tests.unit.reconcile.planner_world import RUN, World, tiny, ts


def status_of(document: dict[str, Any]) -> Eagle3RunStatus:
    """A status as the API server stores it, read as the operator reads it."""
    return Eagle3RunStatus.model_validate(document)


def test_times() -> None:
    assert unix_time("2025-01-01T00:00:10Z") == 1735689610.0
    assert [unix_time(v) for v in (None, "", "yesterday", 5)] == [None, None, None, None]


def test_failure_reason_prefers_out_of_memory_then_the_deadline() -> None:
    def job(**fields: Any) -> JobView:
        return JobView(name="j", stage="train", hash="h", attempt=0, phase=StagePhase.FAILED, **fields)

    assert failure_reason(job(termination=Termination("OOMKilled", 137, None))) == "OutOfMemory"
    assert failure_reason(job(termination=Termination("Error", OOM_EXIT_CODE, None))) == "OutOfMemory"
    deadline = job(failure_reason="DeadlineExceeded", termination=Termination("Error", 137, None))
    assert failure_reason(deadline) == "DeadlineExceeded"
    policy = (
        f"Container train for pod ns/p failed with exit code {OOM_EXIT_CODE} matching FailJob rule at index 1"
    )
    assert failure_reason(job(failure_reason="PodFailurePolicy", failure_message=policy)) == "OutOfMemory"
    other = policy.replace(f"code {OOM_EXIT_CODE}", f"code {OOM_EXIT_CODE}0")
    assert failure_reason(job(failure_reason="PodFailurePolicy", failure_message=other)) == "Error"
    assert failure_reason(job(failure_reason="BackoffLimitExceeded")) == "Error"


def test_only_succeeded_stages_have_results() -> None:
    status = {
        "stages": {
            "prepare": {"phase": "Succeeded", "result": {"tokens": 3}},
            "extract": {"phase": "Failed", "result": {"error": "x"}},
            "train": {"phase": "Running"},
            "vocab": {"phase": "Succeeded"},
            "serve": {"phase": "Succeeded", "result": {"x": 1}},  # not a stage of this version
        }
    }
    assert stage_results(status_of(status)) == {Stage.PREPARE: PrepareResult(tokens=3)}
    assert stage_results(Eagle3RunStatus()) == {}


def test_results_are_typed_and_a_malformed_one_keeps_its_good_fields() -> None:
    status = {"stages": {"prepare": {"phase": "Succeeded", "result": {"tokens": "3", "samples": 2}}}}
    [(stage, result)] = stage_results(status_of(status)).items()
    assert stage == Stage.PREPARE and result.document() == {"samples": 2}
    assert result.tokens_processed is None  # the tokens each stage processed: tests/contract/test_results.py


def test_running_stages_have_a_start_and_an_expected_duration() -> None:
    status = {
        "stages": {
            "prepare": {"phase": "Succeeded", "startTime": ts(0)},
            "extract": {"phase": "Running", "startTime": ts(60)},
            "train": {"phase": "Running"},  # waiting for its result or not started: no start time
        }
    }
    typed = status_of(status)
    assert running_stages(typed, {}) == {"extract": (unix_time(ts(60)), EXPECTED_SECONDS["extract"])}
    assert running_stages(typed, {"extract": 600}) == {"extract": (unix_time(ts(60)), 600)}
    assert set(EXPECTED_SECONDS) == {s.value for s in Stage}


def test_the_serving_draft_takes_the_checkpoint_sha_only_for_the_same_directory() -> None:
    serving = {"deployment": "d", "service": "d", "url": "http://d:8000/v1"}
    drafted = {"serving": serving | {"draft": "export/abc"}}
    assert serving_draft(Eagle3RunStatus()) is None
    assert serving_draft(status_of({"serving": serving})) is None
    same = status_of(drafted | {"checkpoint": {"path": "export/abc", "sha256": "ff"}})
    assert serving_draft(same) == ServingDraft("export/abc", "ff")
    # a new export whose gate failed: the Deployment still serves the previous draft, whose sha is unknown
    newer = status_of(drafted | {"checkpoint": {"path": "export/def", "sha256": "ee"}})
    assert serving_draft(newer) == ServingDraft("export/abc", "")


def test_rolled_out_before_reads_the_export_or_the_ready_condition() -> None:
    draft = ServingDraft("export/abc", "ff")
    export = {"phase": "Succeeded", "outputDir": "export/abc", "completionTime": ts(100)}
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Serving",
        "message": "m",
        "lastTransitionTime": ts(200),
    }
    exported = status_of({"stages": {"export": export}, "conditions": [ready]})
    assert rolled_out_before(exported, draft) == unix_time(ts(100))
    other = export | {"outputDir": "export/old"}
    assert rolled_out_before(
        status_of({"stages": {"export": other}, "conditions": [ready]}), draft
    ) == unix_time(ts(200))
    assert rolled_out_before(status_of({"conditions": [ready | {"status": "False"}]}), draft) is None


def test_run_report_of_a_reconcile() -> None:
    world = World(tiny(stages={"extract": {"activeDeadlineSeconds": 900}}))
    observed = world.observed()
    plan = world.step()
    report = run_report(RUN, plan, observed.jobs, 12.5)
    [job] = world.jobs.values()
    assert report.created == ((job["metadata"]["name"], "prepare"),)
    assert (report.namespace, report.run, report.phase, report.now) == (
        RUN.namespace,
        RUN.name,
        RunPhase.RUNNING,
        12.5,
    )
    assert report.model == tiny()["verifier"]["model"] and report.deadlines == {"extract": 900}
    assert report.status is plan.status and report.jobs == ()
    invalid = World({"verifier": {}})
    plan = invalid.step()
    assert run_report(RUN, plan, (), 0).model is None
