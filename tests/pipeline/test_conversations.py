"""Reading chat datasets: formats, detection, and skipped rows counted by reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_pipeline.conversations import detect_format, load_conversations
from eagle3_pipeline.errors import StageError
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
    assert len(out) == 2 and skips.counts["malformed"] == 2, "the format detected first applies to all rows"
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
    with pytest.raises(StageError, match=r"without \.jsonl"):
        load_conversations(str(tmp_path), "train", "auto")
