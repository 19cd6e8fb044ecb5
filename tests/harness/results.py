"""One table of fake stage results for every test and benchmark, built from the contract's result models.

The values are shaped as the stage programs write them (eagle3_contract.results), every key a program writes
(tests/contract/test_results.py checks both), small enough for a termination message, and consistent with each
other (extract stores the tokens prepare counted, train's epochs add up, export's sha256 is the
checkpoint's). A test that needs another result for one stage derives it: `fake_result("evaluate",
acceptance_length=1.05)` (snake_case field names, as `model_copy`).
"""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.speculation import BaselineCell, SpeculationTable, SweepCell, plan_schedule
from eagle3_contract.results import (
    EvaluateResult,
    ExportResult,
    ExtractResult,
    GenerateResult,
    PredictedAcceptance,
    PredictResult,
    PrepareResult,
    SampledAcceptance,
    ServerStartSeconds,
    StageResult,
    TrainEpoch,
    TrainResult,
    VerifiedFile,
    VerifyResult,
    VocabResult,
)
from eagle3_contract.stages import Stage

TOKENS = 48_000  # the prepared dataset's tokens, whose hidden states extract stores
HIDDEN_STATE_BYTES = 3 * 128 * 2 * TOKENS  # three layers of 128 bf16 values per token
EPOCH_TOKENS = 43_200  # the training rows' tokens, once per epoch
EXPORT_SHA256 = "ab" * 32
VERIFIED_SHA256 = "ef" * 32
CHECKPOINT_BYTES = 123_456


def _epoch(epoch: int, val_loss: float, accuracy: list[float], acceptance: float) -> TrainEpoch:
    return TrainEpoch(
        epoch=epoch, train_loss=val_loss + 0.2, val_loss=val_loss, train_accuracy_by_position=accuracy,
        val_accuracy_by_position=accuracy, val_full_accuracy_by_position=accuracy,
        val_loss_by_position=[val_loss] * 3, estimated_acceptance_length=acceptance, train_steps=54,
        train_tokens=EPOCH_TOKENS, train_seconds=40.0, seconds=45.0, learning_rate={"AdamW": 0.0001},
    )  # fmt: skip


# evaluation.sweep's table (k 1, 3 at concurrency 1, 8), as evaluate writes it and export's manifest keeps it
_CELLS = [
    SweepCell(
        num_speculative_tokens=k, concurrency=c, acceptance_length=a, output_tokens_per_second=t, speedup=x
    )
    for k, c, a, t, x in (
        (1, 1, 1.5, 30.0, 1.5),
        (1, 8, 1.5, 90.0, 0.9),
        (3, 1, 1.6, 36.0, 1.8),
        (3, 8, 1.6, 80.0, 0.8),
    )
]
SPECULATION = SpeculationTable(
    cells=_CELLS,
    baselines=[BaselineCell(concurrency=1, output_tokens_per_second=20.0),
               BaselineCell(concurrency=8, output_tokens_per_second=100.0)],
    schedule=plan_schedule(_CELLS),
)  # fmt: skip


FAKE_RESULTS: dict[Stage, StageResult] = {
    Stage.PREPARE: PrepareResult(
        format="chat", conversations=243, screened={"duplicate": 2},
        generation={  # a later generation's mix (stages.prepare.generation); a first prepare writes none
            "captured": {
                "records": 12, "outsideWindow": 1, "train": 9, "validation": 1, "screened": {"duplicate": 1}
            },
            "original": {"train": 9, "validation": 1},
        },
        dataset_fingerprint="0123456789abcdef",
        hidden_size=128, num_hidden_layers=4, samples=240, train=216,
        validation=24, train_ratio=0.9,
        skipped={"too_long": 3}, skipped_total=3, skipped_examples={"too_long": ["row 7: 300 tokens > 256"]},
        kept={"chat": 230, "tool_calls": 10}, tokens=TOKENS, assistant_tokens=20_000,
        unique_assistant_tokens=700, max_seq_len=256, tokenize_seconds=1.5, tokens_per_second=32_000.0,
        seconds=3.2,
    ),
    Stage.GENERATE: GenerateResult(
        samples=240, train=216, validation=24, train_ratio=0.9, skipped={}, skipped_total=0,
        skipped_examples={}, kept={"chat": 240}, tokens=TOKENS, assistant_tokens=21_000,
        unique_assistant_tokens=720, max_seq_len=256, tokenize_seconds=1.4, rows=243, regenerated=240,
        kept_as_recorded=0, failed=3, resumed=0,
        output_tokens=9_000, tokens_per_second=450.0, generation_seconds=20.0, server_start_seconds=30.0,
        seconds=55.0,
    ),
    Stage.EXTRACT: ExtractResult(
        samples=240, tokens=TOKENS, extracted_samples=240, extracted_tokens=TOKENS, extract_seconds=12.0,
        tokens_per_second=4_000.0, bytes=HIDDEN_STATE_BYTES, bytes_per_token=768.0, layers=[1, 2, 3],
        hidden_size=128, dtype="bfloat16", transfer="file", backend="transformers", token_budget=1024,
        resumed=0, seconds=14.0,
    ),
    Stage.VOCAB: VocabResult(
        draft_vocab_size=256, target_vocab_size=1024, d2t="d2t-256.npy", t2d="t2d-256.npy",
        assistant_tokens=20_000, unique_assistant_tokens=700, coverage=0.97, unique_coverage=0.365714,
    ),
    Stage.TRAIN: TrainResult(
        epochs=[_epoch(0, 2.3, [0.3, 0.1, 0.05], 1.335), _epoch(1, 2.1, [0.4, 0.2, 0.1], 1.488)],
        best_epoch=1, best_val_loss=2.1, val_accuracy_by_position=[0.4, 0.2, 0.1],
        estimated_acceptance_length=1.488, train_tokens_per_second=1_080.0,
        checkpoint="checkpoints/checkpoint_best", metrics="metrics.jsonl", parameters=1_200_000, device="cpu",
        world_size=1, resumed_from_epoch=None, train_seconds=80.0, seconds=95.0, draft_vocab_size=256,
        aux_layers=[1, 2], ttt_steps=3, candidates=None,
        warm_start={"from": "export/0123456789ab", "start": "warm"},
    ),
    Stage.EVALUATE: EvaluateResult(
        prompts=8, prompts_requested=8, held_out_prompts=24, failed_prompts=0, num_speculative_tokens=3,
        max_tokens=64, drafts=300, draft_tokens=900, accepted_tokens=180,
        accepted_tokens_by_position=[110, 50, 20], acceptance_rate=0.2, acceptance_length=1.6,
        acceptance_by_position=[0.366667, 0.166667, 0.066667], output_tokens=480,
        output_tokens_per_second=120.0, baseline_output_tokens=480, baseline_output_tokens_per_second=100.0,
        speedup=1.2, speedup_concurrency=8, outputs_matching_baseline=8, message=None,
        mapping_consistent=True, embeddings_match_verifier=True,
        draft_checkpoint="train/0123456789ab/checkpoints/checkpoint_best",
        server_start_seconds=ServerStartSeconds(draft=30.0, baseline=25.0), seconds=70.0,
        sampled=SampledAcceptance(
            temperature=0.7, top_p=0.95, top_k=-1, seed=0, prompts=8, drafts=320, draft_tokens=960,
            accepted_tokens=128, acceptance_rate=0.133333, acceptance_length=1.4,
            acceptance_by_position=[0.25, 0.1, 0.05],
        ),
        degenerate_prompts=0, degenerate={"repetition": 0, "empty": 0}, degenerate_examples=[],
        speculation=SPECULATION, checkpoint_selection=None, categories=None, incumbent=None,
    ),
    Stage.EXPORT: ExportResult(
        sha256=EXPORT_SHA256, bytes=CHECKPOINT_BYTES, expected_bytes=120_000, ratio=1.0288,
        trainable_parameters=50_000, draft_head_parameters=10_000, mapping_bytes=3_328, source_bytes=987_654,
        reduction=8.0, dropped_tensors=["embed_tokens.weight"], dropped_files=["optimizer_state_dict.pt"],
        verifier="/models/tiny", files=["config.json", "config.py", "model.safetensors"], seconds=2.0,
        method="eagle3",
    ),
    Stage.VERIFY: VerifyResult(
        path="export/abc", sha256=VERIFIED_SHA256, bytes=CHECKPOINT_BYTES,
        files={"model.safetensors": VerifiedFile(sha256=VERIFIED_SHA256, bytes=CHECKPOINT_BYTES)},
        manifest=True, seconds=0.5, speculation=SPECULATION, method="eagle3",
    ),
    Stage.PREDICT: PredictResult(
        method="step-cost", method_note="step-cost: an untrained draft's step cost", model_class="unknown",
        num_speculative_tokens=3, max_tokens=64, concurrencies=[1, 8],
        acceptance_lengths=[
            PredictedAcceptance(acceptance_length=2.88, source="dense low", published=2.88, clamped=False),
            PredictedAcceptance(acceptance_length=4.0, source="dense high", published=5.08, clamped=True),
        ],
        tokens_per_second=[[230.4, 576.0], [320.0, 800.0]], speedup=[[2.304, 1.44], [3.2, 2.0]],
        baseline_tokens_per_second=[100.0, 400.0], draft_tokens_per_second=[80.0, 200.0],
        measured_acceptance_length=[1.0, 1.0], break_even=[1.25, 2.0], verdict="a draft pays off",
        prompts=16, prompts_source="generic chat prompts", failed_requests=0,
        server_start_seconds={"baseline": 41.0, "draft": 44.5}, message=None, seconds=120.5,
    ),
}  # fmt: skip


def fake_model(stage: Stage | str, **update: Any) -> StageResult:
    """The table's result of `stage`, with `update` (snake_case field names) applied."""
    result = FAKE_RESULTS[Stage(stage)]
    return result.model_copy(update=update) if update else result


def fake_result(stage: Stage | str, **update: Any) -> dict[str, Any]:
    """The table's result of `stage` as a program writes it (the camelCase JSON object), with `update`."""
    return fake_model(stage, **update).document()
