"""Cross-field rules of the spec, written once: as CEL for the API server and as Python for everyone else.

The CRD carries each rule as an `x-kubernetes-validations` entry on `spec`; the pydantic model runs the Python
twin, so a local run file, the API mock and a server without CEL (Kubernetes < 1.25) reject the same specs.
Tests evaluate the CEL with a CEL library against the same generated specs and require the two to agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle3_contract.api.fields import QUALIFIED_NAME, QUALIFIED_NAME_MAX, duration_seconds

PARALLEL_DEPTHS = 8  # speculators 0.9's `num_depths` default: the positions a P-EAGLE draft is trained for
DFLASH_BLOCK_SIZE = 16  # speculators 0.9's `block_size` default: a DFlash block, its anchor included

if TYPE_CHECKING:
    from eagle3_contract.api.spec import Eagle3RunSpec


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over the whole spec. `holds` is the Python twin of the CEL expression `rule`."""

    field_path: str
    rule: str
    message: str
    holds: Callable[[Eagle3RunSpec], bool]

    def to_crd(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "message": self.message,
            "fieldPath": self.field_path,
            "reason": "FieldValueInvalid",
        }


def _qualified(key: str) -> bool:
    return len(key) <= QUALIFIED_NAME_MAX and re.fullmatch(QUALIFIED_NAME, key) is not None


def _methods(s: Eagle3RunSpec) -> set[str]:
    """The methods the run trains: draft.method, and draft.candidates' trained ones when set."""
    return {s.draft.method, *(c for c in s.draft.candidates or () if c not in ("ngram", "suffix"))}


def _uses(method: str) -> str:
    """CEL: the run trains `method` (draft.method or one of draft.candidates)."""
    listed = f"(has(self.draft.candidates) && '{method}' in self.draft.candidates)"
    return f"(self.draft.method == '{method}' || {listed})"


def _candidates_fit(s: Eagle3RunSpec) -> bool:
    c = s.draft.candidates
    if c is None:
        return True
    several = len([m for m in c if m not in ("ngram", "suffix")]) > 1  # train trains several methods
    return (
        _unique(c)
        and s.draft.method.value in {m.value for m in c}
        and (not several or (s.training.nodes == 1 and s.extraction.mode == "offline"))
        and s.training.checkpoint_selection == "valLoss"
    )


def _most_tokens(s: Eagle3RunSpec) -> int:
    """The largest speculation length the spec asks for: evaluation's, serving's, the sweep's."""
    sweep = s.evaluation.sweep
    ks = [s.evaluation.num_speculative_tokens, s.serving.num_speculative_tokens]
    ks += sweep.num_speculative_tokens if sweep is not None else []
    return max(ks)


def _within_depths(s: Eagle3RunSpec) -> bool:
    return _most_tokens(s) <= PARALLEL_DEPTHS


def dflash_block_size(s: Eagle3RunSpec) -> int:
    """draft.blockSize, or speculators' default."""
    return s.draft.block_size if s.draft.block_size is not None else DFLASH_BLOCK_SIZE


def _block_fits(s: Eagle3RunSpec) -> bool:
    if "dflash" not in _methods(s):
        return s.draft.block_size is None
    return _most_tokens(s) <= dflash_block_size(s) - 1


def _unique(values: Sequence[object] | None) -> bool:
    return values is None or len(set(values)) == len(values)


TOLERATION_CEL = (
    "((has(t.key) && t.key != '') || (has(t.operator) && t.operator == 'Exists'))"
    " && (!has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')"
    " && (!has(t.tolerationSeconds) || (has(t.effect) && t.effect == 'NoExecute'))"
)

# The GPU rules hold for nodePool.device gpu only: in CPU mode training.gpus is the training processes of a
# node and tensorParallelSize vLLM's CPU workers, neither bounded by gpusPerNode.
RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        ".dataset.format",
        "self.dataset.format != 'prompts' || self.regeneration.enabled",
        "dataset.format 'prompts' has no answers to train on: set regeneration.enabled to true",
        lambda s: s.dataset.format != "prompts" or s.regeneration.enabled,
    ),
    CrossFieldRule(
        ".training.gpus",
        "self.nodePool.device == 'cpu' || self.training.gpus <= self.nodePool.gpusPerNode",
        "training.gpus must be at most nodePool.gpusPerNode: it is the GPUs of one training node",
        lambda s: s.node_pool.device == "cpu" or s.training.gpus <= s.node_pool.gpus_per_node,
    ),
    CrossFieldRule(
        ".verifier.tensorParallelSize",
        "self.nodePool.device == 'cpu' || self.verifier.tensorParallelSize <= self.nodePool.gpusPerNode",
        "verifier.tensorParallelSize must be at most nodePool.gpusPerNode: the verifier runs on one node",
        lambda s: s.node_pool.device == "cpu" or s.verifier.tensor_parallel_size <= s.node_pool.gpus_per_node,
    ),
    CrossFieldRule(
        ".evaluation.numSpeculativeTokens",
        f"!{_uses('peagle')} || (self.evaluation.numSpeculativeTokens <= {PARALLEL_DEPTHS}"
        f" && self.serving.numSpeculativeTokens <= {PARALLEL_DEPTHS} && (!has(self.evaluation.sweep)"
        f" || self.evaluation.sweep.numSpeculativeTokens.all(k, k <= {PARALLEL_DEPTHS})))",
        f"draft.method peagle proposes at most {PARALLEL_DEPTHS} tokens a step (the depths it is trained "
        f"for): set evaluation.numSpeculativeTokens, serving.numSpeculativeTokens and the sweep's values to "
        f"at most {PARALLEL_DEPTHS}",
        lambda s: "peagle" not in _methods(s) or _within_depths(s),
    ),
    CrossFieldRule(
        ".draft.blockSize",
        f"!{_uses('dflash')} ? !has(self.draft.blockSize) : ((has(self.draft.blockSize)"
        f" ? self.draft.blockSize : {DFLASH_BLOCK_SIZE}) - 1 >= self.evaluation.numSpeculativeTokens"
        f" && (has(self.draft.blockSize) ? self.draft.blockSize : {DFLASH_BLOCK_SIZE}) - 1"
        " >= self.serving.numSpeculativeTokens && (!has(self.evaluation.sweep)"
        " || self.evaluation.sweep.numSpeculativeTokens.all(k, k <= (has(self.draft.blockSize)"
        f" ? self.draft.blockSize : {DFLASH_BLOCK_SIZE}) - 1)))",
        "draft.blockSize is DFlash's block, for draft.method dflash only (remove it for other methods). A "
        f"DFlash draft proposes at most blockSize - 1 tokens a step (default {DFLASH_BLOCK_SIZE} - 1): set "
        "evaluation.numSpeculativeTokens, serving.numSpeculativeTokens and the sweep's values to at most "
        "that, or raise draft.blockSize",
        _block_fits,
    ),
    CrossFieldRule(
        ".evaluation.predict",
        "(self.draft.method == 'eagle3' && !has(self.draft.candidates)) || !self.evaluation.predict",
        "evaluation.predict predicts from EAGLE-3's published acceptance and step costs: set it false for "
        "draft.method peagle or dflash, or with draft.candidates (evaluate measures the trained drafts)",
        lambda s: (s.draft.method == "eagle3" and s.draft.candidates is None) or not s.evaluation.predict,
    ),
    CrossFieldRule(
        ".draft.candidates",
        "!has(self.draft.candidates) || (self.draft.candidates.all(x, self.draft.candidates.exists_one(y, "
        "y == x)) && self.draft.method in self.draft.candidates && (self.draft.candidates.filter(x, "
        "x != 'ngram' && x != 'suffix').size() < 2 || (self.training.nodes == 1"
        " && self.extraction.mode == 'offline')) && self.training.checkpointSelection == 'valLoss')",
        "draft.candidates lists each method once, draft.method among them (its default is eagle3), and "
        "needs training.checkpointSelection valLoss (this version compares each method's best checkpoint "
        "by validation loss), and with two trained methods or more also training.nodes 1 and "
        "extraction.mode offline",
        _candidates_fit,
    ),
    CrossFieldRule(
        ".extraction.layers",
        "!has(self.extraction.layers)"
        " || self.extraction.layers.all(x, self.extraction.layers.exists_one(y, y == x))",
        "extraction.layers must not repeat a layer id",
        lambda s: _unique(s.extraction.layers),
    ),
    CrossFieldRule(
        ".training.sequenceLength",
        "self.training.sequenceLength >= self.dataset.maxSequenceLength",
        "training.sequenceLength must be at least dataset.maxSequenceLength, or samples would be cut",
        lambda s: s.training.sequence_length >= s.dataset.max_sequence_length,
    ),
    CrossFieldRule(
        ".extraction.tokenBudget",
        "self.extraction.tokenBudget >= self.dataset.maxSequenceLength",
        "extraction.tokenBudget must be at least dataset.maxSequenceLength: one sample must fit a batch",
        lambda s: s.extraction.token_budget >= s.dataset.max_sequence_length,
    ),
    CrossFieldRule(
        ".verifier.maxModelLen",
        "!has(self.verifier.maxModelLen) || self.verifier.maxModelLen >= self.dataset.maxSequenceLength",
        "verifier.maxModelLen must be at least dataset.maxSequenceLength",
        lambda s: (
            s.verifier.max_model_len is None or s.verifier.max_model_len >= s.dataset.max_sequence_length
        ),
    ),
    CrossFieldRule(
        ".extraction.transfer",
        "self.extraction.mode == 'online' || self.extraction.transfer == 'volume'",
        "extraction.transfer 'mooncake' needs extraction.mode 'online': offline hidden states are files on "
        "the artifacts volume",
        lambda s: s.extraction.mode == "online" or s.extraction.transfer == "volume",
    ),
    CrossFieldRule(
        ".extraction.keep",
        "self.extraction.mode == 'online' || !self.extraction.keep",
        "extraction.keep needs extraction.mode 'online': offline keeps every hidden state anyway",
        lambda s: s.extraction.mode == "online" or not s.extraction.keep,
    ),
    CrossFieldRule(
        ".extraction.servers",
        "self.extraction.mode == 'online' || self.extraction.servers == 1",
        "extraction.servers needs extraction.mode 'online': offline extraction is one stage Job",
        lambda s: s.extraction.mode == "online" or s.extraction.servers == 1,
    ),
    CrossFieldRule(
        ".extraction.dtype",
        "self.extraction.transfer != 'mooncake' || self.extraction.dtype != 'fp8'",
        "extraction.dtype 'fp8' is written by the volume transfer only: use bfloat16 with mooncake",
        lambda s: s.extraction.transfer != "mooncake" or s.extraction.dtype != "fp8",
    ),
    CrossFieldRule(
        ".serving.pinnedCheckpoint",
        "!has(self.serving.pinnedCheckpoint) || self.serving.enabled",
        "serving.pinnedCheckpoint needs serving.enabled: a pinned draft skips training and only serves",
        lambda s: s.serving.pinned_checkpoint is None or s.serving.enabled,
    ),
    CrossFieldRule(
        ".serving.speculationLength",
        "self.serving.speculationLength != 'tuned' || has(self.evaluation.sweep) "
        "|| has(self.serving.pinnedCheckpoint)",
        "serving.speculationLength 'tuned' serves evaluate's sweep: set evaluation.sweep (or pin a draft "
        "whose export holds one)",
        lambda s: (
            s.serving.speculation_length != "tuned"
            or s.evaluation.sweep is not None
            or s.serving.pinned_checkpoint is not None
        ),
    ),
    # A canary is observed for `duration` before it can be promoted: a timeout at or before that rolls every
    # canary back (issue 28, item 10; timeout 0s among them).
    CrossFieldRule(
        ".serving.canary.timeout",
        "!has(self.serving.canary)"
        " || duration(self.serving.canary.timeout) > duration(self.serving.canary.duration)",
        "serving.canary.timeout must be longer than serving.canary.duration: the canary is observed for "
        "duration before a decision, so a timeout at or before it always rolls back",
        lambda s: (
            s.serving.canary is None
            or duration_seconds(s.serving.canary.timeout) > duration_seconds(s.serving.canary.duration)
        ),
    ),
    # Tolerations the API server refuses when the operator creates a pod (issue 28, item 9): Exists with a
    # value, tolerationSeconds without effect NoExecute; no key without Exists. Bounded
    # lists (MAX_TOLERATIONS).
    *(
        CrossFieldRule(
            f".{path}",
            f"!has(self.{path.split('.')[0]}) || !has(self.{path}) || self.{path}.all(t, {TOLERATION_CEL})",
            "a toleration with no key needs operator Exists (it then tolerates every taint), a toleration "
            "with operator Exists takes no value, and tolerationSeconds needs effect NoExecute",
            holds,
        )
        for path, holds in (
            ("pod.tolerations", lambda s: all(t.problem() is None for t in s.pod.tolerations)),
            ("nodePool.tolerations", lambda s: all(t.problem() is None for t in s.node_pool.tolerations)),
        )
    ),
    # Label and annotation keys the API server would refuse on a pod (issue 28, item 9); the maps are bounded
    # (MAX_METADATA), so the rules' cost is.
    *(
        CrossFieldRule(
            f".pod.{field}",
            f"!has(self.pod) || !has(self.pod.{field}) || self.pod.{field}.all(k, size(k) <= "
            f"{QUALIFIED_NAME_MAX} && k.matches('{QUALIFIED_NAME}'))",
            "every key is a qualified name: an optional DNS-subdomain prefix and '/', then at most 63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            holds,
        )
        for field, holds in (
            ("labels", lambda s: all(_qualified(k) for k in s.pod.labels)),
            ("annotations", lambda s: all(_qualified(k) for k in s.pod.annotations)),
        )
    ),
    # Node labels the pods must match: keys the API server would refuse in a pod's nodeSelector (the
    # values are label values by the schema). Bounded map (MAX_METADATA).
    CrossFieldRule(
        ".nodePool.nodeSelector",
        "!has(self.nodePool) || !has(self.nodePool.nodeSelector) || self.nodePool.nodeSelector.all(k, "
        f"size(k) <= {QUALIFIED_NAME_MAX} && k.matches('{QUALIFIED_NAME}'))",
        "every key is a label key (a qualified name): an optional DNS-subdomain prefix and '/', then at most "
        "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        lambda s: all(_qualified(k) for k in s.node_pool.node_selector),
    ),
    # An env entry takes a value or a valueFrom, not both (core/v1 validation refuses a non-empty value next
    # to valueFrom). Bounded list (ENV_MAX_ITEMS).
    CrossFieldRule(
        ".pod.env",
        "!has(self.pod) || !has(self.pod.env)"
        " || self.pod.env.all(e, !has(e.valueFrom) || !has(e.value) || e.value == '')",
        "an env entry with both value and valueFrom is refused by the API server: keep one of them",
        lambda s: all(not (v.value and v.value_from is not None) for v in s.pod.env),
    ),
    # The operator's own variables are not the user's (issue 28, item 7), as PodSettings' own check says;
    # the list and the names are bounded (maxItems, maxLength), so the rule's cost is too.
    CrossFieldRule(
        ".pod.env",
        "!has(self.pod) || !has(self.pod.env) || self.pod.env.all(e, !e.name.startsWith('EAGLE3_'))",
        "names starting EAGLE3_ are the operator's own variables and cannot be set",
        lambda s: all(not v.name.startswith("EAGLE3_") for v in s.pod.env),
    ),
)


def check_cross_field_rules(spec: Eagle3RunSpec) -> None:
    """Raise ValueError naming every broken rule's field (`spec.<path>: <message>`)."""
    broken = [f"spec{rule.field_path}: {rule.message}" for rule in RULES if not rule.holds(spec)]
    if broken:
        raise ValueError("; ".join(broken))


# --- rules against the verifier's own config (config.json), where it can be read ----------------------------

# Where multimodal configs keep the language model's shape (Llama 4, Gemma 3, InternVL, DeepSeek-VL...).
_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in _TEXT_CONFIG_KEYS:
        nested = config.get(key)
        if isinstance(nested, Mapping) and "num_hidden_layers" in nested:
            return nested
    return config


def verifier_config_problems(
    config: Mapping[str, Any], *, tensor_parallel_size: int, layers: Sequence[int] | None
) -> list[str]:
    """What the verifier's config.json says cannot work, as `spec.<field>: ...` lines (none: all fits).

    The API server cannot see the model, so these are no CRD rules: `eagle3 run` checks a local verifier
    before any stage starts, and the extract stage checks again before loading weights, with these words.
    A config without the figures (an unusual architecture) passes: vLLM then has the last word.
    """
    text = _text_config(config)
    heads, depth = text.get("num_attention_heads"), text.get("num_hidden_layers")
    problems = []
    if isinstance(heads, int) and heads > 0 and heads % tensor_parallel_size:
        fits = [d for d in range(1, min(heads, 64) + 1) if heads % d == 0]
        problems.append(
            f"spec.verifier.tensorParallelSize: {tensor_parallel_size} does not divide the verifier's "
            f"{heads} attention heads (vLLM shards heads evenly over the GPUs); use one of {fits}"
        )
    if isinstance(depth, int) and layers:
        beyond = [i for i in layers if i >= depth]
        if beyond:
            problems.append(
                f"spec.extraction.layers: ids {beyond} are beyond the verifier's {depth} decoder layers; use "
                f"ids in [0, {depth - 1}] (id i is the input of decoder layer i, 0 the embeddings)"
            )
    return problems
