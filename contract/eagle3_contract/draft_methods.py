"""What each draft method (`spec.draft.method`) needs, in one row: what speculators trains and how vLLM
serves it. The train stage and the vLLM command of every stage and of the serving
Deployment read it here; the spec's rules bound P-EAGLE's tokens a step by PARALLEL_DEPTHS.

- eagle3: speculators' `eagle3` draft; vLLM's `eagle3` method, one draft forward per proposed token.
- peagle: speculators' `peagle` draft (P-EAGLE: the draft learns to propose several tokens in one forward,
  from mask tokens at the positions it has not seen); vLLM 0.32 serves it as `eagle3` with
  `parallel_drafting` (it reads the checkpoint's `speculators_model_type` and loads its P-EAGLE layers). It
  trains `PARALLEL_DEPTHS` positions, speculators' default, so it proposes at most that many a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.api.rules import PARALLEL_DEPTHS as PARALLEL_DEPTHS
from eagle3_contract.api.spec import DraftMethod


@dataclass(frozen=True)
class MethodRow:
    """One method: speculators' draft type, vLLM's speculative method and its options."""

    method: DraftMethod
    speculators_type: str
    vllm_method: str
    vllm_options: dict[str, Any] = field(default_factory=dict)

    def speculative_config(self, draft: str, num_speculative_tokens: int) -> dict[str, Any]:
        """vLLM's `--speculative-config` for a trained draft in directory `draft`."""
        return {
            "method": self.vllm_method,
            "model": draft,
            "num_speculative_tokens": num_speculative_tokens,
            **self.vllm_options,
        }


METHODS: dict[DraftMethod, MethodRow] = {
    DraftMethod.EAGLE3: MethodRow(DraftMethod.EAGLE3, "eagle3", "eagle3"),
    DraftMethod.PEAGLE: MethodRow(DraftMethod.PEAGLE, "peagle", "eagle3", {"parallel_drafting": True}),
}


def method_row(method: DraftMethod | str) -> MethodRow:
    return METHODS[DraftMethod(method)]


def method_of_checkpoint(config: dict[str, Any]) -> DraftMethod | None:
    """The method of a draft checkpoint's config.json (its `speculators_model_type`), None if no row's."""
    kind = config.get("speculators_model_type")
    return next((row.method for row in METHODS.values() if row.speculators_type == kind), None)
