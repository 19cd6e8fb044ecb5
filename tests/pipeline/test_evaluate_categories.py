"""Acceptance per category: where a prompt's category comes from, which are reported, the rows summed up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.categories import MAX_CATEGORIES, OTHER_CATEGORY, CategoryFigures
from eagle3_pipeline.data.conversations import Skips, category_of, conversations_of
from eagle3_pipeline.data.dataset_files import read_rows
from eagle3_pipeline.data.prepared import read_conversations
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import Measurement
from eagle3_pipeline.serving.spec_metrics import SpecDecodeCounters
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.evaluate.categories import category_rows, plan_groups, reported_categories
from eagle3_pipeline.stages.evaluate.prompts import held_out_prompts
from eagle3_pipeline.tiny.corpus import categorized_sample, sample
from eagle3_pipeline.tiny.tasks import AGAIN, TASKS, task_kind
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.manifests import base_spec, chat, write_jsonl, write_manifest


def test_a_rows_category_field_is_kept() -> None:
    rows = [("1", chat(1) | {"category": " code "}), ("2", chat(2)), ("3", chat(3) | {"category": 7})]
    convs = [c for c, _ in conversations_of(rows, "auto", Skips())]
    assert [c.get("category") for c in convs] == ["code", None, None]


def test_in_a_directory_the_file_is_the_category_unless_the_row_names_one(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "code.jsonl", [chat(1), chat(2) | {"category": "math"}])
    write_jsonl(tmp_path / "sub" / "chat.ndjson", [chat(3)])
    convs = [c for c, _ in conversations_of(read_rows(str(tmp_path), "train"), "auto", Skips())]
    assert [c["category"] for c in convs] == ["code", "math", "sub/chat"]
    assert category_of("data.parquet.gz:4", {}) == "data" and category_of("12", {}) is None
    # a single file (or the Hub) names no category: its rows have one source
    single = [
        c for c, _ in conversations_of(read_rows(str(tmp_path / "code.jsonl"), "train"), "auto", Skips())
    ]
    assert [c.get("category") for c in single] == [None, "math"]


@pytest.mark.pipeline
def test_prepare_keeps_the_category_for_evaluate(tmp_path: Path) -> None:
    verifier = save_verifier(tmp_path / "verifier")
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "a.jsonl", [chat(i) for i in range(10)])
    write_jsonl(tmp_path / "d" / "b.jsonl", [chat(i) | {"category": "c"} for i in range(10, 20)])
    spec = base_spec(verifier, tmp_path / "d", validationFraction=0.5)
    assert run_stage("prepare", str(write_manifest(tmp_path / "run.yaml", spec)), str(tmp_path / "art"),
                     "prepare/h", []) == 0  # fmt: skip
    path = tmp_path / "art" / "prepare" / "h" / "conversations.jsonl"
    by_id = {c["id"]: c["category"] for c in read_conversations(path)}
    assert set(by_id.values()) == {"a", "c"}
    held = held_out_prompts(path, 100)
    assert held.categories == [by_id[i] for i in held.ids] and len(set(held.categories)) == 2


def test_reported_categories_are_the_named_ones_and_other() -> None:
    found = ["code", "math", None, "chat", "code"]
    assert reported_categories(found, ["code", "math"]) == [
        "code",
        "math",
        OTHER_CATEGORY,
        OTHER_CATEGORY,
        "code",
    ]
    assert reported_categories(found, None) == ["code", "math", OTHER_CATEGORY, "chat", "code"]


def test_without_evaluation_categories_at_most_the_bound_are_reported() -> None:
    # 20 categories, the first ones with more prompts: the largest MAX_CATEGORIES - 1 are kept, the rest other
    found = [f"c{i:02d}" for i in range(20) for _ in range(30 - i)]
    reported = reported_categories(found, None)
    assert len(set(reported)) == MAX_CATEGORIES
    assert {f"c{i:02d}" for i in range(MAX_CATEGORIES - 1)} | {OTHER_CATEGORY} == set(reported)
    exactly = [f"c{i:02d}" for i in range(MAX_CATEGORIES)]
    assert reported_categories(exactly, None) == exactly  # at the bound: every one of them


def test_groups_are_the_kept_prompts_by_category_other_last() -> None:
    categories = ["math", OTHER_CATEGORY, "code", "math", "code"]
    assert plan_groups(categories, [0, 1, 2, 3, 4], None) == {
        "code": [2, 4], "math": [0, 3], OTHER_CATEGORY: [1],
    }  # fmt: skip
    assert list(plan_groups(categories, [0, 1, 2, 4], ["math", "code"])) == ["math", "code", OTHER_CATEGORY]
    # one category among the kept prompts (the degenerate ones screened out): nothing to tell apart
    assert plan_groups(categories, [0, 3], None) == {}


def run(tokens: int, seconds: float, drafts: float | None = None, accepted: float = 0.0) -> Measurement:
    counters = None
    if drafts is not None:
        counters = SpecDecodeCounters(
            drafts=drafts, draft_tokens=3 * drafts, accepted=accepted,
            accepted_per_position=(accepted, 0.0, 0.0), generation_tokens=tokens,
        )  # fmt: skip
    return Measurement(outputs=[], output_tokens=tokens, seconds=seconds, counters=counters)


def test_category_rows_hold_each_runs_acceptance_and_speedup() -> None:
    draft = {"code": run(120, 1.0, drafts=40, accepted=80), "chat": run(60, 1.0, drafts=50, accepted=10)}
    baseline = {"code": run(120, 2.0), "chat": run(60, 1.5)}
    rows = category_rows({"code": 9, "chat": 8}, draft, baseline, k=3)
    assert rows is not None
    code, chat_ = (CategoryFigures.model_validate(r) for r in rows)
    assert code.category == "code" and code.prompts == 9 and code.drafts == 40 and code.accepted_tokens == 80
    assert code.acceptance_length == 3.0 and code.acceptance_rate == pytest.approx(80 / 120)
    assert code.output_tokens_per_second == 120.0 and code.speedup == 2.0
    assert chat_.acceptance_length == 1.2 and chat_.speedup == 1.5
    # the summed counters are what one run over every category would give (drafts and accepted tokens add)
    assert sum(r["drafts"] for r in rows) == 90 and sum(r["acceptedTokens"] for r in rows) == 90
    assert code.line() == "code 3.00 (0.67, 2.00x, 9 prompts)"
    # a run of a few short answers times request overheads, not decoding: no speedup is reported for it
    few = category_rows({"code": 3, "chat": 2}, draft, baseline, k=3)
    assert few is not None and [r["speedup"] for r in few] == [None, None]
    assert [r["acceptanceLength"] for r in few] == [3.0, 1.2]  # the acceptance is reported all the same


def test_a_category_without_drafts_or_baseline_has_null_figures() -> None:
    rows = category_rows({"a": 1, "b": 1}, {"a": run(1, 1.0, drafts=0), "b": run(5, 1.0, drafts=2)}, {}, k=3)
    assert rows is not None
    assert rows[0]["acceptanceLength"] is None and rows[0]["drafts"] == 0
    assert rows[1]["speedup"] is None  # the verifier alone was not measured
    assert category_rows({"a": 1}, {}, {}, k=3) is None


def test_contradictory_counters_of_a_category_fail_the_stage() -> None:
    bad = run(10, 1.0, drafts=2, accepted=100)  # more accepted than proposed
    with pytest.raises(StageError, match="category a's run"):
        category_rows({"a": 1}, {"a": bad}, {}, k=3)


def test_the_tiny_datasets_categories_are_its_task_kinds_and_its_conversations_unchanged() -> None:
    rows = categorized_sample(2, 200)
    assert [messages for messages, _ in rows] == sample(2, 200)  # the verifier's pretraining data is the same
    kinds = {task_kind(task) for task, _ in TASKS}
    assert {kind for _, kind in rows} == kinds and AGAIN not in kinds
    assert len(kinds) <= MAX_CATEGORIES


def test_the_tiny_datasets_files_carry_the_category(tmp_path: Path) -> None:
    from eagle3_pipeline.tiny import CHAT_FILE, PROMPTS_FILE, SHAREGPT_FILE
    from eagle3_pipeline.tiny.build import BuildParams, write_datasets

    write_datasets(tmp_path, BuildParams(dataset_rows=20))
    for name in (CHAT_FILE, SHAREGPT_FILE, PROMPTS_FILE):
        rows: list[dict[str, Any]] = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert [r["category"] for r in rows] == [kind for _, kind in categorized_sample(2, 20)], name
