"""The one `vllm serve` command line: the serving Deployment, evaluate, generate and extract all build theirs
here, so the engine that evaluate measures is, option for option, the engine that serves.

A command is three parts: the engine (the verifier as vLLM loads it: model, tensor parallelism, revision,
remote code, context length and the spec's `verifier.vllmArgs`), where it listens (host, port, served model
name), and what the stage adds (a speculative config: an EAGLE-3 draft or hidden-state extraction; a KV
transfer config; batching and seed). The spec's own arguments come after ours (vLLM keeps an option's last
value, so `verifier.vllmArgs` can override a default), then a caller's `extra_args` (the Deployment's
`serving.extraArgs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.spec import DraftMethod, Verifier
from eagle3_contract.draft_methods import method_row

EXTRACT_HIDDEN_STATES = "extract_hidden_states"


@dataclass(frozen=True)
class VllmEngine:
    """The verifier as vLLM loads it. `model` is what `vllm serve` is given: a Hub id, or a local path."""

    model: str
    tensor_parallel_size: int = 1
    revision: str | None = None
    trust_remote_code: bool = False
    max_model_len: int | None = None
    vllm_args: tuple[str, ...] = ()

    @classmethod
    def of(cls, verifier: Verifier, model: str | None = None) -> VllmEngine:
        """The engine of the spec's verifier; `model` replaces its name (a stage's local path to it)."""
        return cls(
            model=model if model is not None else verifier.model,
            tensor_parallel_size=verifier.tensor_parallel_size,
            revision=verifier.revision,
            trust_remote_code=verifier.trust_remote_code,
            max_model_len=verifier.max_model_len,
            vllm_args=tuple(verifier.vllm_args),
        )


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens, and the model name it answers to (None: the model argument)."""

    host: str
    port: int
    served_model_name: str | None = None


def draft_speculative_config(
    draft: str, num_speculative_tokens: int, method: DraftMethod | str = DraftMethod.EAGLE3
) -> dict[str, Any]:
    """Serve with a trained draft of `method` (a directory vLLM reads; its config names the aux layers):
    eagle3_contract.draft_methods's row for it."""
    return method_row(method).speculative_config(draft, num_speculative_tokens)


NGRAM_LOOKUP = (2, 4)  # prompt_lookup_min, prompt_lookup_max: vLLM's docs' example (its default is 5 and 5)


def training_free_speculative_config(method: str, num_speculative_tokens: int) -> dict[str, Any]:
    """A training-free rival of draft.candidates: `ngram` (vLLM's prompt lookup, the n-grams of 2 to 4
    tokens of the context), or `suffix` (vLLM's suffix decoding, which needs arctic-inference beside it)."""
    if method == "ngram":
        low, high = NGRAM_LOOKUP
        return {
            "method": "ngram",
            "num_speculative_tokens": num_speculative_tokens,
            "prompt_lookup_min": low,
            "prompt_lookup_max": high,
        }
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": num_speculative_tokens}
    raise ValueError(f"{method!r} is not a training-free method (ngram, suffix)")


def hidden_states_speculative_config(layer_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM 0.32's `extract_hidden_states` method, as speculators' scripts/launch_vllm.py passes it.

    vLLM collects the ids sorted and deduplicated (EagleModelMixin._set_aux_hidden_state_layers): pass them
    sorted and distinct, so the stored layer order is this list.
    """
    return {
        "method": EXTRACT_HIDDEN_STATES,
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }


def vllm_serve_args(
    engine: VllmEngine,
    endpoint: Endpoint,
    *,
    speculative_config: Mapping[str, Any] | None = None,
    kv_transfer_config: Mapping[str, Any] | None = None,
    seed: int | None = None,
    max_num_batched_tokens: int | None = None,
    enforce_eager: bool = False,
    options: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The arguments of `vllm serve` (after the subcommand).

    `options` are a stage's own engine options (before the spec's `verifier.vllmArgs`, which may override
    them); `extra_args` come last.
    """
    args = [engine.model]
    if endpoint.served_model_name is not None:
        args += ["--served-model-name", endpoint.served_model_name]
    args += ["--host", endpoint.host, "--port", str(endpoint.port)]
    if seed is not None:
        args += ["--seed", str(seed)]
    args += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.revision:
        args += ["--revision", engine.revision]
    if engine.trust_remote_code:
        args.append("--trust-remote-code")
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    if enforce_eager:
        args.append("--enforce-eager")
    if speculative_config is not None:
        args += ["--speculative-config", json.dumps(dict(speculative_config), sort_keys=True)]
    if kv_transfer_config is not None:
        args += ["--kv-transfer-config", json.dumps(dict(kv_transfer_config), sort_keys=True)]
    return args + list(options) + list(engine.vllm_args) + list(extra_args)


# The options that say where a server listens and how a stage drives it, not what it serves: what evaluate's
# command and the Deployment's may differ in (tests/contract/test_vllm_command.py compares the rest).
ENDPOINT_OPTIONS = ("--served-model-name", "--host", "--port", "--seed", "--max-num-batched-tokens")
ENDPOINT_FLAGS = ("--enforce-eager",)


def served_engine(args: Sequence[str]) -> list[str]:
    """`args` without the endpoint options and flags: the engine and its speculative config only."""
    out: list[str] = []
    skip = False
    for arg in args[1:]:
        if skip:
            skip = False
        elif arg in ENDPOINT_OPTIONS:
            skip = True
        elif arg not in ENDPOINT_FLAGS:
            out.append(arg)
    return out
