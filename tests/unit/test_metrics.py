"""OperatorMetrics: the series each reconcile leaves, counted once per transition, forgotten with the run."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_contract.api.status import Eagle3RunStatus, RunPhase, StagePhase
from eagle3_contract.exit_codes import OOM_EXIT_CODE
from eagle3_contract.policy import EXPECTED_SECONDS
from eagle3_contract.results import TrainEpoch
from eagle3_contract.stages import Stage
from eagle3_operator.metrics import STAGE_BUCKETS, OperatorMetrics
from eagle3_operator.reconcile.observe import JobView, Termination
from eagle3_operator.reconcile.run_report import RunReport, run_report, unix_time
from tests.harness.results import fake_result
from tests.unit.reconcile.planner_world import RUN, World, tiny, ts

RUNS = "eagle3_operator_runs"
STAGE = "eagle3_operator_stage_duration_seconds"
ATTEMPTS = "eagle3_operator_stage_attempts_total"
FAILURES = "eagle3_operator_stage_failures_total"
LAST_FAILURE = "eagle3_run_stage_last_failure_timestamp_seconds"
NOW = 1_750_000_000.0

# The fake stage results (tests.harness.results) with the figures these tests read.
EVALUATE = fake_result(Stage.EVALUATE, acceptance_rate=0.55, acceptance_length=2.65, output_tokens=512)
TRAIN = fake_result(
    Stage.TRAIN,
    best_val_loss=4.2,
    epochs=[
        TrainEpoch(epoch=0, train_tokens=4096, val_loss=5.1),
        TrainEpoch(epoch=1, train_tokens=4096, val_loss=4.2),
    ],
)
EXTRACT = fake_result(Stage.EXTRACT, tokens=1536, bytes=3145728)
PREPARE = fake_result(Stage.PREPARE, tokens=1600)
GENERATE = fake_result(Stage.GENERATE, output_tokens=900, tokens=1700)


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def runs_in(metrics: OperatorMetrics, phase: RunPhase, namespace: str = "ns") -> float | None:
    return sample(metrics, RUNS, namespace=namespace, phase=phase.value)


def series(metrics: OperatorMetrics, run: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every sample carrying `run="<run>"`."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in metrics.registry.collect()
        for s in family.samples
        if s.labels.get("run") == run and not s.name.endswith("_created")
    }


def stage(phase: StagePhase, result: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"phase": phase.value, **({"result": result} if result is not None else {}), **fields}


def report(
    phase: RunPhase = RunPhase.RUNNING, run: str = "a", namespace: str = "ns", **fields: Any
) -> RunReport:
    document = fields.pop("status", None) or {"phase": phase.value}  # as the API server stores it
    fields["status"] = Eagle3RunStatus.model_validate(document)
    fields.setdefault("model", "Qwen/Qwen3-8B")
    return RunReport(namespace=namespace, run=run, phase=phase, now=fields.pop("now", NOW), **fields)


def job(name: str, phase: StagePhase, stage_: str = "extract", **fields: Any) -> JobView:
    return JobView(name=name, stage=stage_, hash="h", attempt=0, phase=phase, **fields)


# --- runs by phase ------------------------------------------------------------------------------------


def test_every_phase_of_a_namespace_starts_at_zero() -> None:
    metrics = OperatorMetrics()
    assert metrics.registry.get_sample_value(RUNS, {"namespace": "ns", "phase": "Pending"}) is None
    metrics.observe(report(RunPhase.PENDING))
    assert {p: runs_in(metrics, p) for p in RunPhase} == dict.fromkeys(RunPhase, 0.0) | {RunPhase.PENDING: 1}


def test_a_run_moves_between_phases_and_is_counted_once_per_namespace() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.PENDING))
    metrics.observe(report(RunPhase.PENDING))
    assert runs_in(metrics, RunPhase.PENDING) == 1
    metrics.observe(report(RunPhase.RUNNING))
    metrics.observe(report(RunPhase.RUNNING, run="b"))
    metrics.observe(report(RunPhase.SERVING, namespace="other"))  # same name, another namespace
    assert runs_in(metrics, RunPhase.PENDING) == 0
    assert runs_in(metrics, RunPhase.RUNNING) == 2
    assert runs_in(metrics, RunPhase.SERVING) == 0
    assert runs_in(metrics, RunPhase.SERVING, "other") == 1
    metrics.forget_run("ns", "a")
    metrics.forget_run("ns", "a")  # a second delete event changes nothing
    metrics.forget_run("ns", "never-seen")
    assert runs_in(metrics, RunPhase.RUNNING) == 1
    assert sum(runs_in(metrics, p) or 0 for p in RunPhase) == 1


EVENTS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(list(RunPhase)) | st.none()), max_size=30
)


@settings(max_examples=100, deadline=None)
@given(EVENTS)
def test_the_phase_gauge_counts_the_runs_in_each_phase(events: list[tuple[str, RunPhase | None]]) -> None:
    """Any sequence of reconciles (a phase) and deletes (None): the gauges are the count of runs per phase."""
    metrics = OperatorMetrics()
    model: dict[str, RunPhase] = {}
    for run, phase in events:
        if phase is None:
            metrics.forget_run("ns", run)
            model.pop(run, None)
        else:
            metrics.observe(report(phase, run=run))
            model[run] = phase
        counts = Counter(model.values())
        assert {p: runs_in(metrics, p) or 0 for p in RunPhase} == {p: float(counts[p]) for p in RunPhase}


# --- stage durations, reconciles ----------------------------------------------------------------------


def test_finished_stages_are_observed_by_namespace_and_stage() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(finished=(("prepare", 90.0), ("extract", None))))
    metrics.observe(report(run="b", finished=(("prepare", 4000.0),)))
    labels = {"namespace": "ns", "stage": "prepare"}
    assert sample(metrics, f"{STAGE}_count", **labels) == 2
    assert sample(metrics, f"{STAGE}_sum", **labels) == 4090.0
    assert sample(metrics, f"{STAGE}_bucket", **labels, le="300.0") == 1
    assert sample(metrics, f"{STAGE}_bucket", **labels, le="7200.0") == 2
    assert sample(metrics, f"{STAGE}_count", namespace="ns", stage="extract") is None  # no duration
    assert STAGE_BUCKETS[-1] == float("inf") and list(STAGE_BUCKETS) == sorted(STAGE_BUCKETS)


def test_reconciles_and_latency() -> None:
    metrics = OperatorMetrics()
    metrics.reconciles.labels("ok").inc()
    metrics.reconciles.labels("ok").inc()
    metrics.reconciles.labels("error").inc()
    metrics.latency.observe(0.02)
    assert sample(metrics, "eagle3_operator_reconciles_total", result="ok") == 2
    assert sample(metrics, "eagle3_operator_reconciles_total", result="error") == 1
    assert sample(metrics, "eagle3_operator_reconcile_duration_seconds_count") == 1


def test_registries_are_per_instance() -> None:
    one, two = OperatorMetrics(), OperatorMetrics()
    one.observe(report(RunPhase.FAILED))
    assert runs_in(one, RunPhase.FAILED) == 1 and runs_in(two, RunPhase.FAILED) is None


# --- attempts and failures ----------------------------------------------------------------------------


def attempts(metrics: OperatorMetrics, stage_: str, run: str = "a") -> float | None:
    return sample(metrics, ATTEMPTS, namespace="ns", run=run, stage=stage_)


def failures(metrics: OperatorMetrics, stage_: str, reason: str, run: str = "a") -> float | None:
    return sample(metrics, FAILURES, namespace="ns", run=run, stage=stage_, reason=reason)


def last_failure(metrics: OperatorMetrics, stage_: str, reason: str, run: str = "a") -> float | None:
    return sample(metrics, LAST_FAILURE, namespace="ns", run=run, stage=stage_, reason=reason)


def test_counters_of_a_planned_stage_exist_at_zero_before_its_first_attempt() -> None:
    metrics = OperatorMetrics()
    status = {"stages": {"prepare": stage(StagePhase.PENDING), "generate": stage(StagePhase.SKIPPED)}}
    metrics.observe(report(status=status))
    assert attempts(metrics, "prepare") == 0
    assert {r: failures(metrics, "prepare", r) for r in ("OutOfMemory", "DeadlineExceeded", "Error")} == {
        "OutOfMemory": 0,
        "DeadlineExceeded": 0,
        "Error": 0,
    }
    assert attempts(metrics, "generate") is None  # skipped stages run nothing
    assert [
        r for r in ("OutOfMemory", "DeadlineExceeded", "Error") if last_failure(metrics, "prepare", r)
    ] == []


def test_a_job_is_one_attempt_however_often_it_is_reconciled() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(created=(("a-extract-h", "extract"),)))
    for phase in (StagePhase.PENDING, StagePhase.RUNNING, StagePhase.RUNNING, StagePhase.SUCCEEDED):
        metrics.observe(report(jobs=(job("a-extract-h", phase),)))
    assert attempts(metrics, "extract") == 1
    assert failures(metrics, "extract", "Error") is None  # no status stages here: no zero series either


def test_an_oom_retry_counts_two_attempts_and_one_oom_failure_across_reconciles() -> None:
    metrics = OperatorMetrics()
    oomed = job("a-extract-h", StagePhase.FAILED, termination=Termination("OOMKilled", 137, None))
    first = job("a-extract-h", StagePhase.RUNNING)
    metrics.observe(report(created=(("a-extract-h", "extract"),)))
    metrics.observe(report(jobs=(first,)))
    metrics.observe(report(jobs=(oomed,), created=(("a-extract-h-r1", "extract"),)))
    for _ in range(3):  # the retry's reconciles see the failed Job again
        metrics.observe(report(jobs=(oomed, job("a-extract-h-r1", StagePhase.RUNNING))))
    assert attempts(metrics, "extract") == 2
    assert failures(metrics, "extract", "OutOfMemory") == 1
    assert failures(metrics, "extract", "Error") is None


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"termination": Termination("OOMKilled", 137, None)}, "OutOfMemory"),
        ({"termination": Termination("Error", OOM_EXIT_CODE, "CUDA out of memory")}, "OutOfMemory"),
        (
            {
                "failure_reason": "PodFailurePolicy",
                "failure_message": f"Container extract for pod ns/p failed with exit code {OOM_EXIT_CODE} "
                "matching FailJob rule at index 1",
            },
            "OutOfMemory",
        ),  # the pod is not seen (yet): the Job's condition names the exit code
        (
            {"failure_reason": "DeadlineExceeded", "termination": Termination("Error", 143, None)},
            "DeadlineExceeded",
        ),
        ({"failure_reason": "BackoffLimitExceeded", "termination": Termination("Error", 1, "boom")}, "Error"),
        ({"failure_reason": "PodFailurePolicy", "failure_message": "exit code 1"}, "Error"),
        ({}, "Error"),
    ],
)
def test_failure_reasons(fields: dict[str, Any], reason: str) -> None:
    metrics = OperatorMetrics()
    metrics.observe(report())  # the run is known before its Job fails
    metrics.observe(report(jobs=(job("a-extract-h", StagePhase.FAILED, **fields),)))
    assert failures(metrics, "extract", reason) == 1


def test_each_counted_failure_sets_its_last_failure_time_once() -> None:
    """The failure alerts read this gauge: set to the reconcile's time when a failure is counted, kept while
    later reconciles see the same failed Job, moved on by the next failure of the stage for that reason."""
    metrics = OperatorMetrics()
    metrics.observe(report(status={"stages": {"extract": stage(StagePhase.RUNNING)}}))
    assert last_failure(metrics, "extract", "OutOfMemory") is None  # no failure, no series (not even 0)
    oomed = job("a-extract-h", StagePhase.FAILED, termination=Termination("OOMKilled", 137, None))
    metrics.observe(report(jobs=(oomed,), now=NOW + 10))
    metrics.observe(report(jobs=(oomed, job("a-extract-h-r1", StagePhase.RUNNING)), now=NOW + 20))
    assert last_failure(metrics, "extract", "OutOfMemory") == NOW + 10
    again = job("a-extract-h-r1", StagePhase.FAILED, termination=Termination("OOMKilled", 137, None))
    metrics.observe(report(jobs=(oomed, again), now=NOW + 300))
    metrics.observe(report(jobs=(oomed, again), now=NOW + 400))
    assert last_failure(metrics, "extract", "OutOfMemory") == NOW + 300
    assert failures(metrics, "extract", "OutOfMemory") == 2
    assert last_failure(metrics, "extract", "Error") is None
    timed_out = job("a-train-h", StagePhase.FAILED, "train", failure_reason="DeadlineExceeded")
    metrics.observe(report(jobs=(oomed, again, timed_out), now=NOW + 500))
    assert last_failure(metrics, "train", "DeadlineExceeded") == NOW + 500
    assert last_failure(metrics, "extract", "OutOfMemory") == NOW + 300


def test_a_restarted_operator_counts_nothing_that_happened_before_it_started() -> None:
    """What a run has when the process first reconciles it predates the process: remembered, not counted."""
    oomed = job("a-extract-h", StagePhase.FAILED, termination=Termination("OOMKilled", 137, None))
    running = job("a-extract-h-r1", StagePhase.RUNNING)
    metrics = OperatorMetrics()  # a fresh process
    metrics.observe(report(jobs=(oomed, running)))
    metrics.observe(report(jobs=(oomed, running)))
    assert attempts(metrics, "extract") is None and failures(metrics, "extract", "OutOfMemory") is None
    assert last_failure(metrics, "extract", "OutOfMemory") is None  # an old failure raises no alert
    metrics.observe(report(jobs=(oomed, job("a-extract-h-r1", StagePhase.FAILED)), now=NOW + 60))
    metrics.observe(report(jobs=(oomed, job("a-extract-h-r1", StagePhase.FAILED)), now=NOW + 90))
    assert failures(metrics, "extract", "Error") == 1
    assert last_failure(metrics, "extract", "Error") == NOW + 60  # this one failed after the start
    assert failures(metrics, "extract", "OutOfMemory") is None
    assert last_failure(metrics, "extract", "OutOfMemory") is None
    assert attempts(metrics, "extract") is None  # r1 started before this process did


def reconcile(world: World, metrics: OperatorMetrics, at: float = NOW) -> None:
    """What the handler does: observe, plan, apply, write status, then record the reconcile."""
    observed = world.observed()
    plan = world.step()
    metrics.observe(run_report(world.ref, plan, observed.jobs, at))


def test_the_planner_driven_oom_retry_is_counted_once_per_attempt() -> None:
    world, metrics = World(tiny()), OperatorMetrics()
    world.run_to("extract")
    reconcile(world, metrics)  # the operator's process starts here: prepare's Job predates it
    reconcile(world, metrics)
    world.fail("extract", "PodFailurePolicy", "exit code 86", OOM_EXIT_CODE, "Error", "CUDA out of memory")
    for _ in range(3):
        reconcile(world, metrics)
    world.succeed("extract")
    for _ in range(3):
        reconcile(world, metrics)
    run = {"namespace": RUN.namespace, "run": RUN.name}
    assert sample(metrics, ATTEMPTS, **run, stage="extract") == 1  # the retry; the first predates the start
    assert sample(metrics, ATTEMPTS, **run, stage="vocab") == 1
    assert sample(metrics, ATTEMPTS, **run, stage="prepare") == 0
    assert sample(metrics, FAILURES, **run, stage="extract", reason="OutOfMemory") == 1
    assert sample(metrics, FAILURES, **run, stage="extract", reason="Error") == 0
    assert sample(metrics, LAST_FAILURE, **run, stage="extract", reason="OutOfMemory") == NOW
    assert sample(metrics, LAST_FAILURE, **run, stage="extract", reason="Error") is None
    assert sample(metrics, f"{STAGE}_count", namespace=RUN.namespace, stage="extract") == 1


# --- per-run figures ----------------------------------------------------------------------------------


def results_status() -> dict[str, Any]:
    done = StagePhase.SUCCEEDED
    return {
        "stages": {
            "prepare": stage(done, PREPARE),
            "generate": stage(done, GENERATE),
            "extract": stage(done, EXTRACT),
            "vocab": stage(done, {"coverage": 0.97}),
            "train": stage(done, TRAIN),
            "evaluate": stage(done, EVALUATE),
        }
    }


def test_per_run_figures_come_from_the_stage_results() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(status=results_status()))
    run = {"namespace": "ns", "run": "a"}
    model = run | {"model": "Qwen/Qwen3-8B", "sampling": "greedy"}
    assert sample(metrics, "eagle3_run_acceptance_length", **model) == pytest.approx(2.65)
    assert sample(metrics, "eagle3_run_acceptance_rate", **model) == pytest.approx(0.55)
    assert sample(metrics, "eagle3_run_validation_loss", **run) == pytest.approx(4.2)
    assert sample(metrics, "eagle3_run_hidden_state_bytes", **run) == 3145728
    tokens = {
        s: sample(metrics, "eagle3_run_tokens_processed", **run, stage=s)
        for s in ("prepare", "generate", "extract", "vocab", "train", "evaluate")
    }
    assert tokens == {
        "prepare": 1600,
        "generate": 900,
        "extract": 1536,
        "vocab": None,
        "train": 8192,
        "evaluate": 512,
    }


def test_a_figure_stays_until_a_new_result_replaces_it_and_a_new_model_replaces_its_series() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(status=results_status()))
    rerun = {"stages": {"evaluate": stage(StagePhase.RUNNING)}}  # a spec edit re-runs evaluate
    metrics.observe(report(status=rerun, model="Qwen/Qwen3-14B"))
    old = {"namespace": "ns", "run": "a", "model": "Qwen/Qwen3-8B", "sampling": "greedy"}
    assert sample(metrics, "eagle3_run_acceptance_length", **old) == pytest.approx(2.65)
    again = {"stages": {"evaluate": stage(StagePhase.SUCCEEDED, EVALUATE | {"acceptanceLength": 3.1})}}
    metrics.observe(report(status=again, model="Qwen/Qwen3-14B"))
    assert sample(metrics, "eagle3_run_acceptance_length", **old) is None
    new = old | {"model": "Qwen/Qwen3-14B"}
    assert sample(metrics, "eagle3_run_acceptance_length", **new) == pytest.approx(3.1)


def test_a_failed_evaluation_or_a_text_result_sets_nothing() -> None:
    metrics = OperatorMetrics()
    status = {
        "stages": {
            "evaluate": stage(StagePhase.FAILED, {"error": "vLLM died"}),
            "train": stage(StagePhase.SUCCEEDED, {"message": "not JSON"}),
            "extract": stage(StagePhase.SUCCEEDED, {"bytes": "12", "tokens": True}),
        }
    }
    metrics.observe(report(status=status))
    figures = {name for name, _ in series(metrics, "a") if name.startswith("eagle3_run_")}
    assert figures == {"eagle3_run_phase"}


def phases_of(metrics: OperatorMetrics, run: str = "a") -> dict[str, float | None]:
    return {
        p.value: sample(metrics, "eagle3_run_phase", namespace="ns", run=run, phase=p.value) for p in RunPhase
    }


def test_the_run_phase_gauge_is_one_for_the_current_phase_and_zero_for_the_others() -> None:
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.RUNNING))
    assert phases_of(metrics) == dict.fromkeys((p.value for p in RunPhase), 0.0) | {"Running": 1.0}
    metrics.observe(report(RunPhase.FAILED))
    metrics.observe(report(RunPhase.FAILED))
    assert phases_of(metrics) == dict.fromkeys((p.value for p in RunPhase), 0.0) | {"Failed": 1.0}
    metrics.observe(report(RunPhase.SERVING, run="b"))
    assert phases_of(metrics, "b")["Serving"] == 1 and phases_of(metrics)["Serving"] == 0
    metrics.forget_run("ns", "a")
    assert set(phases_of(metrics).values()) == {None} and phases_of(metrics, "b")["Serving"] == 1


SAMPLED = {
    "temperature": 0.7, "topP": 0.95, "prompts": 8, "acceptanceLength": 1.9, "acceptanceRate": 0.3,
    "acceptanceByPosition": [0.6, 0.3],
}  # fmt: skip


def evaluated(**fields: Any) -> dict[str, Any]:
    return {"stages": {"evaluate": stage(StagePhase.SUCCEEDED, EVALUATE | fields)}}


def figures(metrics: OperatorMetrics) -> dict[tuple[str, ...], float | None]:
    """The evaluated series of run a, by (metric, sampling[, position])."""
    out: dict[tuple[str, ...], float | None] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.labels.get("run") == "a" and s.name.startswith(
                ("eagle3_run_acceptance", "eagle3_run_speedup")
            ):
                key = tuple(s.labels[k] for k in ("sampling", "position") if k in s.labels)
                out[(s.name, *key)] = s.value
    return out


def test_the_evaluated_figures_by_sampling_and_position_and_the_speedup() -> None:
    metrics = OperatorMetrics()
    evaluate = {"acceptanceByPosition": [0.9, 0.5, 0.25], "speedup": 1.8, "sampled": SAMPLED}
    at = {"numSpeculativeTokens": 3, "speedupConcurrency": 4}
    metrics.observe(report(status=evaluated(**evaluate, **at)))
    length, rate = "eagle3_run_acceptance_length", "eagle3_run_acceptance_rate"
    position = "eagle3_run_acceptance_by_position"
    assert figures(metrics) == pytest.approx({
        (length, "greedy"): 2.65, (rate, "greedy"): 0.55, (length, "sampled"): 1.9, (rate, "sampled"): 0.3,
        (position, "greedy", "0"): 0.9, (position, "greedy", "1"): 0.5, (position, "greedy", "2"): 0.25,
        (position, "sampled", "0"): 0.6, (position, "sampled", "1"): 0.3, ("eagle3_run_speedup",): 1.8,
    })  # fmt: skip
    labels = {"namespace": "ns", "run": "a", "model": "Qwen/Qwen3-8B", "sampling": "sampled", "position": "1"}
    assert sample(metrics, position, **labels) == pytest.approx(0.3)
    speedup = {"namespace": "ns", "run": "a", "model": "Qwen/Qwen3-8B", "k": "3", "concurrency": "4"}
    assert sample(metrics, "eagle3_run_speedup", **speedup) == 1.8  # says the k and concurrency it is at


def test_a_new_evaluation_replaces_every_evaluated_figure() -> None:
    """Without a sampled measurement (evaluation.sampling removed) or with fewer draft positions, the old
    figures go: the live acceptance alert must not compare traffic with a stale sampled figure."""
    metrics = OperatorMetrics()
    metrics.observe(report(status=evaluated(speedup=1.8, sampled=SAMPLED)))
    metrics.observe(report(status={"stages": {"evaluate": stage(StagePhase.RUNNING)}}))  # a re-run keeps them
    assert ("eagle3_run_acceptance_length", "sampled") in figures(metrics)
    metrics.observe(report(status=evaluated(acceptanceByPosition=[0.7], speedup=None, sampled=None)))
    assert figures(metrics) == pytest.approx({
        ("eagle3_run_acceptance_length", "greedy"): 2.65, ("eagle3_run_acceptance_rate", "greedy"): 0.55,
        ("eagle3_run_acceptance_by_position", "greedy", "0"): 0.7,
    })  # fmt: skip


def test_started_and_expected_seconds_exist_while_a_stage_runs() -> None:
    metrics = OperatorMetrics()
    labels = {"namespace": "ns", "run": "a", "stage": "train"}
    started = "eagle3_run_stage_started_timestamp_seconds"
    expected = "eagle3_run_stage_expected_seconds"
    metrics.observe(report(status={"stages": {"train": stage(StagePhase.PENDING, jobName="a-train-h")}}))
    assert sample(metrics, started, **labels) is None  # created, not started (queued, pulling)
    running = {"stages": {"train": stage(StagePhase.RUNNING, startTime=ts(60))}}
    metrics.observe(report(status=running))
    assert sample(metrics, started, **labels) == unix_time(ts(60))
    assert sample(metrics, expected, **labels) == EXPECTED_SECONDS["train"]
    metrics.observe(report(status=running, deadlines={"train": 7200}))
    assert sample(metrics, expected, **labels) == 7200
    retried = {"stages": {"train": stage(StagePhase.RUNNING, startTime=ts(900))}}
    metrics.observe(report(status=retried))
    assert sample(metrics, started, **labels) == unix_time(ts(900))
    metrics.observe(report(status={"stages": {"train": stage(StagePhase.SUCCEEDED, TRAIN)}}))
    assert sample(metrics, started, **labels) is None and sample(metrics, expected, **labels) is None


def test_a_pod_that_does_not_run_is_a_series_by_stage_and_reason_while_it_lasts() -> None:
    metrics = OperatorMetrics()
    name, run = "eagle3_run_pod_blocked", {"namespace": "ns", "run": "a"}
    pull = {
        "reason": "ImagePullBackOff",
        "message": "pod a-prepare-x, container prepare: ImagePullBackOff: ...",
    }
    crash = {"reason": "CrashLoopBackOff", "message": "pod a-vllm-y, container vllm: CrashLoopBackOff: ..."}
    blocked = {
        "stages": {"prepare": stage(StagePhase.RUNNING, blockedBy=pull)},
        "serving": {
            "deployment": "a-vllm",
            "service": "a-vllm",
            "url": "http://a-vllm:8000/v1",
            "blockedBy": crash,
        },
    }
    metrics.observe(report(status=blocked))
    assert sample(metrics, name, **run, stage="prepare", reason="ImagePullBackOff") == 1
    assert sample(metrics, name, **run, stage="serve", reason="CrashLoopBackOff") == 1
    unschedulable = {
        "stages": {"prepare": stage(StagePhase.RUNNING, blockedBy=pull | {"reason": "Unschedulable"})}
    }
    metrics.observe(report(status=unschedulable))
    assert sample(metrics, name, **run, stage="prepare", reason="ImagePullBackOff") is None, (
        "one reason at a time"
    )
    assert sample(metrics, name, **run, stage="prepare", reason="Unschedulable") == 1
    assert sample(metrics, name, **run, stage="serve", reason="CrashLoopBackOff") is None
    metrics.observe(report(status={"stages": {"prepare": stage(StagePhase.RUNNING)}}))
    assert not [s for s in series(metrics, "a") if s[0] == name], "gone once the pod runs"


# --- the serving draft --------------------------------------------------------------------------------

SHA = "ab" * 32


def serving_status(draft: str, sha: str | None = SHA, **extra: Any) -> dict[str, Any]:
    checkpoint = {"path": draft} | ({"sha256": sha} if sha else {})
    serving = {"deployment": "a-vllm", "service": "a-vllm", "url": "http://a-vllm", "draft": draft}
    return {"checkpoint": checkpoint, "serving": serving, **extra}


def test_the_serving_draft_info_and_its_rollout_time() -> None:
    metrics = OperatorMetrics()
    draft = "export/0123456789ab"
    metrics.observe(report(status={"checkpoint": {"path": draft, "sha256": SHA}}))
    assert sample(metrics, "eagle3_serving_draft_info", namespace="ns", run="a") is None  # not serving yet
    metrics.observe(report(RunPhase.SERVING, status=serving_status(draft), now=NOW))
    metrics.observe(report(RunPhase.SERVING, status=serving_status(draft), now=NOW + 60))
    info = {"namespace": "ns", "run": "a", "model": "Qwen/Qwen3-8B", "checkpoint": draft, "sha256": SHA}
    assert sample(metrics, "eagle3_serving_draft_info", **info) == 1
    rollout = "eagle3_serving_draft_rollout_timestamp_seconds"
    assert sample(metrics, rollout, namespace="ns", run="a", sha256=SHA) == NOW  # first seen, kept
    pinned = "/mnt/drafts/pinned"
    metrics.observe(report(RunPhase.SERVING, status=serving_status(pinned, sha="cd" * 32), now=NOW + 120))
    assert sample(metrics, "eagle3_serving_draft_info", **info) is None
    new = info | {"checkpoint": pinned, "sha256": "cd" * 32}
    assert sample(metrics, "eagle3_serving_draft_info", **new) == 1
    assert sample(metrics, rollout, namespace="ns", run="a", sha256=SHA) is None
    assert sample(metrics, rollout, namespace="ns", run="a", sha256="cd" * 32) == NOW + 120
    metrics.observe(report(RunPhase.SUCCEEDED, status={"checkpoint": {"path": pinned}}))  # serving disabled
    assert {name for name, _ in series(metrics, "a")} == {"eagle3_run_phase"}


def test_a_draft_already_serving_at_the_start_keeps_its_rollout_time() -> None:
    """A restarted operator must not mark a rollout: the export's completion time stands for it."""
    draft = "export/0123456789ab"
    export = stage(StagePhase.SUCCEEDED, {"sha256": SHA}, outputDir=draft, completionTime=ts(3600))
    metrics = OperatorMetrics()
    metrics.observe(report(RunPhase.SERVING, status=serving_status(draft, stages={"export": export})))
    rollout = "eagle3_serving_draft_rollout_timestamp_seconds"
    assert sample(metrics, rollout, namespace="ns", run="a", sha256=SHA) == unix_time(ts(3600))
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Serving",
        "message": "m",
        "lastTransitionTime": ts(7200),
    }
    pinned = serving_status("/mnt/pinned", sha=None, conditions=[ready])
    other = OperatorMetrics()
    other.observe(report(RunPhase.SERVING, status=pinned))
    assert sample(other, rollout, namespace="ns", run="a", sha256="") == unix_time(ts(7200))
    info = {
        "namespace": "ns",
        "run": "a",
        "model": "Qwen/Qwen3-8B",
        "checkpoint": "/mnt/pinned",
        "sha256": "",
    }
    assert sample(other, "eagle3_serving_draft_info", **info) == 1


# --- forget_run ---------------------------------------------------------------------------------------


def test_forget_run_removes_every_series_of_the_run_and_only_those() -> None:
    metrics = OperatorMetrics()
    draft = "export/0123456789ab"
    status = results_status() | serving_status(draft)
    status["stages"]["export"] = stage(StagePhase.RUNNING, startTime=ts(10))
    for run in ("a", "b"):
        metrics.observe(report(status={"stages": {"extract": stage(StagePhase.PENDING)}}, run=run))
        metrics.observe(
            report(
                RunPhase.SERVING,
                run=run,
                status=status,
                jobs=(job(f"{run}-extract-h", StagePhase.FAILED),),
                created=((f"{run}-export-h", "export"),),
            )
        )
    kinds = {name for name, _ in series(metrics, "a")}
    assert kinds >= {
        ATTEMPTS, FAILURES, LAST_FAILURE, "eagle3_run_stage_started_timestamp_seconds",
        "eagle3_run_stage_expected_seconds",
        "eagle3_run_acceptance_length", "eagle3_run_acceptance_rate", "eagle3_run_validation_loss",
        "eagle3_run_hidden_state_bytes", "eagle3_run_tokens_processed", "eagle3_serving_draft_info",
        "eagle3_serving_draft_rollout_timestamp_seconds", "eagle3_run_phase", "eagle3_run_speedup",
        "eagle3_run_acceptance_by_position",
    }  # fmt: skip
    before_b = series(metrics, "b")
    metrics.forget_run("ns", "a")
    assert series(metrics, "a") == set()
    assert series(metrics, "b") == before_b
    assert runs_in(metrics, RunPhase.SERVING) == 1


def test_a_long_run_name_is_labelled_as_its_pods_are() -> None:
    """`run` is the `eagle3.dev/run` label value, so the operator's and vLLM's series join on it."""
    long = "a-" + "x" * 70
    world, metrics = World(tiny(), ref=RUN.__class__(long, RUN.namespace, RUN.uid)), OperatorMetrics()
    reconcile(world, metrics)
    label = world.jobs[next(iter(world.jobs))]["metadata"]["labels"]["eagle3.dev/run"]
    assert label != long and series(metrics, label) and not series(metrics, long)
    metrics.forget_run(RUN.namespace, long)
    assert series(metrics, label) == set()
