"""prepare on captured records (dataset.format captured): what serving.capture wrote, read back as training
conversations, screened (duplicates, degenerate answers), and a live directory held still while read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.capture.config import CaptureConfig, Exchange
from eagle3_contract.capture.records import record_of
from eagle3_contract.capture.segments import SegmentStore
from eagle3_pipeline.data import captured
from eagle3_pipeline.stage_main import run_stage
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest

pytestmark = pytest.mark.pipeline

LOOP = "the end " * 20


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_verifier(tmp_path_factory.mktemp("verifier"))


def exchange(question: str, answer: str, at: float = 1.8e9, **request: Any) -> Exchange:
    """What the middleware hands the writer for one chat completion, as vLLM answers it."""
    body = {"messages": [{"role": "user", "content": question}], **request}
    response = {
        "model": "tiny",
        "choices": [{"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "metrics": {
            "speculative_decoding": {
                "mean_acceptance_length": 2.5,
                "num_draft_tokens": 6,
                "num_accepted_draft_tokens": 3,
            }
        },
    }
    return Exchange(at, json.dumps(body).encode(), json.dumps(response).encode(), 200, False)


def write_capture(directory: Path, source: str, exchanges: list[Exchange]) -> Path:
    """One segment of `source`'s records, written by the capture package's own writer."""
    store = SegmentStore(CaptureConfig(directory=directory, source=source))
    store.start()
    lines = [json.dumps(record_of(e)).encode() + b"\n" for e in exchanges]
    return store.write(lines, exchanges[0].served_at)


def prepare(tmp_path: Path, verifier: Path, source: Path, **dataset: Any) -> tuple[int, Path]:
    spec_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source, **dataset))
    code = run_stage("prepare", str(spec_path), str(tmp_path / "art"), "prepare/h", [])
    return code, tmp_path / "art" / "prepare" / "h"


def conversations(out: Path) -> list[dict[str, Any]]:
    lines = (out / "conversations.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_captured_records_train_as_conversations_screened_by_reason(tmp_path: Path, verifier: Path) -> None:
    capture = tmp_path / "capture"
    questions = [(f"spell {w}", " ".join(w)) for w in ("cat", "dog", "bird", "fish", "lion", "bear")]
    write_capture(capture, "vllm-a", [exchange(q, a) for q, a in questions[:4]])
    # another pod: one exchange the first pod served too (a retry), and one answered with a loop
    write_capture(
        capture,
        "vllm-b",
        [exchange(*questions[0]), exchange("loop", LOOP), *[exchange(q, a) for q, a in questions[4:]]],
    )
    (capture / "vllm-b" / "19700101T000000.000000Z-1-000009.jsonl.partial").write_text('{"messages": [')

    code, out = prepare(tmp_path, verifier, capture, format="captured", validationFraction=0.0)
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["format"] == "captured"
    assert result["screened"] == {"duplicate": 1, "repetition": 1}
    assert result["skippedTotal"] == 0, "screened rows are not skips: they count apart"
    assert result["samples"] == 6
    rows = conversations(out)
    assert {row["category"] for row in rows} == {"captured"}, "evaluate reports them apart"
    by_question = {row["messages"][0]["content"]: row["messages"] for row in rows}
    assert set(by_question) == {q for q, _ in questions}
    assert by_question["spell cat"][-1] == {"role": "assistant", "content": "c a t"}
    assert not list(out.glob(f"**/{'captured.snapshot'}")), "the snapshot is not part of the output"


def test_auto_detects_records_and_keeps_the_requests_tools(tmp_path: Path, verifier: Path) -> None:
    tools = [{"type": "function", "function": {"name": "spell", "parameters": {"type": "object"}}}]
    records = [record_of(exchange(f"spell {i}", f"{i} {i + 1}", tools=tools)) for i in range(4)]
    source = write_jsonl(tmp_path / "copied.jsonl", [*records, chat(9)])  # a file copied out, one plain row
    code, out = prepare(tmp_path, verifier, source, validationFraction=0.0)
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["format"] == "captured+messages"
    rows = conversations(out)
    assert [row.get("category") for row in rows].count("captured") == 4
    assert all(row["tools"] == tools for row in rows if row.get("category") == "captured")


def test_a_segment_pruned_while_prepare_reads_is_not_lost_to_it(tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    first = write_capture(capture, "vllm-a", [exchange("a", "b")])
    second = write_capture(capture, "vllm-a", [exchange("c", "d", at=1.9e9)])
    held = captured.snapshot(capture, tmp_path / "snapshot")
    first.unlink()  # the serving pod prunes by age while the stage reads
    second.unlink()
    names = sorted(p.relative_to(held).as_posix() for p in held.rglob("*.jsonl"))
    assert names == sorted(p.relative_to(capture).as_posix() for p in (first, second))
    assert all(p.read_text().startswith('{"servedAt"') for p in held.rglob("*.jsonl"))


def test_a_record_without_its_response_is_a_skip_that_says_why(tmp_path: Path, verifier: Path) -> None:
    good = [record_of(exchange(f"q{i}", f"answer {i}")) for i in range(3)]
    broken = {"servedAt": "2027-01-01T00:00:00.000Z", "messages": [{"role": "user", "content": "q"}]}
    source = write_jsonl(tmp_path / "records.jsonl", [*good, broken])
    code, out = prepare(tmp_path, verifier, source, format="captured", validationFraction=0.0)
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["skipped"] == {"malformed": 1}
    assert "no 'response' object" in json.dumps(result["skippedExamples"])


def test_a_capture_directory_without_a_complete_segment_says_what_it_waits_for(
    tmp_path: Path, verifier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "capture"
    (capture / "vllm-a").mkdir(parents=True)
    (capture / "vllm-a" / "20270101T000000.000000Z-1-000001.jsonl.partial").write_text("{")
    code, out = prepare(tmp_path, verifier, capture, format="captured")
    assert code != 0 and not out.exists()
    assert "no complete capture segments yet" in capsys.readouterr().err


# --- a later generation's prepare: the window's records mixed with the first generation's data ----------


def test_a_generation_mixes_the_windows_records_with_the_first_generations_rows(
    tmp_path: Path, verifier: Path
) -> None:
    from datetime import UTC, datetime

    from eagle3_contract.api.manifest import load_manifest
    from eagle3_contract.api.spec import ExportedDraft
    from eagle3_contract.generation import Generation, generation_manifest, plan_generation
    from eagle3_contract.stages import Stage, plan_stages

    art = tmp_path / "art"
    source = write_jsonl(tmp_path / "data.jsonl", [chat(i) for i in range(40)])
    run_path = write_manifest(tmp_path / "run.yaml", base_spec(verifier, source, validationFraction=0.25))
    manifest = load_manifest(run_path)
    first = {p.stage: p for p in plan_stages(manifest.spec)}
    assert run_stage("prepare", str(run_path), str(art), first[Stage.PREPARE].output_dir, []) == 0
    # records served at three times: the generation's window is (t1, t3]; one repeated, one a loop
    t = [1.8e9, 1.8e9 + 60, 1.8e9 + 120]
    capture = art / "capture"
    write_capture(capture, "vllm-a", [exchange(f"old {i}", f"o {i}", at=t[0]) for i in range(3)])
    write_capture(capture, "vllm-b", [exchange(f"new {i}", f"a {i} b", at=t[1]) for i in range(20)])
    write_capture(capture, "vllm-c", [exchange("new 0", "a 0 b", at=t[2]), exchange("loop", LOOP, at=t[2])])
    write_capture(capture, "vllm-d", [exchange(f"late {i}", f"l {i}", at=t[2] + 60) for i in range(2)])
    at = [datetime.fromtimestamp(x, UTC) for x in t]
    serving = ExportedDraft(path="export/0123456789ab")
    gen = Generation(2, "/artifacts/capture", serving, after=at[0], until=at[2], original_ratio=0.5)
    gen_path = tmp_path / "generation.yaml"
    gen_path.write_text(json.dumps(generation_manifest(manifest.document, manifest.spec, gen)))
    plans = {p.stage: p for p in plan_generation(manifest.spec, gen)}
    prepare = plans[Stage.PREPARE]
    inputs = [f"{name}={path}" for name, path in prepare.inputs.items()]
    assert run_stage("prepare", str(gen_path), str(art), prepare.output_dir, inputs) == 0

    out = art / prepare.output_dir
    result = json.loads((out / "result.json").read_text())
    mix = result["generation"]
    assert mix["captured"]["records"] == 3 + 20 + 2 + 2 and mix["captured"]["outsideWindow"] == 5
    assert mix["captured"]["screened"] == {"duplicate": 1, "repetition": 1}
    assert mix["captured"]["train"] + mix["captured"]["validation"] == 20
    assert mix["original"] == {
        "train": round(0.5 * mix["captured"]["train"]),
        "validation": round(0.5 * mix["captured"]["validation"]),
    }
    rows = conversations(out)
    captured_rows = [r for r in rows if r.get("category") == "captured"]
    assert sorted(r["messages"][0]["content"] for r in captured_rows) == sorted(f"new {i}" for i in range(20))
    original = [r for r in rows if r.get("category") != "captured"]
    first_rows = {r["id"]: r for r in conversations(art / first[Stage.PREPARE].output_dir)}
    assert all(first_rows[r["id"]]["split"] == r["split"] for r in original), "each keeps its own split"
    splits = [r["split"] for r in rows]
    assert splits == sorted(splits, key=lambda s: s != "train"), "train rows first"
    val_sources = {r.get("category") == "captured" for r in rows if r["split"] == "val"}
    assert val_sources == {True, False}, "the held-out rows are of both: evaluate measures both"
    # planned again, the same window is the same stage; the run's own prepare output is untouched
    assert {p.stage: p for p in plan_generation(manifest.spec, gen)}[Stage.PREPARE] == prepare
    assert json.loads((art / first[Stage.PREPARE].output_dir / "result.json").read_text())["samples"] == 40
