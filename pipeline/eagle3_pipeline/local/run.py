"""The local executor: `eagle3 run FILE` runs an Eagle3Run's planned stages as `eagle3 stage` subprocesses.

Artifacts live under a local directory with the cluster volume's content-hashed layout (`<stage>/<hash>`), so
a second run skips every stage whose output is complete and an edited spec re-runs only what it changes. The
operator's own policy applies (eagle3_contract.policy and .gate): an out-of-memory exit is retried at half
the token budget down to `dataset.maxSequenceLength`, an attempt gets the stage's activeDeadlineSeconds, and
a draft that fails the acceptance gate stops the run before export.

Each stage subprocess serves its progress on a loopback port (`EAGLE3_METRICS_PORT`, see
eagle3_contract.stage_metrics): the run's observers (eagle3_pipeline.local.display) show one live line per
stage from it, print the program's stderr lines, and record the stages for `eagle3 status FILE`
(eagle3_pipeline.local.status).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3_contract.api.manifest import Manifest, ManifestError
from eagle3_contract.api.rules import verifier_config_problems
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.exit_codes import ENV_TERMINATION_LOG
from eagle3_contract.gate import judge_evaluation
from eagle3_contract.mounts import MODEL_CACHE_MOUNT
from eagle3_contract.policy import (
    is_out_of_memory,
    next_token_budget,
    out_of_memory_message,
    out_of_memory_retry_note,
    stage_deadline,
)
from eagle3_contract.reasons import DEADLINE_EXCEEDED
from eagle3_contract.results import EvaluateResult, StageResult, parse_result, stage_error
from eagle3_contract.stage_metrics import ENV_METRICS_HOST, ENV_METRICS_PORT
from eagle3_contract.stages import Stage, StagePlan, plan_stages, stage_argv
from eagle3_pipeline.data.dataset_files import local_fingerprint
from eagle3_pipeline.data.verifier import ConfigUnreadable, local_config
from eagle3_pipeline.local.display import (
    MetricsPoller,
    Observers,
    PlainDisplay,
    RunObserver,
    completed,
    metrics_url,
)
from eagle3_pipeline.local.display import StageOutcome as StageOutcome  # re-exported: tests use it
from eagle3_pipeline.local.stage_process import StageProcess
from eagle3_pipeline.local.status import StatusRecorder, snapshot_name, status_file
from eagle3_pipeline.local.storage_check import storage_problem
from eagle3_pipeline.runtime.context import (
    ENV_MODELS_ROOT,
    RESULT_FILE,
    is_complete,
    map_mounts,
    models_root,
    read_result,
)
from eagle3_pipeline.serving.vllm_server import HOST, free_port
from eagle3_pipeline.stages.train.nodes import local_nodes

logger = logging.getLogger(__name__)
ENV_VLLM = "EAGLE3_VLLM"
# How long a stopped stage gets to stop its own vLLM server (30 s grace of its own) before SIGKILL.
STOP_GRACE_S = 45.0


class LocalRunError(RuntimeError):
    """A stage failed; the message names it and carries the program's last words."""


@dataclass(frozen=True)
class LocalOptions:
    artifacts: Path
    models: Path | None = None
    vllm: str | None = None
    until: str | None = None
    python: str = sys.executable


def default_artifacts(manifest: Manifest) -> Path:
    return Path("eagle3-artifacts") / manifest.name


def stage_env(options: LocalOptions) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_MODELS_ROOT] = str(models_root(str(options.models) if options.models else None).resolve())
    if options.vllm:
        env[ENV_VLLM] = options.vllm
    return env


def prepare_artifacts(manifest: Manifest, artifacts: Path) -> Path:
    """Make the artifacts directory and the manifest's snapshot in it; an unwritable place is named."""
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        return snapshot(manifest, artifacts)
    except OSError as exc:
        where = exc.filename or artifacts
        raise LocalRunError(
            f"cannot write the artifacts directory {artifacts} ({where}: {exc.strerror or exc}); make it "
            "writable, or choose another with --artifacts"
        ) from None


def snapshot(manifest: Manifest, artifacts: Path) -> Path:
    """A copy of the manifest the stages read, so editing the file mid-run cannot mix two specs."""
    runs = artifacts / ".runs"
    runs.mkdir(parents=True, exist_ok=True)
    target = runs / snapshot_name(manifest.name, manifest.path.suffix or ".yaml")
    shutil.copyfile(manifest.path, target)
    return target


def check_verifier_config(manifest: Manifest, models: Path | None) -> None:
    """Refuse (ManifestError) what a local verifier's config.json rules out, before any stage starts.

    Only a verifier on this machine (a path, or under /models) is read, with the json module: a hub id is
    checked by the extract stage, which fails with the same words before loading weights.
    """
    spec = manifest.spec
    model = spec.verifier.model
    if model == MODEL_CACHE_MOUNT or model.startswith(MODEL_CACHE_MOUNT + "/"):
        model = str(models_root(str(models) if models else None)) + model[len(MODEL_CACHE_MOUNT) :]
    try:
        config = local_config(Path(model).expanduser())
    except ConfigUnreadable:
        return  # not local, or unreadable: the stage that loads it says so
    layers = spec.extraction.layers
    problems = verifier_config_problems(
        config, tensor_parallel_size=spec.verifier.tensor_parallel_size, layers=layers
    )
    if problems:
        raise ManifestError(f"{manifest.path}: the verifier at {model} cannot run it: " + "; ".join(problems))


@dataclass
class Attempt:
    """How one attempt of a stage ended: its exit code (None past the deadline), the error its program gave
    in its termination message (None when it gave none), its last stderr line and its metrics' poller."""

    code: int | None
    error: str | None
    last_words: str
    poller: MetricsPoller

    def why(self) -> str:
        """What a failed attempt reports: the program's own error; its last stderr line only when it wrote
        none (a crash), since the progress line a program ends with is not the reason it failed."""
        said = self.error or self.last_words
        return f"exit code {self.code}: {said}" if said else f"exit code {self.code}"


def run_attempt(
    plan: StagePlan, command: list[str], env: dict[str, str], spec: Eagle3RunSpec, observer: RunObserver
) -> Attempt:
    """One attempt of a stage. The program serves its metrics on a free loopback port and writes its
    termination message to a file of the attempt's own, as a Job's container writes /dev/termination-log."""
    with tempfile.TemporaryDirectory(prefix="eagle3-attempt-") as scratch:
        termination = Path(scratch) / "termination-log"
        code, process, poller = _run_process(
            plan, command, env | {ENV_TERMINATION_LOG: str(termination)}, spec, observer
        )
        text = termination.read_text(errors="replace") if termination.is_file() else None
    return Attempt(code, stage_error(text) if code else None, process.last_words(), poller)


def _run_process(
    plan: StagePlan, command: list[str], env: dict[str, str], spec: Eagle3RunSpec, observer: RunObserver
) -> tuple[int | None, StageProcess, MetricsPoller]:
    stage = plan.stage.value
    port = free_port()
    env = env | {ENV_METRICS_PORT: str(port), ENV_METRICS_HOST: HOST}
    process = StageProcess(on_line=lambda line: observer.stage_output(stage, line))
    # its own process group, stopped whole on the deadline and on SIGTERM or Ctrl-C to this process;
    # a multi-node train stage's other nodes are the same command in worker mode beside it
    nodes = spec.training.nodes if plan.stage is Stage.TRAIN else 1
    deadline = stage_deadline(spec, plan.stage)
    with (
        MetricsPoller(metrics_url(HOST, port), lambda p: observer.stage_progress(stage, p)) as poller,
        local_nodes(command, env, nodes) as node_env,
    ):
        code = process.run(command, node_env, deadline, STOP_GRACE_S, f"stage {stage}")
    return code, process, poller


def run_stage_with_retries(
    plan: StagePlan,
    spec_file: Path,
    options: LocalOptions,
    spec: Eagle3RunSpec,
    env: dict[str, str],
    observer: RunObserver | None = None,
) -> StageOutcome:
    """Run one stage to success or failure under the contract's policy: an out-of-memory attempt is retried
    at the next token budget, and an attempt has the stage's deadline, as a Job has in a cluster."""
    observer = observer or PlainDisplay()
    floor = spec.dataset.max_sequence_length
    deadline = stage_deadline(spec, plan.stage)
    budget = plan.token_budget
    outcome = StageOutcome(stage=plan.stage.value, status="failed")
    started = time.monotonic()
    while True:
        outcome.attempts += 1
        argv = stage_argv(plan, str(spec_file), str(options.artifacts), budget)
        command = [options.python, "-m", "eagle3_cli", *argv[1:]]
        logger.debug("running %s", " ".join(command))
        observer.stage_started(plan.stage.value, plan.output_dir, outcome.attempts)
        attempt = run_attempt(plan, command, env, spec, observer)
        returncode = attempt.code
        outcome.progress = attempt.poller.last or outcome.progress
        if returncode is None:
            outcome.seconds = time.monotonic() - started
            outcome.note = (
                f"{DEADLINE_EXCEEDED}: the attempt ran past spec.stages.{plan.stage}.activeDeadlineSeconds "
                f"({deadline} s); raise it, or shrink the dataset"
            )
            return outcome
        outcome.seconds = time.monotonic() - started
        if returncode == 0:
            return _finished(plan, options, outcome)
        retry = next_token_budget(budget, floor) if is_out_of_memory(returncode) else None
        if retry is not None and budget is not None:
            outcome.note = out_of_memory_retry_note(outcome.attempts, budget, retry)
            logger.warning("stage %s ran out of memory; retrying at token budget %d", plan.stage, retry)
            budget = retry
            continue
        if is_out_of_memory(returncode):
            outcome.note = out_of_memory_message(plan.stage.value, budget, floor)
        else:
            outcome.note = attempt.why()
        return outcome


def _finished(plan: StagePlan, options: LocalOptions, outcome: StageOutcome) -> StageOutcome:
    """A stage that exited 0: done, if its output holds the result marker (an exit code is no proof)."""
    output = options.artifacts / plan.output_dir
    if not is_complete(output):
        outcome.note = (
            f"the stage exited 0, but {plan.output_dir}/{RESULT_FILE} is missing: not a complete "
            "stage output; run again (an incomplete directory there is moved aside)"
        )
        return outcome
    outcome.status = "done"
    outcome.result = parse_result(plan.stage, read_result(output))
    outcome.progress = completed(outcome.progress, outcome.result)
    return outcome


def warn_if_dataset_changed(
    plan: StagePlan, result: StageResult | None, spec: Eagle3RunSpec, artifacts: Path, env: dict[str, str]
) -> None:
    """A cached prepare output made from local files changed since is stale: say so, and how to redo it."""
    recorded = getattr(result, "dataset_fingerprint", None)
    if plan.stage is not Stage.PREPARE or not recorded:
        return
    source = spec.dataset.source
    if source == MODEL_CACHE_MOUNT or source.startswith(MODEL_CACHE_MOUNT + "/"):
        source = env[ENV_MODELS_ROOT] + source[len(MODEL_CACHE_MOUNT) :]
    if local_fingerprint(map_mounts(source, artifacts)) != recorded:
        logger.warning(
            "dataset.source %s changed since %s was prepared from it (files added, removed or edited): the "
            "cached output still holds the old rows. Set dataset.revision to a new label to prepare it again",
            spec.dataset.source,
            plan.output_dir,
        )


def run_local(
    manifest: Manifest, options: LocalOptions, observer: RunObserver | None = None
) -> list[StageOutcome]:
    """Run every planned stage in order; raises LocalRunError at the first failure. The stages are shown
    by `observer` (default: plain lines on stderr) and recorded for `eagle3 status FILE`."""
    plans = plan_stages(manifest.spec)
    if options.until is not None and options.until not in {p.stage.value for p in plans}:
        raise LocalRunError(f"--until {options.until}: no such stage ({', '.join(p.stage for p in plans)})")
    spec_file = prepare_artifacts(manifest, options.artifacts)
    recorder = StatusRecorder(status_file(options.artifacts, manifest.name), manifest.name)
    observers = Observers([observer or PlainDisplay(), recorder])
    error: str | None = None
    try:
        return run_plans(manifest, options, plans, spec_file, observers)
    except LocalRunError as exc:
        error = str(exc.args[0])
        raise
    finally:
        observers.close(error)


def run_plans(
    manifest: Manifest, options: LocalOptions, plans: list[StagePlan], spec_file: Path, observer: RunObserver
) -> list[StageOutcome]:
    env = stage_env(options)
    outcomes: list[StageOutcome] = []
    for plan in plans:
        if plan.skipped:
            outcomes.append(StageOutcome(plan.stage.value, "skipped", note=plan.skipped))
        elif plan.reuses_output and is_complete(options.artifacts / plan.output_dir):
            result = parse_result(plan.stage, read_result(options.artifacts / plan.output_dir))
            warn_if_dataset_changed(plan, result, manifest.spec, options.artifacts, env)
            outcomes.append(StageOutcome(plan.stage.value, "cached", result=result, note=plan.output_dir))
        elif (short := storage_problem(plan, outcomes, manifest.spec, options.artifacts)) is not None:
            outcomes.append(StageOutcome(plan.stage.value, "failed", note=short))
        else:
            outcomes.append(run_stage(plan, spec_file, options, manifest.spec, env, observer))
        observer.stage_finished(outcomes[-1])
        if outcomes[-1].status == "failed":
            raise LocalRunError(f"stage {plan.stage} failed: {outcomes[-1].note}", outcomes)
        if plan.stage.value == options.until:
            break
        failed_gate = gate_failure(plan, outcomes[-1].result, manifest.spec.evaluation.min_acceptance_length)
        if failed_gate:
            outcomes[-1].note = "gate failed"
            raise LocalRunError(failed_gate, outcomes)
    return outcomes


def run_stage(
    plan: StagePlan,
    spec_file: Path,
    options: LocalOptions,
    spec: Eagle3RunSpec,
    env: dict[str, str],
    observer: RunObserver | None = None,
) -> StageOutcome:
    """A stage, with its hidden-state producers around it when it trains online."""
    if plan.stage != Stage.TRAIN or spec.extraction.mode != "online":
        return run_stage_with_retries(plan, spec_file, options, spec, env, observer)
    from eagle3_pipeline.local.producers import LocalProducers, ProducerError  # lazily: they import torch

    try:
        with LocalProducers(spec, spec_file, options.artifacts, env) as online_env:
            return run_stage_with_retries(plan, spec_file, options, spec, {**env, **online_env}, observer)
    except ProducerError as exc:
        return StageOutcome(stage=plan.stage.value, status="failed", note=str(exc))


def gate_failure(plan: StagePlan, result: StageResult | None, required: float | None) -> str | None:
    """Why the run stops after evaluate (the draft failed the gate: it is not exported), or None.

    The operator's verdict (eagle3_contract.gate), so a manifest gates the same way here and in a cluster.
    """
    if plan.stage != Stage.EVALUATE or plan.skipped:
        return None
    evaluated = result if isinstance(result, EvaluateResult) else None
    verdict = judge_evaluation(evaluated, required)
    if verdict.passed:
        return None
    notes = evaluated.message if evaluated is not None else None
    return (
        f"the draft failed the gate ({verdict.reason}): {verdict.message}. Export and serving do not run "
        f"(evaluate says: {notes or 'nothing more'}; its whole result is in "
        f"{plan.output_dir}/result.json)"
    )
