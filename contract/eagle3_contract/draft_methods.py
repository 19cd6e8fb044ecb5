"""What each draft method (`spec.draft.method`) needs, in one row: what speculators trains and how vLLM
serves it. The train stage and the vLLM command of every stage and of the serving
Deployment read it here; the spec's rules bound P-EAGLE's tokens a step by PARALLEL_DEPTHS and DFlash's by
its block size (DFLASH_BLOCK_SIZE by default).

- eagle3: speculators' `eagle3` draft; vLLM's `eagle3` method, one draft forward per proposed token.
- peagle: speculators' `peagle` draft (P-EAGLE: the draft learns to propose several tokens in one forward,
  from mask tokens at the positions it has not seen); vLLM 0.32 serves it as `eagle3` with
  `parallel_drafting` (it reads the checkpoint's `speculators_model_type` and loads its P-EAGLE layers). It
  trains `PARALLEL_DEPTHS` positions, speculators' default, so it proposes at most that many a step.
- dflash: speculators' `dflash` draft (DFlash: a block diffusion draft; from an anchor token and the
  verifier's hidden states it fills the block's draft.blockSize - 1 masked positions in one forward, its
  layers attending within the block); vLLM 0.32's `dflash` method (parallel drafting is implied). It reads
  the same aux hidden states as EAGLE-3 (its `fc` over the extracted layers) and proposes at most
  blockSize - 1 tokens a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.api.rules import DFLASH_BLOCK_SIZE as DFLASH_BLOCK_SIZE
from eagle3_contract.api.rules import PARALLEL_DEPTHS as PARALLEL_DEPTHS
from eagle3_contract.api.rules import dflash_block_size as dflash_block_size
from eagle3_contract.api.spec import DraftMethod


@dataclass(frozen=True)
class MethodRow:
    """One method: speculators' draft type, vLLM's speculative method and its options, and the fields of the
    draft's config.json that vLLM 0.32 reads when it converts the checkpoint, each with a default of its own
    where the field is absent (`vllm/transformers_utils/configs/speculators/algos.py`): a checkpoint must
    state every one, or vLLM loads another draft than was trained (speculators #1065, vLLM #54526: norm
    fields dropped and vLLM's defaults taken). tests/pipeline/test_draft_fields.py checks the list against
    vLLM's own converter."""

    method: DraftMethod
    speculators_type: str
    vllm_method: str
    vllm_options: dict[str, Any] = field(default_factory=dict)
    vllm_reads: tuple[str, ...] = ()

    def speculative_config(self, draft: str, num_speculative_tokens: int) -> dict[str, Any]:
        """vLLM's `--speculative-config` for a trained draft in directory `draft`."""
        return {
            "method": self.vllm_method,
            "model": draft,
            "num_speculative_tokens": num_speculative_tokens,
            **self.vllm_options,
        }


METHODS: dict[DraftMethod, MethodRow] = {
    DraftMethod.EAGLE3: MethodRow(
        DraftMethod.EAGLE3,
        "eagle3",
        "eagle3",
        vllm_reads=(
            "draft_vocab_size",
            "norm_before_residual",
            "norm_before_fc",
            "fc_norm",
            "norm_output",
            "eagle_aux_hidden_state_layer_ids",
        ),
    ),
    DraftMethod.PEAGLE: MethodRow(
        DraftMethod.PEAGLE,
        "peagle",
        "eagle3",
        {"parallel_drafting": True},
        vllm_reads=(
            "draft_vocab_size",
            "norm_before_residual",
            "norm_before_fc",
            "mask_token_id",
            "eagle_aux_hidden_state_layer_ids",
        ),
    ),
    DraftMethod.DFLASH: MethodRow(
        DraftMethod.DFLASH,
        "dflash",
        "dflash",
        vllm_reads=(
            "draft_vocab_size",
            "aux_hidden_state_layer_ids",
            "mask_token_id",
            "sample_from_anchor",
            "sliding_window_non_causal",
        ),
    ),
}


def method_row(method: DraftMethod | str) -> MethodRow:
    return METHODS[DraftMethod(method)]


def method_of_checkpoint(config: dict[str, Any]) -> DraftMethod | None:
    """The method of a draft checkpoint's config.json (its `speculators_model_type`), None if no row's."""
    kind = config.get("speculators_model_type")
    return next((row.method for row in METHODS.values() if row.speculators_type == kind), None)
