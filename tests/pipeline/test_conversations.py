"""Reading chat datasets: formats, detection, and skipped rows counted by reason."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.data.conversations import RowError, detect_format, load_conversations
from eagle3_pipeline.runtime.errors import StageError
from tests.pipeline.function_calling import (
    MALFORMED,
    RESULT,
    TOOLS,
    legacy_calls_row,
    openai_calls_row,
    parallel_calls_row,
    sharegpt_calls_row,
)
from tests.pipeline.manifests import chat, write_jsonl

SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "s"},
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "a"},
    ]
}
MESSAGES = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def test_formats_are_detected_from_the_rows() -> None:
    assert detect_format(SHAREGPT) == "sharegpt"
    assert detect_format(MESSAGES) == "messages"
    assert detect_format({"prompt": "hi"}) == "prompts"
    assert detect_format({"text": "hi"}) is None


def test_sharegpt_and_messages_normalize_to_the_same_conversation(tmp_path: Path) -> None:
    a, _, fa = load_conversations(str(write_jsonl(tmp_path / "a.jsonl", [SHAREGPT])), "train", "auto")
    b, _, fb = load_conversations(str(write_jsonl(tmp_path / "b.jsonl", [MESSAGES])), "train", "auto")
    assert (fa, fb) == ("sharegpt", "messages")
    assert a[0]["messages"] == [{"role": "system", "content": "s"}, *b[0]["messages"]]


def test_prompt_rows_become_user_turns(tmp_path: Path) -> None:
    rows, skips, fmt = load_conversations(
        str(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "system": "be nice"}])), "train", "auto"
    )
    assert fmt == "prompts" and not skips.total()
    assert rows[0]["messages"] == [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
    ]


def test_reasoning_and_text_parts_are_kept(tmp_path: Path) -> None:
    row = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q1 "}, {"type": "text", "text": "q2"}]},
            {"role": "assistant", "content": "a", "reasoning": "r"},
        ]
    }
    rows, _, _ = load_conversations(str(write_jsonl(tmp_path / "r.jsonl", [row])), "train", "messages")
    assert rows[0]["messages"][0]["content"] == "q1 q2"
    assert rows[0]["messages"][1]["reasoning_content"] == "r"


def test_bad_rows_are_skipped_and_counted_by_reason(tmp_path: Path) -> None:
    rows = [
        MESSAGES,
        "{not json",
        json.dumps("a string row"),
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": []},
        {"messages": [{"role": "user", "content": "   "}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
        {"messages": [{"role": "user", "content": 5}]},
    ]
    out, skips, _ = load_conversations(str(write_jsonl(tmp_path / "bad.jsonl", rows)), "train", "messages")
    assert len(out) == 1
    assert dict(skips.counts) == {"malformed": 4, "empty": 2, "multimodal": 1}
    assert any("line 2 is not JSON" in e for e in skips.examples["malformed"])
    assert any("'wizard'" in e for e in skips.examples["malformed"])


def test_the_wrong_format_skips_every_row_saying_so(tmp_path: Path) -> None:
    out, skips, _ = load_conversations(
        str(write_jsonl(tmp_path / "s.jsonl", [SHAREGPT])), "train", "messages"
    )
    assert not out
    assert "is dataset.format right?" in skips.examples["malformed"][0]


def test_ids_come_from_the_rows_and_stay_unique(tmp_path: Path) -> None:
    rows = [{**MESSAGES, "id": "x"}, {**MESSAGES, "id": "x"}, MESSAGES]
    out, _, _ = load_conversations(str(write_jsonl(tmp_path / "i.jsonl", rows)), "train", "auto")
    assert [c["id"] for c in out] == ["x", "x#2", "3"]


def test_json_arrays_parquet_and_directories_are_read(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.json").write_text(json.dumps([chat(1), chat(2)]))
    pq.write_table(pa.Table.from_pylist([{"prompt": "p1"}, {"prompt": "p2"}]), tmp_path / "d" / "b.parquet")
    out, skips, _ = load_conversations(str(tmp_path / "d"), "train", "auto")
    assert len(out) == 4 and not skips.total(), "each row's own format applies (issue 13, item 3)"
    out, _, fmt = load_conversations(str(tmp_path / "d" / "b.parquet"), "train", "auto")
    assert fmt == "prompts" and [c["id"] for c in out] == ["0", "1"]


def test_max_samples_limits_the_rows_read(tmp_path: Path) -> None:
    out, _, _ = load_conversations(
        str(write_jsonl(tmp_path / "m.jsonl", [chat(i) for i in range(10)])), "train", "auto", 3
    )
    assert len(out) == 3


@pytest.mark.parametrize("source", ["/no/such/file.jsonl", "./missing.jsonl", "data.parquet"])
def test_a_missing_file_is_an_error_naming_it(source: str) -> None:
    with pytest.raises(StageError, match="no such file"):
        load_conversations(source, "train", "auto")


def test_a_directory_without_data_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"without data files \(a \.jsonl, \.ndjson"):
        load_conversations(str(tmp_path), "train", "auto")


# --- issue 13: bad input loses nothing ----------------------------------------------------------------------


def sharegpt_row(i: int) -> dict[str, Any]:
    return {"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}


def test_a_directory_mixing_formats_loses_no_rows(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "a.jsonl", [sharegpt_row(i) for i in range(5)])
    (tmp_path / "d" / "b.json").write_text(json.dumps([chat(i) for i in range(5)]))
    out, skips, fmt = load_conversations(str(tmp_path / "d"), "train", "auto")
    assert len(out) == 10 and not skips.total()
    assert fmt == "messages+sharegpt"


def test_hidden_files_and_directories_are_not_read(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / ".ipynb_checkpoints").mkdir(parents=True)
    (d / "sub" / ".cache").mkdir(parents=True)
    write_jsonl(d / "train.jsonl", [chat(i) for i in range(3)])
    write_jsonl(d / ".ipynb_checkpoints" / "train-checkpoint.jsonl", [chat(i) for i in range(3)])
    write_jsonl(d / "sub" / ".cache" / "x.jsonl", [chat(9)])
    write_jsonl(d / ".hidden.jsonl", [chat(8)])
    out, _, _ = load_conversations(str(d), "train", "auto")
    assert [c["id"] for c in out] == ["train.jsonl:1", "train.jsonl:2", "train.jsonl:3"]


def test_an_explicit_id_never_collides_with_a_made_unique_one(tmp_path: Path) -> None:
    rows = [{**MESSAGES, "id": i} for i in ("dup", "dup", "dup#2", "2")] + [MESSAGES]
    out, _, _ = load_conversations(str(write_jsonl(tmp_path / "i.jsonl", rows)), "train", "auto")
    ids = [c["id"] for c in out]
    assert len(set(ids)) == len(ids) == 5
    assert ids[:2] == ["dup", "dup#2"]


def test_a_byte_order_mark_is_not_part_of_the_data(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(bom + (json.dumps(MESSAGES) + "\r\n").encode() * 2)
    (tmp_path / "b.json").write_bytes(bom + json.dumps([MESSAGES, MESSAGES]).encode())
    for name in ("a.jsonl", "b.json"):
        out, skips, _ = load_conversations(str(tmp_path / name), "train", "auto")
        assert len(out) == 2 and not skips.total(), name


@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.json.gz"])
def test_gzip_files_are_read(tmp_path: Path, name: str) -> None:
    import gzip

    body = json.dumps([MESSAGES] * 3) if ".json." in name else (json.dumps(MESSAGES) + "\n") * 3
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / name).write_bytes(gzip.compress(body.encode()))
    out, skips, _ = load_conversations(str(tmp_path / "d"), "train", "auto")
    assert len(out) == 3 and not skips.total()


def test_zstd_files_are_read_or_refused_naming_the_package(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.zst"
    try:
        zstandard = importlib.import_module("zstandard")
        path.write_bytes(zstandard.ZstdCompressor().compress((json.dumps(MESSAGES) + "\n").encode()))
    except ImportError:
        path.write_bytes(b"\x28\xb5\x2f\xfd")
        with pytest.raises(StageError, match="needs the Python package 'zstandard'"):
            load_conversations(str(path), "train", "auto")
        return
    out, _, _ = load_conversations(str(path), "train", "auto")
    assert len(out) == 1


def test_text_that_is_not_utf8_is_never_replaced(tmp_path: Path) -> None:
    latin1 = json.dumps(
        {"messages": [{"role": "user", "content": "café"}, {"role": "assistant", "content": "oui"}]},
        ensure_ascii=False,
    ).encode("latin-1")
    (tmp_path / "a.jsonl").write_bytes(json.dumps(MESSAGES).encode() + b"\n" + latin1 + b"\n")
    out, skips, _ = load_conversations(str(tmp_path / "a.jsonl"), "train", "auto")
    assert len(out) == 1 and dict(skips.counts) == {"encoding": 1}
    assert "line 2 is not UTF-8 (byte 0xe9" in skips.examples["encoding"][0]
    (tmp_path / "b.json").write_bytes(b"[" + latin1 + b"]")
    with pytest.raises(StageError, match=r"b\.json: not UTF-8 text .*re-encode it as UTF-8"):
        load_conversations(str(tmp_path / "b.json"), "train", "auto")


def test_a_parquet_column_of_json_strings_is_decoded(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": "a", "messages": json.dumps(MESSAGES["messages"])},
        {"id": "b", "messages": "not json"},
        {"id": "c", "messages": json.dumps({"role": "user"})},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "j.parquet")
    out, skips, fmt = load_conversations(str(tmp_path / "j.parquet"), "train", "auto")
    assert [c["id"] for c in out] == ["a"] and fmt == "messages"
    assert out[0]["messages"] == MESSAGES["messages"]
    problems = " ".join(skips.examples["malformed"])
    assert "'messages' is a string, not a list of turns" in problems
    assert "'messages' is a JSON string of dict" in problems


@pytest.mark.parametrize("end", [b"\r", b"\r\n", b"\n"])
@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.jsonl.gz"])
def test_rows_ending_in_a_lone_cr_are_rows(tmp_path: Path, end: bytes, name: str) -> None:
    """Issue 42: a file whose lines end in CR only was read as one malformed row (20 valid rows lost)."""
    import gzip

    body = end.join(json.dumps({**MESSAGES, "id": f"r{i}"}).encode() for i in range(20)) + end
    (tmp_path / name).write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    out, skips, _ = load_conversations(str(tmp_path / name), "train", "auto")
    assert [c["id"] for c in out] == [f"r{i}" for i in range(20)] and not skips.total()


def test_rows_that_share_one_id_are_made_unique_in_linear_time() -> None:
    """Issue 42: 30,000 rows with "id": "same" took 161 s (each repeat searched id#2, id#3, ... from 2)."""
    from eagle3_pipeline.data.conversations import UniqueIds

    class Counted(set[str]):
        looks = 0

        def __contains__(self, item: object) -> bool:
            Counted.looks += 1
            return super().__contains__(item)

    ids = UniqueIds()
    ids.used = Counted()
    claimed = [ids.claim(i) for i in ["same"] * 3000 + ["same#5", "other", "same"]]
    assert claimed[:3] == ["same", "same#2", "same#3"] and claimed[3000] == "same#5#2"
    assert claimed[-1] == "same#3001" and len(set(claimed)) == len(claimed)
    assert Counted.looks <= 3 * len(claimed)  # the search from 2 for each repeat: about 4.5 million


# --- function calling: tool calls and tool turns ------------------------------------------------------------


def test_tool_calls_and_tool_turns_are_kept_in_every_layout(tmp_path: Path) -> None:
    """OpenAI tool calls (content null, arguments as JSON text or an object), tool turns, the legacy
    function_call and function turns, and ShareGPT's function_call and observation turns all normalize to
    the OpenAI form chat templates take, arguments decoded as vLLM hands them over; the row's tools too."""
    rows = [openai_calls_row(0), parallel_calls_row(0), legacy_calls_row(0), sharegpt_calls_row(0)]
    out, skips, fmt = load_conversations(str(write_jsonl(tmp_path / "fc.jsonl", rows)), "train", "auto")
    assert not skips.total() and fmt == "messages+sharegpt"
    by_id = {c["id"]: c for c in out}
    weather = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "city0"}}}
    assert by_id["fc0"]["messages"][2:4] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "w0", **weather}]},
        {"role": "tool", "content": f"{RESULT} sunny 0", "tool_call_id": "w0"},
    ]
    assert by_id["fc0"]["messages"][4]["content"] == "it is sunny in city0"
    assert by_id["fc0"]["messages"][4]["tool_calls"][0]["function"]["arguments"] == {"zone": "zone0"}
    assert [c["id"] for c in by_id["par0"]["messages"][1]["tool_calls"]] == ["a0", "b0"]
    assert by_id["leg0"]["messages"][1:3] == [
        {"role": "assistant", "content": "", "tool_calls": [weather]},
        {"role": "tool", "content": f"{RESULT} snow 0", "name": "get_weather"},
    ]
    assert by_id["sg0"]["messages"][1:3] == [
        {"role": "assistant", "content": "", "tool_calls": [weather]},
        {"role": "tool", "content": f"{RESULT} fog 0"},
    ]
    assert by_id["fc0"]["tools"] == by_id["par0"]["tools"] == by_id["sg0"]["tools"] == TOOLS
    assert "tools" not in by_id["leg0"]


def test_a_tool_turn_may_be_empty_but_no_other_turn_may() -> None:
    from eagle3_pipeline.data.conversations import normalize

    silent = {"role": "tool", "content": ""}
    assert normalize({"messages": [*openai_calls_row(0)["messages"][:3], silent]}, "messages")[-1] == silent
    with pytest.raises(RowError) as caught:
        normalize(
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}, "messages"
        )
    assert caught.value.reason == "empty"


@pytest.mark.parametrize(("row", "detail"), MALFORMED, ids=[d for _, d in MALFORMED])
def test_malformed_tool_fields_are_refused_saying_which(
    tmp_path: Path, row: dict[str, Any], detail: str
) -> None:
    out, skips, _ = load_conversations(
        str(write_jsonl(tmp_path / "m.jsonl", [row, MESSAGES])), "train", "auto"
    )
    assert len(out) == 1 and dict(skips.counts) == {"malformed": 1}
    assert detail in skips.examples["malformed"][0]
