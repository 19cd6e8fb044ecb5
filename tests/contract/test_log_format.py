"""The one log format (eagle3_contract.log_format): timestamps on every line, the project's, kopf's
and speculators' (loguru) alike; one JSON object per line with --log-format json."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest

from eagle3_contract.log_format import LogFormatError, chosen_format, make_formatter

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) {1,4}\S+: .+$")


def record(
    name: str = "eagle3_pipeline.stages.train.program", msg: str = "epoch %d done", **extra: object
) -> logging.LogRecord:
    rec = logging.LogRecord(name, logging.INFO, __file__, 1, msg, (3,) if "%d" in msg else None, None)
    rec.__dict__.update(extra)
    return rec


def test_text_lines_start_with_a_utc_timestamp_and_the_level() -> None:
    rec = record()
    rec.created, rec.msecs = 1796300000.25, 250
    assert (
        make_formatter("text").format(rec)
        == "2026-12-03T12:13:20.250Z INFO    eagle3_pipeline.stages.train.program: epoch 3 done"
    )
    kopf = record(
        "kopf.objects", "Handler succeeded.", k8s_ref={"namespace": "ns", "name": "tiny"}, k8s_skip=True
    )
    assert make_formatter("text").format(kopf).endswith(" kopf.objects: [ns/tiny] Handler succeeded.")
    assert " [rank 1] eagle3_pipeline" in make_formatter("text", where="rank 1").format(record())
    warning = record("py.warnings", "cli.py:579: UserWarning: no mask token\n  args.mask = resolve(\n")
    assert (
        make_formatter("text")
        .format(warning)
        .endswith(" py.warnings: cli.py:579: UserWarning: no mask token")
    )


def test_json_lines_are_one_object_with_time_level_logger_message_and_exception() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("why",), sys.exc_info())
    line = make_formatter("json").format(rec)
    assert "\n" not in line
    doc = json.loads(line)
    assert list(doc)[:4] == ["time", "level", "logger", "message"]
    assert doc["level"] == "ERROR" and doc["logger"] == "x" and doc["message"] == "failed: why"
    assert doc["exception"].startswith("Traceback") and "RuntimeError: boom" in doc["exception"]
    assert TEXT_LINE.match(f"{doc['time']} INFO    x: y")
    settings = object()  # kopf's settings object is no JSON: left out
    kopf = record(
        "kopf.objects", "ok", k8s_ref={"namespace": "ns", "name": "tiny"}, settings=settings, step=7
    )
    assert json.loads(make_formatter("json").format(kopf)) | {"time": ""} == {
        "time": "",
        "level": "INFO",
        "logger": "kopf.objects",
        "message": "ok",
        "step": 7,  # extra= fields are kept
        "object": "ns/tiny",
    }


def test_the_format_comes_from_the_option_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAGLE3_LOG_FORMAT", raising=False)
    assert chosen_format(None) == "text"
    monkeypatch.setenv("EAGLE3_LOG_FORMAT", "JSON")
    assert chosen_format(None) == "json" and chosen_format("text") == "text"
    with pytest.raises(LogFormatError, match="--log-format is 'yaml': give one of text, json"):
        chosen_format("yaml")


PROBE = """
import logging, warnings
from loguru import logger
from eagle3_contract.log_format import configure_logging
configure_logging({fmt!r}, loguru=True)
logging.getLogger("speculators").info("through logging")
logger.info("through loguru")
logger.debug("not shown: INFO")
warnings.warn("a warning")
logging.getLogger("httpx2").info("HTTP Request: POST /v1/chat/completions")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_speculators_loguru_lines_and_warnings_take_the_same_format(fmt: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", PROBE.format(fmt=fmt)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stderr.splitlines()
    assert len(lines) == 3, proc.stderr  # no HTTP request line, no loguru DEBUG
    if fmt == "text":
        assert all(TEXT_LINE.match(line) for line in lines), lines
        assert lines[1].endswith(" __main__: through loguru")
    else:
        docs = [json.loads(line) for line in lines]
        assert [d["message"] for d in docs[:2]] == ["through logging", "through loguru"]
        assert docs[2]["logger"] == "py.warnings" and "a warning" in docs[2]["message"]
