"""Property: prepare's reading, normalising and masking lose nothing, whatever mixture of rows it is fed.

Random files of valid rows (OpenAI messages or ShareGPT, roles in any order, huge and unicode text, BOMs)
mixed with malformed and adversarial ones (not JSON, wrong types, missing fields, unknown roles, empty
turns, no answer, invalid UTF-8): prepare never crashes, keeps exactly the valid rows, and counts a skip for
every other row (issue 13).
"""

from __future__ import annotations

import json
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
    """A row prepare must keep: at least one assistant turn and one non-empty turn of each role used."""
    roles = draw(st.lists(st.sampled_from(ROLES), min_size=0, max_size=5))
    roles.insert(draw(st.integers(0, len(roles))), "assistant")
    turns = [(role, draw(texts)) for role in roles]
    if draw(st.booleans()):
        row: dict[str, Any] = {"messages": [{"role": r, "content": t} for r, t in turns]}
    else:
        row = {"conversations": [{"from": SHAREGPT[r], "value": t} for r, t in turns]}
    line = json.dumps(row, ensure_ascii=draw(st.booleans())).encode()
    return (BOM if draw(st.booleans()) else b"") + line


def _turns(messages: list[Any]) -> bytes:
    return json.dumps({"messages": messages}).encode()


ANSWER = {"role": "assistant", "content": "fine"}
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
