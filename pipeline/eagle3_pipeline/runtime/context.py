"""What a stage program works with: its parameters, its inputs, and an output it commits atomically.

A program reads the spec only through `params` (what was hashed into its output directory's name) and
`tuning` (what it reads that changes no output), both computed by the stage's definition in
eagle3_contract.stages: the program cannot read a field that does not key its output.

A stage writes into a hidden work directory next to its output (`<stage>/.<hash>.partial`) and, when done,
writes `result.json` there and renames it to `<stage>/<hash>`: an output directory is complete when it holds
`result.json` (the marker written last), never merely because it exists. One without it (a copy cut short, a
`mkdir`, `rm -rf dir/*`) is moved aside to `<stage>/.<hash>.incomplete-<time>` with a warning, and redone.
A stage that is killed or runs out of memory leaves its work directory for the next attempt to resume from;
a stage that fails on bad input removes it, so no partial artifact is ever mistaken for a result (its logs
are kept in `<stage>/.<hash>.failed/`, where the failure's message then points).

A program reports its progress through `ctx.progress` (eagle3_pipeline.runtime.reporter.StageReporter):
stage_main gives the context one that serves the metrics endpoint; any other context (a test's) gets one that
logs only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.generation import generation_prepare_params
from eagle3_contract.mounts import ARTIFACTS_MOUNT, MODEL_CACHE_MOUNT
from eagle3_contract.params import GenerationData, StageParams, StageTuning
from eagle3_contract.stages import DEFINITIONS, Stage
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.reporter import StageReporter

logger = logging.getLogger(__name__)

RESULT_FILE = "result.json"
LOG_SUFFIX = ".log"  # what a failed stage keeps of its work directory (see StageContext.discard)
# Stages whose output is a prepared dataset; generate's (the verifier's own answers) wins when both are given.
DATA_STAGES = (Stage.GENERATE, Stage.PREPARE)
# Locally, where the cluster's model cache volume (/models) lives; unset in a pod.
ENV_MODELS_ROOT = "EAGLE3_MODELS_ROOT"


def models_root(models: str | None = None) -> Path:
    """Where /models lives on this machine: `models`, else $EAGLE3_MODELS_ROOT, else the per-user cache."""
    if models:
        return Path(models).expanduser()
    if os.environ.get(ENV_MODELS_ROOT):
        return Path(os.environ[ENV_MODELS_ROOT]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "eagle3-operator" / "models"


def is_complete(output: Path) -> bool:
    return (output / RESULT_FILE).is_file()


class ResultUnreadable(ValueError):
    """A stage's result.json that is not a JSON object: the message names the file and how to redo it."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(
            f"{path}: {what}, not the stage's result; the stage's output is damaged: delete {path.parent} "
            "and run again to redo that stage"
        )


def read_result(output: Path) -> dict[str, Any]:
    """The stage's result.json at `output` (ResultUnreadable where it is no JSON object)."""
    path = output / RESULT_FILE
    try:
        value = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise ResultUnreadable(path, "not UTF-8 text") from None
    except ValueError as exc:  # json's JSONDecodeError, or an integer too long to convert
        raise ResultUnreadable(path, f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ResultUnreadable(path, f"a JSON {type(value).__name__}")
    return value


def work_dir_of(output: Path) -> Path:
    return output.parent / f".{output.name}.partial"


def failed_dir_of(output: Path) -> Path:
    return output.parent / f".{output.name}.failed"


def keep_logs(work: Path, failed: Path) -> dict[Path, Path]:
    """Move the `*.log` files at the top of `work` into a fresh `failed`; returns {old path: new path}."""
    logs = sorted(work.glob(f"*{LOG_SUFFIX}")) if work.is_dir() else []
    if not logs:
        return {}
    shutil.rmtree(failed, ignore_errors=True)
    moved: dict[Path, Path] = {}
    try:
        failed.mkdir(parents=True)
        for log in logs:
            os.replace(log, failed / log.name)
            moved[log] = failed / log.name
    except OSError as exc:  # keeping a log must never hide the failure it explains
        logger.warning("cannot keep the logs of %s in %s: %s", work, failed, exc)
    return moved


def set_aside_incomplete(output: Path) -> Path | None:
    """Move an output path that exists without its result marker out of the way; returns where it went.

    A bare directory is no proof of a finished stage: taking it for one would skip the stage and hand the
    next one nothing. It is kept (renamed, not deleted) because it may hold something its owner wants.
    """
    if not os.path.lexists(output) or is_complete(output):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = output.parent / f".{output.name}.incomplete-{stamp}"
    n = 1
    while os.path.lexists(target):
        n += 1
        target = output.parent / f".{output.name}.incomplete-{stamp}-{n}"
    os.replace(output, target)
    logger.warning(
        "%s exists but is not a complete stage output (no %s): moved it aside to %s and running the stage "
        "again; delete it when you no longer need it",
        output,
        RESULT_FILE,
        target,
    )
    return target


P = TypeVar("P", bound=StageParams, covariant=True)
T = TypeVar("T", bound=StageTuning, covariant=True)


@dataclass(frozen=True)
class StageContext(Generic[P, T]):
    """One invocation of `eagle3 stage <name>`: a program is typed `run(ctx: StageContext[XParams, XTuning])`.

    There is no spec here on purpose: `params` is the stage's hashed payload, `tuning` its unhashed settings.
    """

    stage: Stage
    run_name: str
    params: P
    tuning: T
    artifacts: Path
    output: Path
    inputs: dict[Stage, Path] = field(default_factory=dict)
    token_budget: int | None = None
    reporter: StageReporter | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of_spec(
        cls,
        stage: Stage,
        run_name: str,
        spec: Eagle3RunSpec,
        artifacts: Path,
        output: Path,
        inputs: dict[Stage, Path] | None = None,
        token_budget: int | None = None,
        generation: GenerationData | None = None,
    ) -> StageContext[StageParams, StageTuning]:
        """The context of `stage` for `spec`: its params and tuning by the functions that made its hash (a
        later generation's prepare: with the `generation` its manifest carries: eagle3_contract.generation).
        """
        d = DEFINITIONS[stage]
        later = generation if stage is Stage.PREPARE else None
        return StageContext(
            stage,
            run_name,
            generation_prepare_params(spec, later) if later is not None else d.params(spec),
            d.tuning(spec),
            artifacts,
            output,
            dict(inputs or {}),
            token_budget,
        )

    @property
    def progress(self) -> StageReporter:
        """The program's progress reporter: `reporter`, else one made at first use (logging, not serving)."""
        reporter = self.reporter
        if reporter is None:
            reporter = StageReporter(self.stage.value)
            object.__setattr__(self, "reporter", reporter)  # frozen: set once, like a cached property
        return reporter

    @property
    def work(self) -> Path:
        return work_dir_of(self.output)

    def input(self, name: Stage) -> Path:
        """The complete output directory of the upstream stage `name`."""
        path = self.inputs.get(name)
        if path is None:
            raise StageError(
                f"stage {self.stage} needs the output of stage {name}, but no --input {name}=DIR"
            )
        if not is_complete(path):
            raise StageError(
                f"stage {self.stage}: input {name} at {path} is not a complete stage output "
                f"(no {RESULT_FILE}); run stage {name} first"
            )
        return path

    def data_input(self) -> Path:
        """The upstream data stage's complete output directory (generate's, else prepare's)."""
        for name in DATA_STAGES:
            if name in self.inputs:
                return self.input(name)
        raise StageError(
            f"stage {self.stage} needs the data stage's output: pass --input prepare=DIR (or generate=DIR)"
        )

    def local_path(self, path: str) -> str:
        """A path as written in the spec, mapped onto this machine (the cluster mounts, locally)."""
        return map_mounts(path, self.artifacts)

    def begin(self) -> Path:
        """The work directory, kept from an earlier attempt if any; an incomplete output is set aside."""
        set_aside_incomplete(self.output)
        self.work.mkdir(parents=True, exist_ok=True)
        return self.work

    def commit(self, result: dict[str, Any]) -> dict[str, Any]:
        """Write the result and move the work directory to the output in one rename."""
        (self.work / RESULT_FILE).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        _fsync_dir(self.work)
        set_aside_incomplete(self.output)
        if is_complete(self.output):  # another attempt finished first (same content hash): keep it
            shutil.rmtree(self.work)
        else:
            os.replace(self.work, self.output)
        return result

    def discard(self) -> dict[Path, Path]:
        """Remove the work directory, keeping its logs in `<stage>/.<hash>.failed/` (the last failure's).

        A failure's message names its log (the vLLM server's); deleting it with the partial data would leave
        the message pointing at nothing. Returns where each kept log went, so the message can follow it.
        """
        moved = keep_logs(self.work, failed_dir_of(self.output))
        shutil.rmtree(self.work, ignore_errors=True)
        return moved


def map_mounts(path: str, artifacts: Path) -> str:
    """`/artifacts/...` maps to the artifacts root; `/models/...` to $EAGLE3_MODELS_ROOT when it is set."""
    mounts = {ARTIFACTS_MOUNT: str(artifacts)}
    models_root = os.environ.get(ENV_MODELS_ROOT)
    if models_root:
        mounts[MODEL_CACHE_MOUNT] = models_root
    for mount, local in mounts.items():
        if path == mount or path.startswith(mount + "/"):
            return local + path[len(mount) :]
    return path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
