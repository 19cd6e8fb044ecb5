"""The published acceptance lengths (eagle3_contract.acceptance_references): the records and their sources,
selection, clamping."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from urllib.parse import urlparse

import pytest

from eagle3_contract import acceptance_references as references_module
from eagle3_contract.acceptance_references import (
    READ_ON,
    REFERENCES,
    REFERENCES_VERSION,
    TARGET_SOURCE,
    UNKNOWN_CLASS,
    Reference,
    acceptance_lengths_for,
    clamp,
    model_class,
    references_for,
)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("/models/meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Llama-3.3-70B-Instruct", "Llama-3.3-70B"),
        ("moonshotai/Kimi-K2-Instruct", "Kimi-K2"),
        ("moonshotai/Kimi-K2.5", "Kimi-K2.5"),
        ("/models/kimi-k2.6", "Kimi-K2.6"),
        ("/models/tiny-llama", UNKNOWN_CLASS),
        ("Qwen/Qwen3-8B", UNKNOWN_CLASS),
    ],
)
def test_the_class_of_a_verifier(model: str, expected: str) -> None:
    assert model_class(model) == expected


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
BENCHMARKS = {"MT-Bench", "HumanEval", "GSM8K"}


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: f"{r.model_id}-{r.benchmark}-{r.k}")
def test_every_entry_is_a_typed_record_with_its_source(ref: Reference) -> None:
    """Each figure names the draft measured (a Hub model id), the benchmark, k and the temperature as the
    source states them, and an https URL with a date; nothing in it is free text."""
    assert HUB_ID.match(ref.model_id), ref.model_id
    assert ref.benchmark in BENCHMARKS
    assert 1.0 < ref.acceptance_length < 8.0
    assert ref.drafting in {"chain", "tree"} and (ref.drafting == "chain") == (ref.k is not None)
    assert ref.k is None or 1 <= ref.k <= 16
    assert ref.temperature is None or 0.0 <= ref.temperature <= 2.0
    url = urlparse(ref.citation.url)
    assert url.scheme == "https" and url.netloc and " " not in ref.citation.url
    assert isinstance(ref.citation.on, date) and date(2025, 1, 1) <= ref.citation.on <= READ_ON
    assert ref.citation.date_kind in {"published", "read"}
    assert ref.citation.date_kind == "published" or ref.citation.on == READ_ON
    label = ref.label
    assert ref.citation.url in label and ref.citation.on.isoformat() in label
    assert ref.model_id in label  # by the card's own URL, or named beside the page that measured it


def test_no_reference_is_described_instead_of_cited() -> None:
    """The issue's "a stronger public draft": a figure is cited by what was measured and where, never by a
    description of it."""
    text = Path(references_module.__file__).read_text().lower()
    for vague in ("stronger", "a public draft", "model card measurements", "mla draft"):
        assert vague not in text, vague
    assert REFERENCES_VERSION >= 2  # the table changed with the records: the predict stage's hash moves


def test_the_cited_drafts_and_their_figures() -> None:
    """The figures as their pages give them (docs: the sources; read on 2026-12-07 where no date is given)."""
    by_draft: dict[str, dict[str, float]] = {}
    for ref in REFERENCES:
        by_draft.setdefault(ref.model_id, {})[f"{ref.benchmark}/{ref.k}"] = ref.acceptance_length
    nebius = "nebius/EAGLE3-Llama-3.3-70B-Instruct"
    assert by_draft[nebius] == {"MT-Bench/7": 3.89, "HumanEval/7": 5.08, "GSM8K/7": 5.01}
    assert by_draft["RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3"] == {
        "MT-Bench/7": 2.88, "HumanEval/7": 3.62, "GSM8K/7": 3.29,
    }  # fmt: skip
    assert by_draft["lightseekorg/kimi-k2.5-eagle3"] == {
        "MT-Bench/3": 2.687, "GSM8K/3": 3.201, "HumanEval/3": 3.285,
    }  # fmt: skip
    assert by_draft["AQ-MedAI/Kimi-K2-Instruct-eagle3"] == {"HumanEval/3": 3.372, "GSM8K/3": 3.165}
    # RedHatAI's figures are nebius's measurements, cited to nebius's card
    redhat = [r for r in REFERENCES if r.model_id.startswith("RedHatAI/")]
    assert {r.citation.url for r in redhat} == {f"https://huggingface.co/{nebius}"}
    assert all(r.temperature == 1.0 for r in REFERENCES if r.citation.url.endswith(nebius))


def test_kimi_k26_gets_its_cited_figures() -> None:
    found, refs = references_for("moonshotai/Kimi-K2.6")
    assert found == "Kimi-K2.6"
    assert sorted((r.acceptance_length, r.model_id) for r in refs) == [
        (2.62, "nvidia/Kimi-K2.6-Eagle3"), (3.217, "AQ-MedAI/Kimi-K26-eagle3"),
    ]  # fmt: skip
    assert all(r.k == 3 for r in refs)


def test_an_unknown_class_gets_the_dense_chain_drafting_range_and_says_so() -> None:
    found, lengths = acceptance_lengths_for("/models/tiny-llama", 7)
    assert found == UNKNOWN_CLASS
    assert [p.acceptance_length for p in lengths] == [2.88, 5.08]  # the lowest and highest dense chain figure
    assert all(p.source.startswith("unknown verifier class, Llama-3.3-70B's range: ") for p in lengths)
    low, high = (p.source for p in lengths)
    assert "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3 at https://huggingface.co/nebius/" in low
    assert "https://huggingface.co/nebius/EAGLE3-Llama-3.3-70B-Instruct (read on 2026-12-07)" in high


def test_lengths_above_k_plus_one_are_clamped_and_marked() -> None:
    _, lengths = acceptance_lengths_for("meta-llama/Llama-3.1-8B-Instruct", 3, target=2.2)
    values = [p.acceptance_length for p in lengths]
    assert values == sorted(values) and max(values) == 4.0
    clamped = [p for p in lengths if p.clamped]
    # the paper's tree figures and the k=5/7 chain figures above 4
    assert {p.published for p in clamped} == {6.13, 6.74, 6.23, 4.32, 4.91}
    assert all("clamped to k+1=4" in p.source for p in clamped)
    assert not any(p.clamped for p in lengths if p.published in {2.90, 3.34, 3.52, 3.86})
    target = [p for p in lengths if p.source == TARGET_SOURCE]
    assert len(target) == 1 and target[0].acceptance_length == 2.2 and target[0].published is None


def test_a_target_above_k_plus_one_is_clamped_too() -> None:
    _, lengths = acceptance_lengths_for("/models/x", 1, target=5.0)
    target = next(p for p in lengths if p.source.startswith(TARGET_SOURCE))
    assert target.acceptance_length == 2.0 and target.clamped and "5.0 asked" in target.source
    assert clamp(0.5, 3) == (1.0, True) and clamp(2.5, 3) == (2.5, False)
