"""The one log format of every `eagle3` process: the command line, the operator (kopf's lines included), the
stage programs and what speculators logs through loguru.

text (default): `2026-12-03T18:25:30.123Z INFO    eagle3_pipeline.stages.train.program: message`, UTC with
milliseconds, one line per record (a traceback follows on its own lines).
json: one object per line, `{"time": ..., "level": ..., "logger": ..., "message": ...}`, plus `exception`
(the formatted traceback), `object` (kopf's namespace/name of the Eagle3Run a line is about), `where` (a
torchrun worker's rank) and any `extra=` fields. It is python-json-logger's formatter, the library kopf's own
JSON logging is built on.

`eagle3 --log-format json|text` sets it, else `$EAGLE3_LOG_FORMAT`; the command writes its choice back into
the environment, so the stage subprocesses (and their torchrun workers) log the same way.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from typing import Any

ENV_LOG_FORMAT = "EAGLE3_LOG_FORMAT"
ENV_VERBOSE = "EAGLE3_VERBOSE"  # "1": debug logging, inherited by the stage subprocesses like the format
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(where)s%(name)s: %(message)s"
# HTTP clients that log every request at INFO (openai's vendored httpx2 among them): quiet unless verbose.
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "openai")
# loguru's levels without a logging twin
LOGURU_LEVELS = {"TRACE": logging.DEBUG, "SUCCESS": logging.INFO}


class LogFormatError(ValueError):
    """$EAGLE3_LOG_FORMAT (or the option) names no format."""


def utc_time(record: logging.LogRecord) -> str:
    """RFC 3339, UTC, milliseconds: 2026-12-03T18:25:30.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _object_ref(record: logging.LogRecord) -> str | None:
    """kopf's per-object records carry the object as `k8s_ref`: `namespace/name`."""
    ref = getattr(record, "k8s_ref", None)
    if not isinstance(ref, dict) or not ref.get("name"):
        return None
    return f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else str(ref["name"])


class TextFormatter(logging.Formatter):
    def __init__(self, where: str | None = None) -> None:
        super().__init__(TEXT_FORMAT)
        self.where = f"[{where}] " if where else ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_time(record)

    def format(self, record: logging.LogRecord) -> str:
        record.where = self.where
        message = _message(record)
        if message == record.getMessage():
            return super().format(record)
        shown = logging.makeLogRecord(record.__dict__)
        shown.msg, shown.args = message, None
        return super().format(shown)


def _message(record: logging.LogRecord, prefix: bool = True) -> str:
    """The message, with kopf's own prefix `[namespace/name]` for a record about an object; a captured
    warning without the source line and line break `warnings` adds."""
    message = record.getMessage()
    if record.name == "py.warnings":
        message = message.split("\n", 1)[0]
    message = message.rstrip("\n")
    ref = _object_ref(record) if prefix else None
    return f"[{ref}] {message}" if ref else message


def json_formatter(where: str | None = None) -> logging.Formatter:
    """python-json-logger's formatter with the project's field names (kopf depends on the library)."""
    try:
        from pythonjsonlogger.core import RESERVED_ATTRS
        from pythonjsonlogger.json import JsonFormatter
    except ImportError:
        raise LogFormatError(
            "--log-format json needs python-json-logger, which is not installed here: "
            "`pip install python-json-logger`, or use --log-format text"
        ) from None

    class ProjectJsonFormatter(JsonFormatter):
        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
            return utc_time(record)

        def add_fields(
            self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
        ) -> None:
            super().add_fields(log_data, record, message_dict)
            if log_data.get("message"):
                log_data["message"] = _message(record, prefix=False)
            if (ref := _object_ref(record)) is not None:
                log_data["object"] = ref
            if where:
                log_data["where"] = where

    return ProjectJsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger", "exc_info": "exception"},
        # kopf's extras: the object (shown as `object`), its event switch and its settings object
        reserved_attrs=[*RESERVED_ATTRS, "k8s_ref", "k8s_skip", "settings", "where"],
    )


class StderrHandler(logging.Handler):
    """Writes to the process's stderr as it is at each record (a test's capture, rich's live display
    replace sys.stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def chosen_format(option: str | None) -> str:
    """The option, else $EAGLE3_LOG_FORMAT, else text; LogFormatError for anything else."""
    value = (option or os.environ.get(ENV_LOG_FORMAT) or "text").strip().lower()
    if value not in FORMATS:
        where = "--log-format" if option else f"${ENV_LOG_FORMAT}"
        raise LogFormatError(f"{where} is {value!r}: give one of {', '.join(FORMATS)}")
    return value


def make_formatter(log_format: str, where: str | None = None) -> logging.Formatter:
    return json_formatter(where) if log_format == "json" else TextFormatter(where)


def configure_logging(
    log_format: str | None = None,
    verbose: bool | None = None,
    where: str | None = None,
    loguru: bool = True,
) -> str:
    """One stderr handler on the root logger in `log_format` (else $EAGLE3_LOG_FORMAT, else text), INFO
    (DEBUG when `verbose`, else $EAGLE3_VERBOSE); warnings go through it too, and with `loguru` loguru's
    records (a process that runs speculators: loguru takes a tenth of a second to import). `where` marks
    every line of this process (a torchrun worker's `rank 1`). Returns the format; both choices are written
    back into the environment for subprocesses. LogFormatError for an unknown format."""
    chosen = chosen_format(log_format)
    debug = verbose if verbose is not None else os.environ.get(ENV_VERBOSE) == "1"
    handler = StderrHandler()
    handler.setFormatter(make_formatter(chosen, where))
    root = logging.getLogger()
    # a second call (tests, a torchrun worker) replaces its handler; a test runner's capture stays
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, StderrHandler)] + [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    for name in QUIET_LOGGERS:  # one INFO line per HTTP request drowns a day-long stage's progress lines
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)
    logging.captureWarnings(True)
    if loguru:
        route_loguru(debug)
    os.environ[ENV_LOG_FORMAT] = chosen
    os.environ[ENV_VERBOSE] = "1" if debug else "0"
    return chosen


def _loguru_to_logging(message: Any) -> None:
    """A loguru sink: the record, as a logging record of the same logger name, time and exception."""
    record = message.record
    level = LOGURU_LEVELS.get(record["level"].name, record["level"].no)
    target = logging.getLogger(record["name"] or "loguru")
    if not target.isEnabledFor(level):
        return
    exception = record["exception"]
    exc_info = (exception.type, exception.value, exception.traceback) if exception else None
    shown = target.makeRecord(
        target.name,
        level,
        record["file"].path,
        record["line"],
        record["message"],
        (),
        exc_info,
        record["function"],
    )
    shown.created = record["time"].timestamp()
    shown.msecs = record["time"].microsecond // 1000
    target.handle(shown)


def route_loguru(debug: bool = False) -> None:
    """speculators logs some lines through loguru, which writes its own format to stderr: send them to
    logging instead (where loguru is installed; the operator's image has none)."""
    if importlib.util.find_spec("loguru") is None:
        return
    from loguru import logger

    logger.remove()
    logger.add(_loguru_to_logging, level="DEBUG" if debug else "INFO", format="{message}")
