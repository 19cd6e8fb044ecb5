"""The shapes of the verifiers the examples and docs name, for sizing a run before anything is downloaded.

A dry run (and the operator's volume check) needs the verifier's hidden size and depth to say how many bytes
of hidden states a run stores or moves. The verifier's own config.json is the first source (a local path, the
Hub cache); this table is the fallback for the Hub ids the project's examples and docs use, so that sizing
works on a machine that has never seen them. Each entry's source is the model's config.json on the Hugging
Face Hub (the text config's `hidden_size` and `num_hidden_layers` for a multimodal model).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_contract.estimates import VerifierShape


@dataclass(frozen=True)
class KnownShape:
    hidden_size: int
    num_hidden_layers: int
    source: str


KNOWN_SHAPES: dict[str, KnownShape] = {
    "meta-llama/llama-3.1-8b-instruct": KnownShape(
        4096, 32, "huggingface.co/meta-llama/Llama-3.1-8B-Instruct config.json"
    ),
    "meta-llama/llama-3.1-8b": KnownShape(4096, 32, "huggingface.co/meta-llama/Llama-3.1-8B config.json"),
    "meta-llama/llama-3.1-70b-instruct": KnownShape(
        8192, 80, "huggingface.co/meta-llama/Llama-3.1-70B-Instruct config.json"
    ),
    "moonshotai/kimi-k2.5": KnownShape(
        7168, 61, "huggingface.co/moonshotai/Kimi-K2.5 config.json (text_config, DeepSeek-V3 shape)"
    ),
    "moonshotai/kimi-k2-instruct": KnownShape(
        7168, 61, "huggingface.co/moonshotai/Kimi-K2-Instruct config.json (DeepSeek-V3 shape)"
    ),
}


def known_shape(model: str) -> VerifierShape | None:
    """The table's shape of a Hub id (case-insensitive), or None."""
    found = KNOWN_SHAPES.get(model.strip().lower())
    if found is None:
        return None
    return VerifierShape(
        found.hidden_size, found.num_hidden_layers, f"from the table of known verifiers ({found.source})"
    )
