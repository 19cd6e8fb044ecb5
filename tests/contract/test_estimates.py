"""estimates.py: tokens, hidden-state bytes in either extraction mode, GPUs per stage, each with its basis."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_contract.api.status import Eagle3RunStatus, RunPlan, StagePhase, StageStatus
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.estimates import (
    TokenCount,
    VerifierShape,
    bytes_per_token,
    estimates_from_stages,
    human_bytes,
    known_from_results,
    run_estimates,
    shape_from_config,
    stored_layers,
    upper_bound,
)
from eagle3_contract.results import GenerateResult, PrepareResult
from tests.harness.results import fake_result
from tests.tiny_spec import tiny
from tests.unit.builders.builder_cases import KIMI_SPEC

KIMI = VerifierShape(hidden_size=7168, num_hidden_layers=61, basis="from a test")
KIMI_TOKENS = TokenCount(1_500_000_000, "exact: a test")


def kimi(**sections: Any) -> Any:
    doc = {**KIMI_SPEC, "regeneration": {"enabled": False}}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    return parse_spec(doc)


def stages_of(estimates: Any) -> dict[str, Any]:
    return {s.stage: s for s in estimates.stages}


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_032_000, "1.0 MB"), (86_028_000_000_000, "86.0 TB")],
)
def test_human_bytes_are_decimal(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_kimi_offline_bf16_stores_86_tb_and_fp8_43_tb() -> None:
    """4 layers (3 default auxiliary + the last) x 7168 x 2 bytes + the int64 token id, x 1.5e9 tokens."""
    bf16 = run_estimates(kimi(), KIMI, KIMI_TOKENS).hidden_states
    assert (bf16.layers, bf16.bytes_per_token) == (4, 4 * 7168 * 2 + 8)
    assert bf16.offline.stored_bytes == 57_352 * 1_500_000_000
    assert bf16.offline.stored == "86.0 TB"
    fp8 = run_estimates(kimi(extraction={"dtype": "fp8"}), KIMI, KIMI_TOKENS).hidden_states
    assert fp8.bytes_per_token == 4 * 7168 + 8 + 4  # one byte a value, the token id, a float32 scale
    assert fp8.offline.stored == "43.0 TB"


def test_online_moves_the_offline_bytes_every_epoch_and_stores_none_unless_kept() -> None:
    spec = kimi(extraction={"mode": "online", "servers": 2}, training={"epochs": 5})
    hs = run_estimates(spec, KIMI, KIMI_TOKENS).hidden_states
    assert hs.mode == "online"
    assert hs.offline.stored_bytes is not None and hs.online.moved_bytes == 5 * hs.offline.stored_bytes
    assert (hs.online.stored_bytes, hs.online.moved) == (0, "430.1 TB")
    kept = run_estimates(kimi(extraction={"mode": "online", "keep": True}), KIMI, KIMI_TOKENS).hidden_states
    assert kept.online.stored_bytes == kept.online.moved_bytes == kept.offline.stored_bytes
    assert "extraction.keep" in kept.online.note


def test_gpus_per_stage_count_pods_producers_and_skips() -> None:
    spec = kimi(extraction={"mode": "online", "servers": 3}, training={"gpus": 8, "nodes": 4})
    stages = stages_of(run_estimates(spec, KIMI, KIMI_TOKENS))
    assert (stages["train"].gpus, stages["train"].pods, stages["train"].producer_gpus) == (32, 4, 24)
    assert (stages["extract"].gpus, stages["extract"].pods) == (0, 0)
    assert stages["extract"].skipped and "online" in stages["extract"].skipped
    assert (stages["generate"].gpus, stages["generate"].skipped is not None) == (0, True)
    assert (stages["evaluate"].gpus, stages["prepare"].gpus, stages["prepare"].pods) == (8, 0, 1)
    offline = stages_of(run_estimates(kimi(), KIMI, KIMI_TOKENS))
    assert (offline["extract"].gpus, offline["train"].producer_gpus) == (8, None)


def test_serving_and_its_canary_are_counted_and_the_peak_is_the_most_held_at_once() -> None:
    """Issue 29: the Kimi example's 2 x 8 serving GPUs were missing from the estimates."""
    spec = kimi(serving={"replicas": 2})
    estimates = run_estimates(spec, KIMI, KIMI_TOKENS)
    assert estimates.serving is not None
    assert (estimates.serving.replicas, estimates.serving.gpus, estimates.serving.canary_gpus) == (
        2,
        16,
        None,
    )
    assert estimates.peak_gpus == 16  # offline: every stage holds at most one 8-GPU node, serving two
    canary = run_estimates(kimi(serving={"replicas": 3, "canary": {"replicas": 2}}), KIMI, KIMI_TOKENS)
    assert canary.serving is not None and (canary.serving.canary_replicas, canary.serving.canary_gpus) == (
        2,
        16,
    )
    assert canary.peak_gpus == 24 + 16  # the Deployment and the canary beside it
    online = kimi(extraction={"mode": "online", "servers": 3}, training={"gpus": 8, "nodes": 4})
    assert run_estimates(online, KIMI, KIMI_TOKENS).peak_gpus == 32 + 24  # train with its producers
    assert run_estimates(kimi(serving={"enabled": False}), KIMI, KIMI_TOKENS).serving is None
    on_cpu = run_estimates(parse_spec(tiny()), None, None)
    assert on_cpu.serving is not None and on_cpu.serving.gpus == 0 and on_cpu.peak_gpus == 0


def test_tokens_per_stage() -> None:
    spec = kimi(training={"epochs": 5}, evaluation={"prompts": 10, "maxTokens": 100})
    stages = stages_of(run_estimates(spec, KIMI, KIMI_TOKENS))
    assert stages["prepare"].tokens == stages["extract"].tokens == 1_500_000_000
    assert stages["train"].tokens == 5 * 1_500_000_000
    assert stages["evaluate"].tokens == 2 * 10 * 100  # with and without the draft
    assert stages["export"].tokens is None and stages["generate"].tokens is None


def test_candidates_and_checkpoint_selection_count_what_they_train_and_serve() -> None:
    """Issue 31: draft.candidates trains each in turn (the train stage's tokens times their count) and
    evaluate serves each once more; checkpoint selection by acceptance serves each epoch chosen from."""
    draft = {"candidates": ["eagle3", "dflash"]}
    spec = kimi(draft=draft, training={"epochs": 5}, evaluation={"prompts": 10, "maxTokens": 100})
    stages = stages_of(run_estimates(spec, KIMI, KIMI_TOKENS))
    assert stages["train"].tokens == 2 * 5 * 1_500_000_000
    assert (
        stages["train"].basis is not None and "x 2 draft.candidates (eagle3, dflash)" in stages["train"].basis
    )
    # without and with the draft, then the bake-off: 3 servers (eagle3, dflash, none) x up to 12 rounds
    assert stages["evaluate"].tokens == (2 * 10 + 3 * 12 * 10) * 100
    chosen = kimi(training={"epochs": 5, "checkpointSelection": "acceptance"}, evaluation={"prompts": 10})
    assert stages_of(run_estimates(chosen, KIMI, KIMI_TOKENS))["evaluate"].tokens == (2 + 3) * 10 * 128


def test_before_prepare_the_tokens_are_an_upper_bound_or_unknown() -> None:
    unknown = run_estimates(kimi())
    assert unknown.tokens is None and "maxSamples is not set" in unknown.tokens_basis
    assert unknown.hidden_states.offline.stored_bytes is None
    assert "not known until prepare" in unknown.hidden_states.basis
    bounded = kimi(dataset={"maxSamples": 1000})
    assert upper_bound(bounded) == TokenCount(
        1000 * 4096, "upper bound from dataset.maxSamples x maxSequenceLength (1000 x 4096)"
    )
    estimates = run_estimates(bounded, KIMI)
    assert estimates.tokens == 4_096_000 and estimates.tokens_basis.startswith("upper bound")
    assert estimates.hidden_states.offline.stored_bytes == 4_096_000 * 57_352


def test_the_tiny_run() -> None:
    """layers [1, 2, 3] and the last: 4 x 128 x 2 bytes + 8 = 1032 bytes a token."""
    spec = parse_spec(tiny())
    assert stored_layers(spec) == 4 and bytes_per_token(4, 128, "bfloat16") == 1032
    shape = shape_from_config({"hidden_size": 128, "num_hidden_layers": 4}, "from config.json")
    hs = run_estimates(spec, shape, TokenCount(20_320, "exact: from generate's result")).hidden_states
    assert (hs.offline.stored_bytes, hs.offline.stored) == (20_970_240, "21.0 MB")
    assert hs.online.moved_bytes == 6 * 20_970_240  # training.epochs 6


def test_the_shape_comes_from_a_multimodal_configs_text_config() -> None:
    config = {"model_type": "kimi_k25", "text_config": {"hidden_size": 7168, "num_hidden_layers": 61}}
    assert shape_from_config(config, "b") == VerifierShape(7168, 61, "b")
    assert shape_from_config({"model_type": "odd"}, "b") is None


def test_prepares_result_makes_the_figures_exact() -> None:
    spec = kimi()
    prepare = PrepareResult(tokens=1_500_000_000, samples=10, hidden_size=7168, num_hidden_layers=61)
    shape, tokens = known_from_results(spec, prepare, None)
    assert shape == VerifierShape(7168, 61, "from prepare's result")
    assert tokens == TokenCount(1_500_000_000, "exact: from prepare's result")


def test_with_regeneration_generate_is_exact_and_prepare_an_estimate() -> None:
    spec = parse_spec(KIMI_SPEC)  # regeneration on
    prepare = PrepareResult(tokens=900, samples=3, conversations=3)
    _, before = known_from_results(spec, prepare, None)
    assert before is not None and before.tokens == 900 and before.basis.startswith("estimated")
    _, prompts = known_from_results(spec, PrepareResult(conversations=3, samples=0), None)
    assert prompts is not None and prompts.tokens == 3 * 4096 and prompts.basis.startswith("upper bound")
    _, after = known_from_results(spec, prepare, GenerateResult(tokens=1200))
    assert after == TokenCount(1200, "exact: from generate's result")


def test_the_operator_reads_the_stage_results_in_the_status() -> None:
    spec = parse_spec(tiny(regeneration={"enabled": False}))
    result = fake_result("prepare")
    stages = {"prepare": StageStatus(phase=StagePhase.SUCCEEDED, result=result)}
    estimates = estimates_from_stages(spec, stages)
    assert estimates.tokens == result["tokens"] and estimates.tokens_basis == "exact: from prepare's result"
    assert estimates.hidden_states.bytes_per_token == 1032
    assert estimates.hidden_states.basis == "hidden size from prepare's result"
    # the status document round-trips (the CRD's schema is generated from these models)
    status = Eagle3RunStatus(plan=RunPlan(estimates=estimates))
    doc = status.model_dump(mode="json", by_alias=True)
    assert doc["plan"]["estimates"]["hiddenStates"]["offline"]["storedBytes"] == result["tokens"] * 1032
    assert Eagle3RunStatus.model_validate(doc) == status


def test_extract_measures_what_offline_stores() -> None:
    spec = parse_spec(tiny(regeneration={"enabled": False}))
    stages = {
        "prepare": StageStatus(phase=StagePhase.SUCCEEDED, result={"tokens": 100, "hiddenSize": 128}),
        "extract": StageStatus(phase=StagePhase.SUCCEEDED, result={"bytes": 123_456, "hiddenSize": 128}),
    }
    hs = estimates_from_stages(spec, stages).hidden_states
    assert hs.offline.stored_bytes == 123_456 and hs.offline.note.startswith("measured by extract")
    assert hs.online.moved_bytes == 100 * 1032 * 6
