"""The published acceptance lengths (eagle3_contract.acceptance_references): selection, clamping."""

from __future__ import annotations

import pytest

from eagle3_contract.acceptance_references import (
    REFERENCES,
    TARGET_SOURCE,
    UNKNOWN_CLASS,
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


def test_every_entry_names_its_source_and_a_plausible_length() -> None:
    for ref in REFERENCES:
        assert ref.source and ref.benchmark
        assert 1.0 < ref.acceptance_length < 8.0
        assert ref.drafting in {"chain", "tree"} and (ref.drafting == "chain" or ref.k is None)


def test_kimi_k26_gets_its_three_figures() -> None:
    found, refs = references_for("moonshotai/Kimi-K2.6")
    assert found == "Kimi-K2.6"
    assert sorted(r.acceptance_length for r in refs) == [2.30, 2.62, 3.22]


def test_an_unknown_class_gets_the_dense_chain_drafting_range_and_says_so() -> None:
    found, lengths = acceptance_lengths_for("/models/tiny-llama", 7)
    assert found == UNKNOWN_CLASS
    assert [p.acceptance_length for p in lengths] == [2.88, 5.08]  # the lowest and highest dense chain figure
    assert all(p.source.startswith("unknown verifier class") for p in lengths)


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
