"""The status of a local run (`eagle3 status FILE`), in the shape of an Eagle3Run's status, so one table
shows a local run and a cluster run alike.

It follows from the manifest's stage plan (the content-hashed output directories), what is complete under the
artifacts directory (each stage's result.json), and what the running or last `eagle3 run` recorded
(`StatusRecorder`: attempts, times, failure messages, and the live progress of a running stage, read from
its metrics endpoint).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eagle3_contract.api.manifest import Manifest
from eagle3_contract.api.status import Eagle3RunStatus, StageProgress
from eagle3_contract.generation import generation_number, manifest_plans
from eagle3_contract.stage_metrics import eta_text, summary
from eagle3_contract.stages import StagePlan
from eagle3_pipeline.local.display import RunObserver, StageOutcome
from eagle3_pipeline.runtime.context import RESULT_FILE, is_complete, read_result

logger = logging.getLogger(__name__)

RECORD_EVERY_S = 1.0  # the status file is rewritten at most this often for progress alone
STATUS_SUFFIX = ".status.json"
FILE_NAME_MAX = 255


def snapshot_name(name: str, suffix: str) -> str:
    """`<name><suffix>`, shortened (with a hash of the name) where it would pass the 255-byte file name
    limit: a run name may have 253 characters, as in a cluster."""
    if len(name) + len(suffix) <= FILE_NAME_MAX:
        return name + suffix
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: FILE_NAME_MAX - len(suffix) - len(digest) - 1]}-{digest}{suffix}"


def generation_record(run: str, number: int) -> str:
    """The name a later generation of `run` is recorded under (`eagle3 run --retrain`)."""
    return f"{run}-generation-{number}"


def record_name(manifest: Manifest) -> str:
    """The name the manifest's stages are recorded under: the run's, or its generation's."""
    number = generation_number(manifest.document)
    return manifest.name if number is None else generation_record(manifest.name, number)


def status_file(artifacts: Path, run: str) -> Path:
    """Where `eagle3 run` records a run's stages: beside its manifest's snapshot."""
    return artifacts / ".runs" / snapshot_name(run, STATUS_SUFFIX)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusRecorder(RunObserver):
    """The run's stages as `eagle3 status FILE` reads them, in `path` (written whole, then renamed). The
    stages an earlier run recorded are kept: a reused stage keeps its times."""

    def __init__(self, path: Path, run: str) -> None:
        self.path, self.run = path, run
        stages = read_recorded(path).get("stages")
        self.stages: dict[str, dict[str, Any]] = stages if isinstance(stages, dict) else {}
        self.error: str | None = None
        self._written = 0.0
        self._lock = threading.RLock()  # the metrics poller's thread reports progress

    def stage_started(self, stage: str, output_dir: str, attempt: int) -> None:
        with self._lock:
            entry = self.stages.setdefault(stage, {})
            if entry.get("outputDir") != output_dir or entry.get("phase") != "Running":
                entry.clear()
                entry["startTime"] = _now()
            entry.update(phase="Running", outputDir=output_dir, attempts=attempt)
            self._write(force=True)

    def stage_progress(self, stage: str, progress: StageProgress) -> None:
        document = progress.model_dump(by_alias=True, exclude_none=True)
        with self._lock:
            self.stages.setdefault(stage, {})["progress"] = document | {"updated": _now()}
            self._write()

    def stage_finished(self, outcome: StageOutcome) -> None:
        if outcome.status in ("cached", "skipped"):
            return  # `eagle3 status` reads those from the artifacts and the plan
        with self._lock:
            entry = self.stages.setdefault(outcome.stage, {})
            entry.update(
                phase="Succeeded" if outcome.status == "done" else "Failed",
                attempts=outcome.attempts,
                completionTime=_now(),
                seconds=round(outcome.seconds, 1),
            )
            if outcome.note:
                entry["message"] = outcome.note
            if outcome.progress is not None:  # a stage that succeeded: all done (display.completed)
                document = outcome.progress.model_dump(by_alias=True, exclude_none=True)
                entry["progress"] = document | {"updated": _now()}
            self._write(force=True)

    def close(self, error: str | None = None) -> None:
        with self._lock:
            self.error = error
            self._write(force=True, running=False)

    def _write(self, force: bool = False, running: bool = True) -> None:
        if not force and time.monotonic() - self._written < RECORD_EVERY_S:
            return
        self._written = time.monotonic()
        pid = os.getpid() if running else None
        document: dict[str, Any] = {"run": self.run, "pid": pid}
        document["pidStart"] = process_start(pid) if pid is not None else None
        document["updated"] = _now()
        document |= {"stages": self.stages, "error": self.error}
        try:
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text(json.dumps(document, indent=1, sort_keys=True))
            partial.replace(self.path)
        except OSError as exc:  # the run goes on without it
            logger.debug("cannot write %s: %s", self.path, exc)


def read_recorded(path: Path) -> dict[str, Any]:
    """What a StatusRecorder wrote ({} for nothing readable); a record damaged in part keeps what is whole
    (its stages that are objects), and says once which file it is."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("%s cannot be read (%s): the stages are shown from their outputs alone", path, exc)
        return {}
    if not isinstance(document, dict):
        logger.warning("%s is not a status record (a JSON %s): ignored", path, type(document).__name__)
        return {}
    stages = document.get("stages")
    kept = {k: v for k, v in stages.items() if isinstance(v, dict)} if isinstance(stages, dict) else {}
    if kept != stages and stages is not None:
        logger.warning("%s: part of its stages is not a record (ignored)", path)
    return document | {"stages": kept}


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc's field 22), or None where there is no /proc:
    with the pid it tells a run's process from a later one that got the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])  # field 22 of the whole line: the 20th after the command's ")"
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: Any, started: Any = None) -> bool:
    """Whether process `pid` runs (on this machine) and, where the record says when it started, is that
    process and not a later one that reused its pid."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if isinstance(started, int) and (now := process_start(pid)) is not None:
        return now == started
    return True


def _completed(plan: StagePlan, output: Path, recorded: dict[str, Any]) -> dict[str, Any]:
    result = read_result(output)
    entry: dict[str, Any] = {"phase": "Succeeded", "result": result}
    entry["attempts"] = recorded.get("attempts") or 1
    with contextlib.suppress(OSError):
        finished = datetime.fromtimestamp((output / RESULT_FILE).stat().st_mtime, UTC)
        entry["completionTime"] = recorded.get("completionTime") or finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    seconds = recorded.get("seconds", result.get("seconds"))
    if isinstance(seconds, int | float):
        entry["seconds"] = seconds
    for key in ("startTime", "progress"):
        if key in recorded:
            entry[key] = recorded[key]
    return entry


def _recorded_since(recorded: dict[str, Any], output: Path) -> bool:
    """The record is of an attempt after the complete output was written: a check that runs again (verify)
    and failed, or runs now. The latest verdict is the stage's, not the earlier output's."""
    if recorded.get("phase") not in ("Failed", "Running"):
        return False
    stamp = recorded.get("completionTime") or recorded.get("startTime")
    try:
        when = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        written = (output / RESULT_FILE).stat().st_mtime
    except (ValueError, OSError):
        return False
    return when >= int(written)


def stage_status(plan: StagePlan, artifacts: Path, recorded: dict[str, Any], running: bool) -> dict[str, Any]:
    """One stage's entry, camelCase like status.stages.<stage>: from the plan, its output and the record
    (taken only when it is of this output directory: an edited spec is another hash)."""
    if recorded.get("outputDir") != plan.output_dir:
        recorded = {}
    base = {"hash": plan.output_dir.rsplit("/", 1)[-1], "outputDir": plan.output_dir}
    if plan.skipped:
        return {"phase": "Skipped", "message": plan.skipped}
    output = artifacts / plan.output_dir
    if is_complete(output) and not _recorded_since(recorded, output):
        return base | _completed(plan, output, recorded)
    entry = base | {k: v for k, v in recorded.items() if k not in ("outputDir", "phase")}
    phase = recorded.get("phase")
    if phase == "Running" and not running:
        entry["message"] = "the `eagle3 run` that ran it stopped; run it again to resume"
        phase = "Failed"
    entry["phase"] = phase if phase in ("Running", "Failed") else "Pending"
    return entry


def local_status(manifest: Manifest, artifacts: Path) -> Eagle3RunStatus:
    """The run's status from its artifacts directory, as an Eagle3Run's (ValueError: a record this version
    cannot read)."""
    recorded = read_recorded(status_file(artifacts, record_name(manifest)))
    running = alive(recorded.get("pid"), recorded.get("pidStart"))
    stages = {
        plan.stage.value: stage_status(
            plan, artifacts, recorded.get("stages", {}).get(plan.stage.value, {}), running
        )
        for plan in manifest_plans(manifest.document, manifest.spec)
    }
    error = recorded.get("error") if not running else None
    return Eagle3RunStatus.model_validate(
        run_status(stages, running, error if isinstance(error, str) else None)
    )


def run_status(stages: dict[str, dict[str, Any]], running: bool, error: str | None = None) -> dict[str, Any]:
    """The run's phase, Ready, current stage, progress and ETA from its stages (`error`: why the last
    `eagle3 run` stopped short, e.g. the gate)."""
    phases = [s["phase"] for s in stages.values()]
    current = next((n for n, s in stages.items() if s["phase"] in ("Running", "Failed")), None)
    complete = all(p in ("Succeeded", "Skipped") for p in phases)
    if running and "Running" in phases:
        phase = "Running"
    elif "Failed" in phases or (error and not complete):
        phase = "Failed"
    elif complete:
        phase = "Succeeded"
    else:
        phase = "Pending"
        current = next((n for n, s in stages.items() if s["phase"] == "Pending"), None)
    ready = phase == "Succeeded"
    status: dict[str, Any] = {"phase": phase, "stages": stages}
    status["conditions"] = [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "Complete" if ready else phase,
            "message": _ready_message(phase, current, error),
            "lastTransitionTime": transition_time(stages),
        }
    ]
    if current is not None:
        status["currentStage"] = current
        progress = stages[current].get("progress")
        parsed = StageProgress.model_validate(progress) if progress else None
        status["progress"] = summary(current, parsed)
        if phase == "Running" and parsed is not None and (eta := eta_text(parsed.eta_seconds)):
            status["eta"] = eta
    return status


def transition_time(stages: dict[str, dict[str, Any]]) -> str:
    """When the run last changed: its latest stage start or completion (RFC 3339, as the stages record
    them), so that reading the same run twice gives the same status (`eagle3 status --watch -o json` prints a
    document only on a change); now, for a run no stage of which has started."""
    stamps = [s[key] for s in stages.values() for key in ("startTime", "completionTime") if s.get(key)]
    return max(stamps, key=_time) if stamps else _now()


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _ready_message(phase: str, current: str | None, error: str | None) -> str:
    if phase == "Succeeded":
        return "every stage is complete under the artifacts directory"
    if error:
        return error
    if phase == "Running":
        return f"stage {current} is running"
    if phase == "Failed":
        return f"stage {current} failed; `eagle3 run` runs it again"
    return f"stage {current} has not run; `eagle3 run` goes on from there"
