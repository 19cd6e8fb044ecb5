"""What a stage program works with: its parameters, its inputs, and an output it commits atomically.

A program reads the spec only through `params` (what was hashed into its output directory's name) and
`tuning` (what it reads that changes no output), both computed by the stage's definition in
eagle3_contract.stages: the program cannot read a field that does not key its output.

A stage writes into a hidden work directory next to its output (`<stage>/.<hash>.partial`) and, when done,
writes `result.json` there and renames it to `<stage>/<hash>`: an output directory that exists is complete.
A stage that is killed or runs out of memory leaves its work directory for the next attempt to resume from;
a stage that fails on bad input removes it, so no partial artifact is ever mistaken for a result.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.mounts import ARTIFACTS_MOUNT, MODEL_CACHE_MOUNT
from eagle3_contract.params import StageParams, StageTuning
from eagle3_contract.stages import DEFINITIONS, Stage
from eagle3_pipeline.errors import StageError

RESULT_FILE = "result.json"
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


def read_result(output: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((output / RESULT_FILE).read_text())
    return value


def work_dir_of(output: Path) -> Path:
    return output.parent / f".{output.name}.partial"


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
    ) -> StageContext[StageParams, StageTuning]:
        """The context of `stage` for `spec`: its params and tuning by the functions that made its hash."""
        d = DEFINITIONS[stage]
        return StageContext(
            stage,
            run_name,
            d.params(spec),
            d.tuning(spec),
            artifacts,
            output,
            dict(inputs or {}),
            token_budget,
        )

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
        """The work directory, kept from an earlier attempt if there was one."""
        self.work.mkdir(parents=True, exist_ok=True)
        return self.work

    def commit(self, result: dict[str, Any]) -> dict[str, Any]:
        """Write the result and move the work directory to the output in one rename."""
        (self.work / RESULT_FILE).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        _fsync_dir(self.work)
        if self.output.exists():  # another attempt finished first (same content hash): keep it
            shutil.rmtree(self.work)
        else:
            os.replace(self.work, self.output)
        return result

    def discard(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


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
