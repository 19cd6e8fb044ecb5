"""Property: prepare's reading, normalising and masking lose nothing, whatever mixture of rows it is fed.

Random files of valid rows (OpenAI messages or ShareGPT, roles in any order, tool calls and tool turns, huge
and unicode text, BOMs) mixed with malformed and adversarial ones (not JSON, wrong types, missing fields,
unknown roles, empty turns, no answer, invalid UTF-8, nesting deeper than the parser follows, integers
longer than Python converts, lone surrogates in an id or a turn, tool fields of the wrong type): prepare
never crashes, keeps exactly the valid rows, and counts a skip for every other row (issues 13 and 28).

Random dataset directories (files of any extension and case, hidden ones, links inside the directory and out
of it, truncated and corrupt compressed files): every data file is read, every other entry is named in one
warning line with its rule, and a file that cannot be read or a link out fails with a message naming it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_contract.params import VerifierRef
from eagle3_pipeline.data.conversations import load_conversations
from eagle3_pipeline.data.masking import ChatTemplate
from eagle3_pipeline.data.prepared import Tokenizing, tokenize_all
from eagle3_pipeline.runtime.errors import StageError
from tests.pipeline.chat_templates import TEMPLATES, make_tokenizer

pytestmark = pytest.mark.pipeline

BOM = b"\xef\xbb\xbf"
ROLES = ("system", "user", "assistant")
SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}

# Text a turn may hold: any unicode but surrogates (which UTF-8 cannot encode), sometimes huge.
words = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40).filter(str.strip)
texts = st.one_of(words, words.map(lambda w: (w + " ") * 500))


@st.composite
def valid_row(draw: st.DrawFn) -> bytes:
    """A row prepare must keep: at least one assistant turn with text, one non-empty turn of each role used,
    and maybe tool calls with their answers (the template does not render the calls: they train nothing)."""
    roles = draw(st.lists(st.sampled_from((*ROLES, "call")), min_size=0, max_size=5))
    roles.insert(draw(st.integers(0, len(roles))), "assistant")
    turns = [(role, draw(texts)) for role in roles]
    if draw(st.booleans()):
        row: dict[str, Any] = {"messages": [m for r, t in turns for m in _openai_turns(r, t)]}
    else:
        row = {"conversations": [m for r, t in turns for m in _sharegpt_turns(r, t)]}
    line = json.dumps(row, ensure_ascii=draw(st.booleans())).encode()
    return (BOM if draw(st.booleans()) else b"") + line


def _openai_turns(role: str, text: str) -> list[dict[str, Any]]:
    if role != "call":
        return [{"role": role, "content": text}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": text})}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": text}]


def _sharegpt_turns(role: str, text: str) -> list[dict[str, Any]]:
    if role != "call":
        return [{"from": SHAREGPT[role], "value": text}]
    call = json.dumps({"name": "f", "arguments": {"q": text}})
    return [{"from": "function_call", "value": call}, {"from": "observation", "value": text}]


def _turns(messages: list[Any]) -> bytes:
    return json.dumps({"messages": messages}).encode()


ANSWER = {"role": "assistant", "content": "fine"}


def _call(function: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": function}]}


junk = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.integers()))
malformed_row = st.one_of(
    st.sampled_from([b"{broken", b"[1, 2", b"nul", b"\xff\xfe{}", b'{"messages": ["\xe9"]}']),
    junk.map(lambda v: json.dumps(v).encode()),
    words.map(lambda w: json.dumps({"text": w}).encode()),
    junk.map(lambda v: _turns([{"role": "user", "content": v}, ANSWER])),
    junk.map(lambda v: _turns([v, ANSWER])),
    junk.map(lambda v: json.dumps({"messages": v}).encode() if v is not None else b"{}"),
    words.map(lambda w: _turns([{"role": w + "?", "content": "x"}, ANSWER])),
    st.sampled_from(["", " ", "\n\t"]).map(lambda e: _turns([{"role": "user", "content": e}, ANSWER])),
    words.map(lambda w: _turns([{"role": "user", "content": w}])),  # no answer
    words.map(lambda w: _turns([{"role": "system", "content": w}])),
    st.just(_turns([])),
    words.map(lambda w: _turns([{"role": "user", "content": w}, ANSWER]).replace(b'"fine"', b'"fin\xe9"')),
    # issue 28: what used to end the stage
    st.integers(1_000, 100_000).map(lambda n: b"[" * n),
    st.integers(1_000, 50_000).map(lambda n: b'{"messages": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(4_301, 6_000).map(lambda n: b'{"id": ' + b"7" * n + b", " + _turns([ANSWER])[1:]),
    st.just(_turns([{"role": "user", "content": "\ud800 lone"}, ANSWER])),
    # tool fields that are not what OpenAI's format says
    junk.map(
        lambda v: _turns([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": v}, ANSWER])
    ),
    st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.integers())).map(
        lambda v: _turns([{"role": "user", "content": "q"}, _call({"name": "f", "arguments": v}), ANSWER])
    ),
    junk.map(lambda v: _turns([{"role": "user", "content": "q"}, _call({"name": v}), ANSWER])),
    # (a list is a list of text parts: [] is a tool's empty answer, which a tool turn may be)
    junk.filter(lambda v: not isinstance(v, list)).map(
        lambda v: _turns([{"role": "tool", "content": v}, ANSWER])
    ),
    st.just(b'{"id": "a\\udfff", ' + _turns([{"role": "user", "content": "q"}, ANSWER])[1:]),
)


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(make_tokenizer(TEMPLATES["chatml"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.booleans(), st.data()), min_size=1, max_size=12), bom=st.booleans())
def test_prepare_keeps_every_valid_row_and_counts_every_other(
    template: ChatTemplate, rows: list[tuple[bool, st.DataObject]], bom: bool
) -> None:
    lines = [data.draw(valid_row() if valid else malformed_row) for valid, data in rows]
    valid_ids = {str(i + 1) for i, (valid, _) in enumerate(rows) if valid}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        path.write_bytes((BOM if bom else b"") + b"\n".join(lines) + b"\n")
        conversations, skips, _ = load_conversations(str(path), "train", "auto")
    tokenizing = Tokenizing(VerifierRef(model="local"), max_sequence_length=10**7, loss_on_reasoning=True)
    ctx = cast(Any, SimpleNamespace(stage="prepare"))
    kept = tokenize_all(ctx, tokenizing, template, [{**c, "split": "train"} for c in conversations], skips)
    kept_ids = {conv["id"] for conv, _ in kept}
    assert kept_ids == valid_ids, skips.examples
    assert len(kept) + skips.total() == len(rows)
    assert all(sum(tok.loss_mask) > 0 for _, tok in kept)


# --- dataset directories ------------------------------------------------------------------------------------

ROW = json.dumps({"messages": [{"role": "user", "content": "q"}, ANSWER]}).encode() + b"\n"
DATA_NAMES = ("a.jsonl", "b.ndjson", "C.JSONL", "d.Json", "e.jsonl.gz", "f.NDJSON.GZ")
OTHER_NAMES = ("README.md", "notes.txt", "data.csv", "g.jsonl.bak", "h.gz")
BROKEN = ("truncated.jsonl.gz", "notgzip.jsonl.gz")


@st.composite
def dataset_tree(draw: st.DrawFn) -> list[tuple[str, str]]:
    """(relative path, kind) entries: data files, other files, hidden ones, and links inside and out."""
    entries: list[tuple[str, str]] = []
    dirs = ["", *draw(st.lists(st.sampled_from(["sub", "sub/deeper", "x"]), max_size=3, unique=True))]
    for directory in dirs:
        for name in draw(st.lists(st.sampled_from(DATA_NAMES), max_size=3, unique=True)):
            entries.append((os.path.join(directory, name), "data"))
        for name in draw(st.lists(st.sampled_from(OTHER_NAMES), max_size=2, unique=True)):
            entries.append((os.path.join(directory, name), "other"))
        if draw(st.booleans()):
            entries.append((os.path.join(directory, ".hidden.jsonl"), "hidden"))
    if draw(st.booleans()):
        entries.append(("linked", "link-inside"))
    if draw(st.integers(0, 5)) == 0:
        entries.append(("escape", "link-out"))
    if draw(st.integers(0, 5)) == 0:
        entries.append((draw(st.sampled_from(BROKEN)), "broken"))
    return entries


def build_tree(root: Path, outside: Path, entries: list[tuple[str, str]]) -> None:
    for relative, kind in entries:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind in ("data", "hidden"):
            body = ROW * 2
            path.write_bytes(gzip.compress(body) if path.name.lower().endswith(".gz") else body)
        elif kind == "other":
            path.write_bytes(ROW)
        elif kind == "link-inside":  # to a directory inside the root that is not read on its own
            (root / ".store").mkdir(exist_ok=True)
            (root / ".store" / "t.jsonl").write_bytes(ROW * 2)
            path.symlink_to(root / ".store")
        elif kind == "link-out":
            path.symlink_to(outside)
        else:
            body = gzip.compress(ROW * 50)
            path.write_bytes(body[: len(body) // 2] if path.name.startswith("truncated") else ROW)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=dataset_tree())
def test_a_dataset_directory_reads_every_data_file_and_names_every_other_entry(
    entries: list[tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    kinds = {kind for _, kind in entries}
    read = [rel for rel, kind in entries if kind == "data"] + ["linked/t.jsonl"] * ("link-inside" in kinds)
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "d", Path(tmp) / "outside"
        root.mkdir()
        outside.mkdir()
        (outside / "secret.jsonl").write_bytes(ROW)
        build_tree(root, outside, entries)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="eagle3_pipeline.data.dataset_files"):
            try:
                conversations, skips, _ = load_conversations(str(root), "train", "auto")
            except StageError as exc:
                named = [rel for rel, kind in entries if kind in ("link-out", "broken")]
                if not named:  # nothing to read: the error names what is there instead
                    assert not read and "a directory without data files" in str(exc), str(exc)
                    return
                assert any(rel in str(exc) for rel in named), str(exc)
                return
    assert not kinds & {"link-out", "broken"}, "a broken file or a link out must fail the stage"
    assert len(conversations) == 2 * len(read) and not skips.total()
    ignored = [rel for rel, kind in entries if kind in ("other", "hidden")] + [".store/"] * (
        "link-inside" in kinds
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not ignored:
        assert warnings == []
        return
    [line] = warnings
    assert f": {len(ignored)} not read: " in line, line
    assert all(repr(rel) in line for rel in ignored) or " more (" in line, line
