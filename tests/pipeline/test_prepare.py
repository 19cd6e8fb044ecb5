"""The prepare stage: outputs speculators reads, deterministic splits, skip reasons, clean failures."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.stage_main import run_stage
from tests.pipeline.chat_templates import TOOL_TEMPLATES, save_verifier
from tests.pipeline.function_calling import MALFORMED, TOOLS, calls_only_row, function_calling_rows
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_verifier(tmp_path_factory.mktemp("verifier"))


def prepare(tmp_path: Path, verifier: Path, rows: list[Any], **dataset: Any) -> tuple[int, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = write_jsonl(tmp_path / "data.jsonl", rows)
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source, **dataset))
    code = run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", [])
    return code, tmp_path / "art" / "prepare" / "h"


def result_of(out: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((out / "result.json").read_text())
    return value


def test_outputs_are_what_speculators_reads(tmp_path: Path, verifier: Path) -> None:
    import datasets
    import torch
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    code, out = prepare(
        tmp_path, verifier, [chat(i, turns=1 + i % 2) for i in range(30)], validationFraction=0.2
    )
    assert code == 0
    data = datasets.load_from_disk(str(out / "data"))
    assert data.format["type"] == "torch"
    assert {"input_ids", "loss_mask", "seq_len"} <= set(data.column_names)
    splits = list(data.with_format(None)["split"])
    assert splits == sorted(splits, key=lambda s: s != "train"), (
        "train rows first: speculators splits by ratio"
    )
    result = result_of(out)
    assert (result["samples"], result["train"], result["validation"]) == (30, 24, 6)
    assert result["trainRatio"] == 0.8
    # speculators' own counter over the train rows gives our token_freq.pt
    theirs = tmp_path / "theirs.pt"
    save_token_frequency_distribution(data.select(range(result["train"])), theirs)
    assert torch.load(out / "token_freq.pt") == torch.load(theirs)
    assert result["assistantTokens"] == sum(int(r["loss_mask"].sum()) for r in data)
    assert result["uniqueAssistantTokens"] == len(torch.load(theirs))
    lines = (out / "conversations.jsonl").read_text().splitlines()
    assert len(lines) == 30 and {json.loads(x)["split"] for x in lines} == {"train", "val"}


def split_of(out: Path) -> dict[str, str]:
    rows = [json.loads(x) for x in (out / "conversations.jsonl").read_text().splitlines()]
    return {r["id"]: r["split"] for r in rows}


def test_the_split_depends_on_ids_and_seed_only(tmp_path: Path, verifier: Path) -> None:
    rows = [{**chat(i), "id": f"r{i}"} for i in range(40)]
    _, a = prepare(tmp_path / "a", verifier, rows)
    _, b = prepare(tmp_path / "b", verifier, list(reversed(rows)))
    _, c = prepare(tmp_path / "c", verifier, rows, seed=7)
    assert split_of(a) == split_of(b)
    assert split_of(a) != split_of(c)
    assert sum(s == "val" for s in split_of(a).values()) == 4


def test_skipped_rows_are_counted_by_reason(tmp_path: Path, verifier: Path) -> None:
    rows = [
        *[chat(i) for i in range(10)],
        {"messages": [{"role": "user", "content": "no answer"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "word " * 400}]},
        "{broken",
    ]
    code, out = prepare(tmp_path, verifier, rows)
    assert code == 0
    result = result_of(out)
    assert result["skipped"] == {"malformed": 1, "no_assistant_turn": 1, "too_long": 1}
    assert result["samples"] == 10
    assert "tokens > 256" in result["skippedExamples"]["too_long"][0]


def sharegpt(i: int) -> dict[str, Any]:
    turns = [{"from": "human", "value": f"count {i}"}, {"from": "gpt", "value": f"one two {i}"}]
    return {"id": f"s{i}", "conversations": turns}


def test_an_assistant_first_row_is_trained_not_fatal(tmp_path: Path, verifier: Path) -> None:
    """Issue 13, item 1: a row opening with the assistant's greeting used to fail the whole stage."""
    greeting = {
        "id": "g",
        "conversations": [
            {"from": "gpt", "value": "Hi"},
            {"from": "human", "value": "x"},
            {"from": "gpt", "value": "y"},
        ],
    }
    code, out = prepare(tmp_path, verifier, [*[sharegpt(i) for i in range(6)], greeting])
    assert code == 0
    result = result_of(out)
    assert result["samples"] == 7 and result["skippedTotal"] == 0


@pytest.mark.parametrize(
    "where",
    ["eagle3_pipeline.data.prepared.tokenize_conversation", "eagle3_pipeline.data.conversations.normalize"],
)
def test_a_bug_in_a_row_parser_fails_the_stage_with_its_traceback_not_a_skip(
    tmp_path: Path,
    verifier: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    """Issue 42: a regression that broke every multi-turn row became "skipped" rows, and the default
    maxSkippedFraction of 0.5 let it pass. Only the documented row problems (RowError) are skips."""
    module, name = where.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[name]), name)

    def broken(*args: Any, **kwargs: Any) -> Any:
        if "count 3" in json.dumps(args[1] if name == "tokenize_conversation" else args[0]):
            raise ZeroDivisionError("a bug in the project's own row code")
        return real(*args, **kwargs)

    monkeypatch.setattr(where, broken)
    code, out = prepare(tmp_path, verifier, [sharegpt(i) for i in range(6)])
    assert code == 1 and not (out / "result.json").exists()
    failed = [r for r in caplog.records if r.getMessage() == "stage prepare failed"]
    assert failed and failed[0].exc_info is not None
    chain, exc = [], failed[0].exc_info[1]  # the logged traceback: the bug, also where a library wraps it
    while exc is not None:
        chain.append(type(exc))
        exc = exc.__cause__ or exc.__context__
    assert ZeroDivisionError in chain
    said = capsys.readouterr().err
    assert "ZeroDivisionError: a bug in the project's own row code" in said


def test_a_missing_dataset_fails_naming_it_and_leaves_nothing(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, tmp_path / "nope.jsonl"))
    assert run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", []) == 1
    assert "nope.jsonl: no such file" in capsys.readouterr().err
    assert not any((tmp_path / "art" / "prepare").iterdir())


def test_the_wrong_format_fails_saying_what_the_rows_look_like(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}] * 3
    code, out = prepare(tmp_path, verifier, rows, format="messages")
    assert code == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "no usable rows" in err and "is dataset.format right?" in err


def test_rows_without_any_answer_fail_unless_regeneration_answers_them(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = prepare(tmp_path, verifier, [{"prompt": f"q{i}"} for i in range(4)])
    assert code == 1 and not out.exists()
    assert "set regeneration.enabled to true" in capsys.readouterr().err


def test_prompt_rows_are_handed_to_regeneration(tmp_path: Path, verifier: Path) -> None:
    source = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(4)])
    spec = base_spec(verifier, source) | {"regeneration": {"enabled": True}}
    spec_path = write_manifest(tmp_path / "run.yaml", spec)
    assert run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", []) == 0
    out = tmp_path / "art" / "prepare" / "h"
    assert result_of(out)["conversations"] == 4
    assert len((out / "conversations.jsonl").read_text().splitlines()) == 4


def test_a_bad_verifier_path_fails_before_writing(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = prepare(tmp_path, tmp_path / "no-model", [chat(1)])
    assert code == 1 and not out.exists()
    assert "cannot load its tokenizer" in capsys.readouterr().err


def test_a_complete_output_is_not_redone(tmp_path: Path, verifier: Path) -> None:
    code, out = prepare(tmp_path, verifier, [chat(i) for i in range(5)])
    assert code == 0
    before = (out / "result.json").stat().st_mtime_ns
    spec_path = tmp_path / "run.yaml"
    assert run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", []) == 0
    assert (out / "result.json").stat().st_mtime_ns == before


def test_a_directory_mixing_formats_is_prepared_whole(tmp_path: Path, verifier: Path) -> None:
    """Issue 13, item 3: the format used to be detected once, from the first row, for every file."""
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "a.jsonl", [sharegpt(i) for i in range(5)])
    (tmp_path / "d" / "b.json").write_text(json.dumps([chat(i) for i in range(5)]))
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, tmp_path / "d"))
    assert run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", []) == 0
    result = result_of(tmp_path / "art" / "prepare" / "h")
    assert result["samples"] == 10 and result["skippedTotal"] == 0
    assert result["format"] == "messages+sharegpt"


def test_too_many_skipped_rows_fail_the_stage_with_the_counts(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [*[chat(i) for i in range(3)], *["{broken"] * 4, {"messages": [{"role": "user", "content": "q"}]}]
    code, out = prepare(tmp_path / "a", verifier, rows)
    assert code == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "5 of 8 rows skipped" in err and "'malformed': 4" in err and "'no_assistant_turn': 1" in err
    assert "dataset.maxSkippedFraction (0.5)" in err
    code, out = prepare(tmp_path / "b", verifier, rows, maxSkippedFraction=0.7)
    assert code == 0 and result_of(out)["skippedTotal"] == 5


def test_an_empty_dataset_file_says_so(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = prepare(tmp_path, verifier, [])
    assert code == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "data.jsonl: no rows (the file is empty" in err and "is auto: " not in err


def test_dataset_revision_is_hashed_only_when_set(tmp_path: Path, verifier: Path) -> None:
    """Issue 13, item 6: a label for new files at the same path; unset, the hashes stay as they were."""
    from eagle3_contract.api.spec import Eagle3RunSpec
    from eagle3_contract.params import prepare_params
    from eagle3_contract.stages import plan_stages

    spec = base_spec(verifier, tmp_path / "data.jsonl")
    unset = Eagle3RunSpec.model_validate(spec)
    assert "revision" not in prepare_params(unset).model_dump(mode="json", by_alias=True)["dataset"]
    spec["dataset"]["revision"] = "2026-12-01"
    labelled = Eagle3RunSpec.model_validate(spec)
    before, after = plan_stages(unset), plan_stages(labelled)
    assert all(a.hash != b.hash for a, b in zip(before, after, strict=True) if not a.skipped)


def prepare_of(outcomes: list[Any]) -> Any:
    """prepare's outcome of a local run (predict, skipped by default, comes first)."""
    return next(o for o in outcomes if o.stage == "prepare")


def test_eagle3_run_warns_when_a_cached_prepare_was_made_from_other_files(
    tmp_path: Path, verifier: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_pipeline.local.run import LocalOptions, run_local

    source = write_jsonl(tmp_path / "data.jsonl", [chat(i) for i in range(5)])
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", base_spec(verifier, source)))
    options = LocalOptions(artifacts=tmp_path / "art", until="prepare")
    first = prepare_of(run_local(manifest, options))
    assert first.status == "done" and first.result is not None
    assert getattr(first.result, "dataset_fingerprint", None)
    caplog.set_level("WARNING")
    assert prepare_of(run_local(manifest, options)).status == "cached"
    assert "dataset.revision" not in caplog.text
    write_jsonl(source, [chat(i) for i in range(50)])
    assert prepare_of(run_local(manifest, options)).status == "cached"
    assert "changed since prepare/" in caplog.text
    assert "Set dataset.revision to a new label" in caplog.text


# --- issue 28: one row never fails the stage, nothing is skipped silently, a broken file is one line --------

ANSWER = {"role": "assistant", "content": "fine"}
ONE_BAD_LINE = {
    "deeply nested": "[" * 100_000,
    "an id of 5,001 digits": '{"id": ' + "9" * 5001 + ', "messages": []}',
    "a lone surrogate in a turn": json.dumps({"messages": [{"role": "user", "content": "\ud800"}, ANSWER]}),
    "a lone surrogate in the id": json.dumps(
        {"id": "r\ud800", "messages": [{"role": "user", "content": "q"}, ANSWER]}
    ),
}


@pytest.mark.parametrize("case", sorted(ONE_BAD_LINE))
def test_one_row_that_cannot_be_read_is_a_counted_skip_not_a_failed_stage(
    tmp_path: Path, verifier: Path, case: str
) -> None:
    rows: list[Any] = [chat(i) for i in range(20)]
    rows.insert(7, ONE_BAD_LINE[case])
    code, out = prepare(tmp_path, verifier, rows)
    assert code == 0
    result = result_of(out)
    assert result["samples"] == 20 and result["skippedTotal"] == 1, result["skipped"]
    [(reason, [example])] = result["skippedExamples"].items()
    assert reason in ("malformed", "encoding") and example.split(":", 1)[0] in ("8", "r\\ud800"), example
    written = (out / "conversations.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(written) == 20  # the skipped row is not among them, and the file is valid UTF-8


def test_every_file_of_a_dataset_directory_is_read_or_named(
    tmp_path: Path, verifier: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "d"
    (d / "more").mkdir(parents=True)
    (tmp_path / "store").mkdir()
    write_jsonl(d / "a.jsonl", [chat(i) for i in range(5)])
    write_jsonl(d / "b.ndjson", [chat(i) for i in range(5, 10)])
    write_jsonl(d / "C.JSONL", [chat(i) for i in range(10, 15)])
    (d / ".shelf").mkdir()
    write_jsonl(d / ".shelf" / "x.jsonl", [chat(i) for i in range(15, 20)])
    (d / "linked").symlink_to(d / ".shelf")  # a link that stays inside the dataset directory is followed
    (d / "README.md").write_text("# my data\n")
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, d))
    with caplog.at_level("WARNING"):
        code = run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", [])
    assert code == 0
    result = result_of(tmp_path / "art" / "prepare" / "h")
    assert result["samples"] == 20 and result["skippedTotal"] == 0
    [line] = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert "2 not read: 'README.md' (not a .jsonl" in line and "'.shelf/' (hidden)" in line, line
    (d / "escape").symlink_to(tmp_path / "store")
    code, message = failed_prepare(tmp_path / "out", spec_path)
    assert code == 1 and "escape is a link to " in message and "outside the dataset directory" in message


def failed_prepare(art: Path, spec_path: Path) -> tuple[int, str]:
    """A prepare that must fail: its exit code and its termination message's error; nothing is left."""
    import os

    termination = art.parent / f"{art.name}.termination"
    os.environ["EAGLE3_TERMINATION_LOG"] = str(termination)
    try:
        code = run_stage("prepare", str(spec_path), str(art), "prepare/h", [])
    finally:
        del os.environ["EAGLE3_TERMINATION_LOG"]
    assert not (art / "prepare" / "h").exists() and not (art / "prepare" / ".h.partial").exists()
    return code, json.loads(termination.read_text())["error"]


def broken_files(d: Path) -> dict[str, Path]:
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    body = "".join(json.dumps(chat(i)) + "\n" for i in range(40)).encode()
    d.mkdir(parents=True)
    files = {
        "truncated gzip": d / "t.jsonl.gz",
        "not gzip": d / "n.jsonl.gz",
        "corrupt parquet": d / "c.parquet",
    }
    files["truncated gzip"].write_bytes(gzip.compress(body)[:-40])
    files["not gzip"].write_bytes(body)
    pq.write_table(pa.Table.from_pylist([chat(i) for i in range(10)]), files["corrupt parquet"])
    files["corrupt parquet"].write_bytes(files["corrupt parquet"].read_bytes()[:200])
    return files


@pytest.mark.parametrize("case", ["truncated gzip", "not gzip", "corrupt parquet", "one bad part of four"])
def test_a_file_that_cannot_be_read_is_one_line_naming_it_and_leaves_nothing(
    tmp_path: Path, verifier: Path, case: str
) -> None:
    if case == "one bad part of four":
        source = tmp_path / "parts"
        source.mkdir()
        for part in range(3):
            write_jsonl(source / f"part-{part}.jsonl", [chat(part * 10 + i) for i in range(10)])
        bad = broken_files(tmp_path / "b")["truncated gzip"].rename(source / "part-3.jsonl.gz")
    else:
        source = bad = broken_files(tmp_path / "b")[case]
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source))
    code, message = failed_prepare(tmp_path / "art", spec_path)
    assert code == 1 and str(bad) in message and "cannot read the file" in message, message
    assert "retry" not in message.replace("a retry of the same file fails the same way", ""), message
    assert "\n" not in message and "Traceback" not in message


def test_a_json_document_that_is_not_rows_is_refused_once(tmp_path: Path, verifier: Path) -> None:
    source = tmp_path / "wrapped.json"
    source.write_text(json.dumps({"data": [chat(i) for i in range(100)], "version": 2}, indent=2))
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source))
    code, message = failed_prepare(tmp_path / "art", spec_path)
    assert code == 1 and "neither a list of rows nor JSON Lines" in message, message
    assert (
        "keys ['data', 'version']" in message and "jq -c '.data[]'" in message and "malformed" not in message
    )


# --- function calling: tool calls and tool turns ------------------------------------------------------------


@pytest.fixture(scope="module")
def tool_verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A verifier whose chat template renders tools, tool calls and tool turns (Hermes/Qwen2.5-style)."""
    return save_verifier(tmp_path_factory.mktemp("tool-verifier"), template=TOOL_TEMPLATES["hermes"])


def prepare_calls(tmp_path: Path, verifier: Path, rows: list[Any]) -> tuple[int, Path]:
    """prepare with room for the tool schemas: 1024 tokens a sample (the tiny vocabulary spells them out)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = base_spec(verifier, write_jsonl(tmp_path / "data.jsonl", rows), maxSequenceLength=1024)
    spec["training"]["sequenceLength"] = spec["extraction"]["tokenBudget"] = 1024
    spec_path = write_manifest(tmp_path / "run.yaml", spec)
    code = run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", [])
    return code, tmp_path / "art" / "prepare" / "h"


def loss_over(tokenizer: Any, ids: list[int], mask: list[int], part: str) -> list[int]:
    """The mask of every token that overlaps an occurrence of `part` in the sample's text."""
    pieces = [tokenizer.decode([i]) for i in ids]
    ends = list(itertools.accumulate(len(p) for p in pieces))
    text = "".join(pieces)
    found = [(at, at + len(part)) for at in range(len(text)) if text.startswith(part, at)]
    assert found, f"{part!r} is not in the sample"
    return [
        m
        for end, p, m in zip(ends, pieces, mask, strict=True)
        if any(end - len(p) < e and end > s for s, e in found)
    ]


def test_a_function_calling_dataset_prepares_with_its_tool_turns_out_of_the_loss(
    tmp_path: Path, tool_verifier: Path
) -> None:
    """Rows with tool calls or tool turns were skipped as malformed, so a function-calling dataset failed
    prepare. Now tool turns and schemas are context, the assistant's text and calls are trained, and rows
    whose tool fields are broken are still refused, saying which field."""
    import datasets
    from transformers import AutoTokenizer

    broken = [row for row, _ in MALFORMED[:3]]
    rows = [*function_calling_rows(4), *[chat(i) for i in range(4)], *broken]
    code, out = prepare_calls(tmp_path, tool_verifier, rows)
    assert code == 0
    result = result_of(out)
    assert result["kept"] == {"chat": 4, "tool_calls": 16} and result["samples"] == 20
    assert result["skipped"] == {"malformed": 3}
    assert "turn 1.tool_calls is dict, expected a list" in result["skippedExamples"]["malformed"][0]

    tokenizer = AutoTokenizer.from_pretrained(tool_verifier)
    conversations = {
        c["id"]: c for c in map(json.loads, (out / "conversations.jsonl").read_text().splitlines())
    }
    for sample in datasets.load_from_disk(str(out / "data")).with_format(None):
        ids, mask = sample["input_ids"], sample["loss_mask"]
        conv = conversations[sample["id"]]
        trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        for message in conv["messages"]:
            if message["role"] == "tool":  # no token of a tool's answer is in the loss
                assert not any(loss_over(tokenizer, ids, mask, message["content"])), sample["id"]
            elif message["role"] == "assistant":  # the assistant's text and each call's arguments are
                assert message["content"] in trained, sample["id"]
                for call in message.get("tool_calls", []):
                    assert json.dumps(call["function"]["arguments"]) in trained, sample["id"]
        if "tools" in conv:  # the tool schemas are rendered, as context
            assert not any(loss_over(tokenizer, ids, mask, "the weather in a city"))
    assert conversations["fc0"]["tools"] == TOOLS and conversations["sg0"]["messages"][2]["role"] == "tool"


def test_tool_calls_a_template_cannot_render_keep_their_rows_text_and_are_counted(
    tmp_path: Path, verifier: Path
) -> None:
    """A verifier whose template has no tool support: rows keep their assistant text; a row that only calls
    tools has nothing to train and is skipped by its own reason."""
    rows = [*function_calling_rows(2), *[calls_only_row(i) for i in range(2)], *[chat(i) for i in range(4)]]
    code, out = prepare_calls(tmp_path, verifier, rows)
    assert code == 0
    result = result_of(out)
    assert result["kept"] == {"chat": 4, "tool_calls_untrained": 8}
    assert result["skipped"] == {"tool_calls_untrained": 2}
    assert "does not render the calls" in result["skippedExamples"]["tool_calls_untrained"][0]
