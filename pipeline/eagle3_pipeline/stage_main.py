"""`eagle3 stage <name>`: one stage program, the same in a Job's container and under the local executor.

A node above 0 of a multi-node train stage (`EAGLE3_NODE_RANK` > 0, eagle3_pipeline.stages.train.nodes) runs
the same command in worker mode: it joins node 0's training and exits 0 when it ends, without the output's
lock, work directory or result, which node 0 owns.

Exit codes: 0 done (the result JSON is the last line of stdout and the container's termination message),
1 bad input (message on stderr and in the termination message), OOM_EXIT_CODE out of memory (retry with half
the token budget; the work directory is kept so the retry resumes), CHECK_FAILED_EXIT_CODE a check failed on
its input (verify; the termination message adds the `reason` and what was expected and found).

While the program runs it serves its progress metrics when $EAGLE3_METRICS_PORT is set (ctx.progress,
eagle3_pipeline.runtime.reporter); a worker node reports nothing (node 0 reports for the stage).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from eagle3_contract.api.manifest import ManifestError, load_manifest
from eagle3_contract.exit_codes import ENV_TERMINATION_LOG, STAGE_ERROR_EXIT_CODE, TERMINATION_LOG
from eagle3_contract.generation import generation_of
from eagle3_contract.params import StageParams, StageTuning
from eagle3_contract.results import StageResult, check_result
from eagle3_contract.stages import DEFINITIONS, Stage
from eagle3_pipeline.runtime.context import StageContext, is_complete, read_result
from eagle3_pipeline.runtime.errors import CheckFailed, OutOfMemory, StageError, is_out_of_memory
from eagle3_pipeline.runtime.locks import OutputLocked, hold_output_lock
from eagle3_pipeline.runtime.process_group import Terminated, terminating_raises
from eagle3_pipeline.runtime.reporter import StageReporter
from eagle3_pipeline.stages.train.nodes import node_rank

logger = logging.getLogger(__name__)

TERMINATION_LIMIT = 4096

# A program returns its result as a dict or as its stage's model (eagle3_contract.results); either way it is
# checked against the model before it is committed, so a wrong type fails the stage, not a reader later.
StageProgram = Callable[[StageContext[Any, Any]], dict[str, Any] | StageResult]


def program_module(stage: str) -> ModuleType:
    """A stage's program module, eagle3_pipeline.stages.<stage>.program (imported lazily on purpose: the
    programs import torch, which is slow to import)."""
    package = f"eagle3_pipeline.stages.{stage}"
    try:
        return importlib.import_module(f"{package}.program")
    except ModuleNotFoundError as exc:
        if exc.name in (package, f"{package}.program"):
            raise StageError(f"stage {stage} has no program in this version of eagle3-pipeline") from None
        raise


def program(stage: str) -> StageProgram:
    """The `run(ctx) -> result` function of a stage."""
    run: StageProgram = program_module(stage).run
    return run


def termination_text(payload: dict[str, Any]) -> str:
    """The result as the termination message, parseable within the 4096 bytes Kubernetes keeps: whole if it
    fits; else its scalars with the speculation table's schedule and baselines (what serving and the
    dashboard need; the cells stay in result.json and the checkpoint's manifest) and evaluate's checkpoint
    choice (the run's Event names it); else its scalars and the table's schedule; else its scalars."""
    scalars = {k: v for k, v in payload.items() if not isinstance(v, dict | list)}
    table, choice = payload.get("speculation"), payload.get("checkpointSelection")
    trimmed = (
        {"speculation": {k: table[k] for k in ("schedule", "baselines") if k in table}}
        if isinstance(table, dict)
        else {}
    )
    chosen = {"checkpointSelection": choice} if isinstance(choice, dict) else {}
    compact = [scalars | trimmed | chosen, scalars | trimmed] if trimmed or chosen else []
    for candidate in (payload, *compact, scalars):
        text = json.dumps(candidate, sort_keys=True, separators=(",", ":"))
        if len(text.encode()) <= TERMINATION_LIMIT:
            return text
    return text


def write_termination_message(payload: dict[str, Any]) -> None:
    path = os.environ.get(ENV_TERMINATION_LOG) or (TERMINATION_LOG if os.path.exists(TERMINATION_LOG) else "")
    if not path:
        return
    text = termination_text(payload)
    try:
        Path(path).write_text(text[:TERMINATION_LIMIT])
    except OSError as exc:
        logger.warning("cannot write the termination message to %s: %s", path, exc)


def build_context(
    stage: str, spec_path: str, artifacts: str, output: str, inputs: list[str], token_budget: int | None
) -> StageContext[StageParams, StageTuning]:
    """The program's context: its params and tuning computed from the manifest by the stage's definition,
    the very functions that made the hash in its output directory's name."""
    manifest = load_manifest(spec_path)
    root = Path(artifacts).resolve()
    parsed: dict[Stage, Path] = {}
    for item in inputs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise StageError(f"--input {item!r}: expected NAME=DIR (DIR relative to --artifacts)")
        try:
            parsed[Stage(name)] = under_root(root, path, f"--input {item!r}")
        except ValueError:
            raise StageError(
                f"--input {item!r}: {name} is not a stage; NAME is one of {', '.join(Stage)}"
            ) from None
    return StageContext.of_spec(
        Stage(stage),
        manifest.name,
        manifest.spec,
        root,
        under_root(root, output, f"--output {output!r}"),
        parsed,
        token_budget,
        generation_of(manifest.document),
    )


def under_root(root: Path, relative: str, what: str) -> Path:
    """`root / relative`, refused (StageError) unless it lies strictly inside `root`.

    The check is lexical ('..' and absolute paths), not through symlinks: the threat is a path that names a
    place outside the artifacts, not a directory the operator of the volume linked in on purpose.
    """
    path = Path(os.path.normpath(root / relative))
    if path == root or not path.is_relative_to(root):
        raise StageError(
            f"{what}: resolves to {path}, outside --artifacts {root}; give a directory inside it, "
            "relative to --artifacts, without '..'"
        )
    return path


def run_stage(
    stage: str,
    spec_path: str,
    artifacts: str,
    output: str,
    inputs: list[str],
    token_budget: int | None = None,
) -> int:
    """Run a stage to completion under its output's lock; returns the process exit code."""
    try:
        Stage(stage)
        ctx = build_context(stage, spec_path, artifacts, output, inputs, token_budget)
        worker = Stage(stage) is Stage.TRAIN and node_rank() > 0
    except (ValueError, ManifestError, StageError) as exc:
        return _fail(str(exc))
    if worker:
        return _run_worker(stage, ctx)
    reporter = StageReporter.from_env(stage)
    try:
        with terminating_raises(), hold_output_lock(ctx.output):
            return _run_locked(stage, dataclasses.replace(ctx, reporter=reporter))
    except OutputLocked as exc:
        return _fail(_prefixed(stage, exc))
    except OSError as exc:  # the lock file cannot be made: a read-only or missing artifacts volume
        return _fail(_not_writable(stage, exc))
    except Terminated:
        sys.stderr.write(f"error: stage {stage}: stopped by SIGTERM; its finished work is kept for a retry\n")
        raise
    except KeyboardInterrupt:
        sys.stderr.write(f"error: stage {stage}: interrupted; its finished work is kept for a retry\n")
        raise
    finally:
        reporter.close()  # the end line; the metrics server stops


def _run_locked(stage: str, ctx: StageContext[StageParams, StageTuning]) -> int:
    """The stage's program from its work directory to its committed output (or a failure that says why)."""
    if DEFINITIONS[Stage(stage)].reuses_output and is_complete(ctx.output):
        result = read_result(ctx.output)
        logger.info("stage %s: %s is complete already", stage, ctx.output)
        return _succeed(result)
    try:
        run = program(stage)
        ctx.begin()
        result = ctx.commit(check_result(stage, run(ctx)))
    except CheckFailed as exc:
        moved = ctx.discard()
        # the status prefixes the stage
        return _fail(_moved(_prefixed(stage, exc), moved), exc.exit_code, exc.termination_detail())
    except StageError as exc:
        moved = {} if exc.keep_work else ctx.discard()
        return _fail(_moved(_prefixed(stage, exc), moved))
    except OutOfMemory as exc:
        return _oom(stage, ctx, str(exc))
    except PermissionError as exc:
        return _fail(_not_writable(stage, exc))
    except Exception as exc:
        if is_out_of_memory(exc):
            return _oom(stage, ctx, f"{type(exc).__name__}: {exc}")
        # unexpected: keep the work directory so a retry resumes, and say what happened where Kubernetes looks
        logger.exception("stage %s failed", stage)
        return _fail(f"stage {stage}: {_described(exc)} (finished work is kept for the retry)")
    return _succeed(result)


def _run_worker(stage: str, ctx: StageContext[StageParams, StageTuning]) -> int:
    """A worker node's part of a multi-node stage: 0 when it ended; the output's lifecycle is node 0's."""
    try:
        with terminating_raises():
            program_module(stage).run_worker(ctx)
    except StageError as exc:
        return _fail(_prefixed(stage, exc))
    except Terminated:
        sys.stderr.write(f"error: stage {stage}: worker node stopped by SIGTERM\n")
        raise
    except Exception as exc:
        logger.exception("stage %s: worker node failed", stage)
        return _fail(f"stage {stage}: worker node: {type(exc).__name__}: {exc}")
    logger.info("stage %s: worker node done", stage)
    return 0


def _prefixed(stage: str, exc: BaseException) -> str:
    """`stage NAME: message`, once: a message that already starts with the stage's name keeps its own."""
    message = str(exc)
    if message.startswith((f"stage {stage}:", f"stage {stage} ")):
        return message
    return f"stage {stage}: {message}"


def _moved(message: str, moved: dict[Path, Path]) -> str:
    """The message with each path of a log kept from the discarded work directory where the log is now."""
    for old, new in moved.items():
        message = message.replace(str(old), str(new))
    return message


def _not_writable(stage: str, exc: OSError) -> str:
    where = exc.filename or "the artifacts directory"
    return (
        f"stage {stage}: cannot write {where} ({exc.strerror or exc}); the artifacts directory must be "
        "writable by this user (check its owner and mode, or the volume's readOnly setting)"
    )


def _succeed(result: dict[str, Any]) -> int:
    write_termination_message(result)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


def _described(exc: BaseException) -> str:
    """An unexpected exception in one line, with the one that caused it where a library wrapped it (datasets'
    DatasetGenerationError says only "An error occurred while generating the dataset")."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    while cause is not None and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    return text if cause is None else f"{text}, caused by {type(cause).__name__}: {cause}"


def _fail(message: str, code: int = STAGE_ERROR_EXIT_CODE, detail: dict[str, Any] | None = None) -> int:
    sys.stderr.write(f"error: {message}\n")
    write_termination_message({"error": message} | (detail or {}))
    return code


def _oom(stage: str, ctx: StageContext[Any, Any], detail: str) -> int:
    message = (
        f"stage {stage}: out of memory at token budget {ctx.token_budget}: {detail}; "
        "retry with a smaller budget (the finished part is kept)"
    )
    sys.stderr.write(f"error: {message}\n")
    write_termination_message({"error": message, "oom": True, "tokenBudget": ctx.token_budget})
    return OutOfMemory.exit_code
