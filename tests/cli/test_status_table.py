"""`eagle3 status`'s table: a pure function of an Eagle3Run's status (the typed model), the same for a cluster
run and a local one; and its -o json / -o yaml documents."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from eagle3_cli import status as table
from eagle3_cli import status_command as command
from eagle3_cli.main import main
from eagle3_contract.api.status import Eagle3RunStatus

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
NOW_TEXT = "2026-12-03T12:00:00Z"


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() writes the log format into the environment (for its subprocesses): not into the test run's."""
    monkeypatch.delenv("EAGLE3_LOG_FORMAT", raising=False)
    monkeypatch.delenv("EAGLE3_VERBOSE", raising=False)


RUNNING: dict[str, Any] = {
    "phase": "Running",
    "currentStage": "train",
    "progress": "train 2/6 ep",
    "eta": "3m",
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Progressing",
            "message": "stage train is running",
            "lastTransitionTime": "2026-12-03T11:50:00Z",
        }
    ],
    "stages": {
        "train": {
            "phase": "Running",
            "attempts": 1,
            "startTime": "2026-12-03T11:58:30Z",
            "progress": {
                "unit": "steps",
                "done": 80,
                "total": 240,
                "rate": 1.234,
                "etaSeconds": 130,
                "epochsDone": 2,
                "epochs": 6,
                "trainLoss": 0.9,
                "valLoss": 1.96,
                "estimatedAcceptanceLength": 2.95,
            },
        },
        "prepare": {
            "phase": "Succeeded",
            "attempts": 1,
            "startTime": "2026-12-03T11:50:00Z",
            "completionTime": "2026-12-03T11:50:07Z",
            "result": {"samples": 400, "skippedTotal": 0, "tokens": 20291, "assistantTokens": 6346},
        },
        "extract": {
            "phase": "Failed",
            "attempts": 3,
            "message": "OutOfMemory at token budget 512: halving stops at 512",
            "blockedBy": None,
        },
        "generate": {"phase": "Skipped", "message": "regeneration.enabled is false"},
        "evaluate": {"phase": "Pending"},
    },
}


def status_of(document: dict[str, Any]) -> Eagle3RunStatus:
    """A status document (as the API server or `eagle3 run` records it), read as `eagle3 status` reads it."""
    return Eagle3RunStatus.model_validate(document)


def condition(status: str) -> dict[str, str]:
    return {"type": "Ready", "status": status, "reason": "r", "message": "m", "lastTransitionTime": NOW_TEXT}


def test_one_row_per_stage_in_the_pipelines_order() -> None:
    rows = table.rows(status_of(RUNNING), NOW)
    assert [r.stage for r in rows] == ["prepare", "generate", "extract", "train", "evaluate"]
    prepare, generate, extract, train, evaluate = rows
    assert (prepare.phase, prepare.duration, prepare.attempts) == ("Succeeded", "7.0s", "1")
    assert prepare.result == "samples=400, skippedTotal=0, tokens=20291"
    assert generate.phase == "Skipped" and generate.result == "regeneration.enabled is false"
    assert extract.phase == "Failed" and extract.attempts == "3" and "halving stops at 512" in extract.result
    assert (train.progress, train.rate, train.eta, train.duration) == (
        "2/6 ep",
        "1.23 steps/s",
        "2m",
        "1m30s",
    )
    assert train.result == "epoch 2/6, val loss 1.96, est. acceptance 2.95"
    assert (evaluate.phase, evaluate.progress, evaluate.result) == ("Pending", "", "")


def test_the_finished_stages_key_figures() -> None:
    status = {
        "phase": "Succeeded",
        "stages": {
            "train": {
                "phase": "Succeeded",
                "result": {
                    "epochs": [{}, {}, {}],
                    "bestEpoch": 1,
                    "bestValLoss": 1.9104,
                    "estimatedAcceptanceLength": 3.0,
                },
                "progress": {"unit": "steps", "done": 240, "total": 240},
            },
            "evaluate": {"phase": "Succeeded", "result": {"acceptanceLength": 3.283, "speedup": 0.707}},
        },
    }
    train, evaluate = table.rows(status_of(status), NOW)
    # the lowest validation loss, with its epoch counted from 1 as the progress counts them (bestEpoch is the
    # 0-based index): issue 29 found "val 1.961" (the last epoch) beside "1.910" (the best) under one name
    assert train.result == "3 epochs, best val loss 1.91 (epoch 2), est. acceptance 3"
    assert train.rate == "" and train.eta == ""  # a finished stage has no rate
    assert evaluate.result == "acceptance length 3.28, speedup 0.707x (one run each, unpaired)"


def test_key_value_figures_carry_no_thousands_separators() -> None:
    status = {
        "phase": "Running",
        "stages": {
            "extract": {
                "phase": "Succeeded",
                "result": {"samples": 12, "tokensPerSecond": 3164.4, "bytesPerToken": 1035.0},
            }
        },
    }
    [extract] = table.rows(status_of(status), NOW)
    assert extract.result == "samples=12, tokensPerSecond=3164, bytesPerToken=1035"


def test_the_headline_says_phase_ready_progress_and_eta() -> None:
    assert table.headline("Eagle3Run ns/tiny", status_of(RUNNING)) == (
        "Eagle3Run ns/tiny: Running, Ready False, train 2/6 ep, ETA 3m (Progressing: stage train is running)"
    )
    ready = status_of({"phase": "Serving", "conditions": [condition("True")], "acceptanceLength": 3.28})
    assert table.headline("x", ready) == "x: Serving, Ready True, acceptance length 3.28"
    assert table.finished(ready) and not table.finished(status_of(RUNNING))
    assert table.finished(status_of({"phase": "Failed"}))
    assert not table.finished(status_of({"phase": "Serving", "conditions": [condition("False")]}))


def test_the_plain_table_shows_only_columns_with_values() -> None:
    pending = status_of({"phase": "Pending", "stages": {"prepare": {"phase": "Pending"}}})
    text = table.plain_table("x", pending, NOW)
    assert text.splitlines() == ["x: Pending, Ready Unknown", "stage    phase    result", "prepare  Pending"]
    full = table.plain_table("x", status_of(RUNNING), NOW).splitlines()
    assert full[1].split() == ["stage", "phase", "progress", "rate", "ETA", "attempts", "duration", "result"]


def test_the_rich_table_prints_messages_verbatim() -> None:
    from rich.console import Console

    status = {"phase": "Failed", "stages": {"prepare": {"phase": "Failed", "message": "[bold]key[/oops]"}}}
    console = Console(record=True, width=200)
    console.print(table.rich_table("x", status_of(status), NOW))
    assert "[bold]key[/oops]" in console.export_text()


def test_watch_redraws_until_the_run_is_finished(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    phases = iter(["Running", "Running", "Succeeded"])
    monkeypatch.setattr(command.time, "sleep", lambda s: None)

    def read() -> table.Observed:
        return table.Observed("x", status_of({"phase": next(phases)}))

    assert command.show(read, watch=True, interval=0.01) == 0
    out = capsys.readouterr().out
    assert out.count("x: Running") == 2 and out.count("x: Succeeded") == 1


# --- at 80 columns: wrapped between values, never inside one ----------------------------------------------

LONG: dict[str, Any] = {
    "phase": "Failed",
    "stages": {
        "prepare": {
            "phase": "Succeeded",
            "attempts": 1,
            "startTime": "2026-12-03T11:50:00Z",
            "completionTime": "2026-12-03T11:50:07Z",
            "result": {"samples": 400123, "skippedTotal": 12, "tokens": 20291456, "assistantTokens": 6346},
        },
        "generate": {
            "phase": "Succeeded",
            "attempts": 2,
            "result": {"rows": 400123, "regenerated": 400000, "failed": 123, "outputTokens": 98765432},
        },
        "extract": {
            "phase": "Failed",
            "attempts": 3,
            "message": "OutOfMemory at token budget 512: halving stops at 512; lower "
            "extraction.tokenBudget or give the stage more memory (nodePool.memory)",
        },
    },
}
VALUES = {  # of each stage's result, what must be whole on one line
    "prepare": ["samples=400123,", "skippedTotal=12,", "tokens=20291456"],
    "generate": ["regenerated=400000,", "failed=123"],
    "extract": ["extraction.tokenBudget", "(nodePool.memory)"],
}
ALL_VALUES = {value for values in VALUES.values() for value in values}


def whole_words(text: str) -> set[str]:
    return {word for line in text.splitlines() for word in line.replace("│", " ").split()}


def test_wrap_items_breaks_between_items_then_words_never_inside_one() -> None:
    text = "regenerated=400, failed=0, tokens=1234567; the server stopped answering after 600 s"
    assert table.wrap_items(text, 30) == [
        "regenerated=400, failed=0,",
        "tokens=1234567; the server",
        "stopped answering after 600 s",
    ]
    assert table.wrap_items("epoch 2/6, val loss 1.96, est. acceptance 2.95", 26) == [
        "epoch 2/6, val loss 1.96,",
        "est. acceptance 2.95",
    ]
    assert table.wrap_items("averyveryverylongvalue=1, b=2", 10) == ["averyveryverylongvalue=1,", "b=2"]
    assert table.wrap_items("", 10) == []


@pytest.mark.parametrize("stages", [["prepare", "generate", "extract"], ["prepare", "generate"]])
def test_the_rich_table_at_80_columns_wraps_a_long_result_between_values(stages: list[str]) -> None:
    from rich.console import Console

    status = LONG | {"stages": {k: v for k, v in LONG["stages"].items() if k in stages}}
    console = Console(record=True, width=80)
    console.print(table.rich_table("Eagle3Run team-a/tiny", status_of(status), NOW))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    words = whole_words(text)
    assert words >= {value for stage in stages for value in VALUES[stage]}, text  # each whole on a line
    assert "regenerated=4" not in words and "00" not in words


def test_a_result_too_long_beside_the_columns_goes_under_the_table_at_80_columns() -> None:
    from rich.console import Console

    running = LONG["stages"] | {
        "train": {
            "phase": "Running",
            "attempts": 1,
            "startTime": "2026-12-03T11:58:30Z",
            "progress": RUNNING["stages"]["train"]["progress"],
        }
    }
    console = Console(record=True, width=80)
    console.print(table.rich_table("x", status_of(LONG | {"stages": running}), NOW))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "result" not in lines[2]  # the header: no result column
    under = lines[lines.index(next(line for line in lines if line.startswith("└"))) + 1 :]
    assert under[0].startswith("prepare: samples=400123, skippedTotal=12,")
    assert whole_words("\n".join(under)) >= ALL_VALUES
    assert all(line.startswith(("prepare: ", "generate: ", "extract: ", "train: ", "  ")) for line in under)


def test_the_plain_table_wraps_at_a_width_the_same_way() -> None:
    text = table.plain_table("x", status_of(LONG), NOW, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert whole_words(text) >= ALL_VALUES, text
    unwrapped = table.plain_table("x", status_of(LONG), NOW)
    assert any(len(line) > 120 for line in unwrapped.splitlines())  # no width: one line a stage


def test_no_stage_observed_is_said_with_the_note_and_no_empty_table() -> None:
    from rich.console import Console

    note = "no stage observed yet; no operator is running (peering 'eagle3-operator' has no live peer)"
    pending = status_of({})
    assert table.plain_table("Eagle3Run ns/r", pending, NOW, note=note).splitlines() == [
        "Eagle3Run ns/r: Pending, Ready Unknown",
        note,
    ]
    console = Console(record=True, width=200)
    console.print(table.rich_table("Eagle3Run ns/r", pending, NOW, note=note))
    assert console.export_text().splitlines() == ["Eagle3Run ns/r: Pending, Ready Unknown", note]


# --- -o json / -o yaml: the status as the API shows it, and who the run is --------------------------------


def test_the_document_is_the_identity_and_the_camel_case_status() -> None:
    observed = table.Observed("t", status_of(RUNNING), {"name": "tiny", "namespace": "team-a"}, note="n")
    document = json.loads(command.document_text(observed, "json"))
    assert list(document) == ["name", "namespace", "status"]
    assert document["status"]["currentStage"] == "train"
    assert document["status"]["stages"]["train"]["progress"]["etaSeconds"] == 130
    assert "current_stage" not in document["status"] and "note" not in document
    assert yaml.safe_load(command.document_text(observed, "yaml")) == document
    assert "\n" not in command.document_text(observed, "json", one_line=True).rstrip("\n")


def test_watch_with_json_prints_one_line_per_change_until_finished(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    phases = iter(["Running", "Running", "Failed"])
    monkeypatch.setattr(command.time, "sleep", lambda s: None)

    def read() -> table.Observed:
        return table.Observed("x", status_of({"phase": next(phases)}), {"name": "r"})

    assert command.show(read, watch=True, interval=0.01, output="json") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["status"]["phase"] for line in lines] == ["Running", "Failed"]
    phases = iter(["Running", "Succeeded"])
    assert command.show(read, watch=True, interval=0.01, output="yaml") == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["status"]["phase"] for d in documents] == ["Running", "Succeeded"]


def test_eagle3_status_of_a_manifest_reads_its_artifacts(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from tests.pipeline.manifests import base_spec, write_manifest

    path = write_manifest(tmp_path / "run.yaml", base_spec(tmp_path / "m", tmp_path / "d"))
    assert main(["status", str(path), "--artifacts", str(tmp_path / "art")]) == 0
    out = capsys.readouterr().out
    assert "local run t" in out and "Pending" in out and "prepare" in out and "export" in out
    assert main(["status", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml" in capsys.readouterr().err


def test_the_acceptance_per_category_is_one_line_under_the_table() -> None:
    rows = [
        {"category": "add", "prompts": 3, "acceptanceLength": 2.4, "acceptanceRate": 0.47, "speedup": 1.62},
        {"category": "other", "prompts": 2, "acceptanceLength": None},
    ]
    status = status_of({"phase": "Serving", "checkpoint": {"path": "export/x", "categories": rows}})
    assert table.category_lines(status) == [
        "acceptance per category: add 2.40 (0.47, 1.62x, 3 prompts); other n/a (2 prompts)"
    ]
    assert table.category_lines(status_of({"phase": "Serving"})) == []
