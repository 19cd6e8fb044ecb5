"""Published acceptance lengths of EAGLE-3 drafts, by verifier class: what the predict stage predicts at.

Acceptance length (tau) = mean tokens per verifier step, the bonus token included. Each entry says where
the figure comes from, how many speculative tokens k it was measured with (None: tree decoding, or not
stated) and at which temperature (None: not stated). Chain drafting with k = 3..7 in vLLM or SGLang lands far
below the EAGLE-3 paper's tree-decoding figures; with k speculative tokens no draft reaches more than k + 1,
so `acceptance_lengths_for` clamps a higher figure to k + 1 and says so.

A verifier of a class the table does not know gets the dense-model chain-drafting range (the lowest and the
highest chain-drafting figure of the dense verifiers), marked as such. Bump REFERENCES_VERSION when the
table changes: it is part of the predict stage's hash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REFERENCES_VERSION = 1
UNKNOWN_CLASS = "unknown"
TARGET_SOURCE = "evaluation.targetAcceptanceLength"

PAPER = "EAGLE-3 paper, arXiv 2503.01840"
SPEC_BUNDLE = "SpecForge spec_bundle data (SpecBundle, SGLang batch 1)"
SPECULATORS_CARD = "speculators Llama-3.3-70B draft, model card measurements"
STRONGER_CARD = "a stronger public Llama-3.3-70B draft, model card measurements"
K2_CARD = "Kimi-K2 EAGLE-3 draft (SpecForge, 1.4M samples), model card"
K25_CARD = "Kimi-K2.5 EAGLE-3 draft (~600k regenerated samples), model card"


@dataclass(frozen=True)
class Reference:
    """One published figure."""

    model_class: str
    acceptance_length: float
    k: int | None  # speculative tokens; None: tree decoding or not stated
    temperature: float | None  # None: not stated
    benchmark: str
    source: str
    drafting: str = "chain"  # chain or tree

    @property
    def label(self) -> str:
        k = f"k={self.k}" if self.k is not None else self.drafting
        return f"{self.benchmark}, {k} ({self.source})"


def _refs(
    model_class: str, figures: dict[str, float], k: int | None, temperature: float | None, source: str,
    drafting: str = "chain",
) -> list[Reference]:  # fmt: skip
    return [
        Reference(model_class, tau, k, temperature, bench, source, drafting) for bench, tau in figures.items()
    ]


LLAMA_8B, LLAMA_70B = "Llama-3.1-8B", "Llama-3.3-70B"
KIMI_K2, KIMI_K25, KIMI_K26 = "Kimi-K2", "Kimi-K2.5", "Kimi-K2.6"

REFERENCES: tuple[Reference, ...] = (
    *_refs(LLAMA_8B, {"MT-bench": 6.13, "HumanEval": 6.74, "GSM8K": 6.23}, None, 0.0, PAPER, "tree"),
    *_refs(LLAMA_8B, {"MT-Bench": 2.90, "HumanEval": 3.34}, 3, None, SPEC_BUNDLE),
    *_refs(LLAMA_8B, {"MT-Bench": 3.52, "HumanEval": 4.32}, 5, None, SPEC_BUNDLE),
    *_refs(LLAMA_8B, {"MT-Bench": 3.86, "HumanEval": 4.91}, 7, None, SPEC_BUNDLE),
    *_refs(LLAMA_70B, {"MT-bench": 5.63, "HumanEval": 6.52, "GSM8K": 6.15}, None, 0.0, PAPER, "tree"),
    *_refs(LLAMA_70B, {"MT-bench": 2.88, "HumanEval": 3.62, "GSM8K": 3.29}, 7, 1.0, SPECULATORS_CARD),
    *_refs(LLAMA_70B, {"MT-bench": 3.89, "HumanEval": 5.08, "GSM8K": 5.01}, 7, 1.0, STRONGER_CARD),
    *_refs(KIMI_K2, {"HumanEval": 3.37, "GSM8K": 3.17}, None, None, K2_CARD),
    *_refs(KIMI_K25, {"MT-Bench": 2.69, "GSM8K": 3.20, "HumanEval": 3.29}, None, None, K25_CARD),
    Reference(KIMI_K26, 2.30, 3, None, "vLLM TP8", "Kimi-K2.6 MLA draft, model card"),
    Reference(KIMI_K26, 2.62, 3, None, "MT-Bench", "Kimi-K2.6 NVIDIA draft, model card"),
    Reference(KIMI_K26, 3.22, 3, None, "HumanEval", "Kimi-K2.6 AQ-MedAI draft, model card"),
)  # fmt: skip

# The classes by the verifier's model id or path, most specific first.
CLASS_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (LLAMA_8B, re.compile(r"llama[-_ ]?3\.1[-_ ]?8b", re.IGNORECASE)),
    (LLAMA_70B, re.compile(r"llama[-_ ]?3\.3[-_ ]?70b", re.IGNORECASE)),
    (KIMI_K26, re.compile(r"kimi[-_ ]?k2\.6", re.IGNORECASE)),
    (KIMI_K25, re.compile(r"kimi[-_ ]?k2\.5", re.IGNORECASE)),
    (KIMI_K2, re.compile(r"kimi[-_ ]?k2(?![.\d])", re.IGNORECASE)),
)
DENSE_CLASSES = (LLAMA_8B, LLAMA_70B)


def model_class(model: str) -> str:
    """The table's class of a verifier model id or path, or UNKNOWN_CLASS."""
    for name, pattern in CLASS_PATTERNS:
        if pattern.search(model):
            return name
    return UNKNOWN_CLASS


def references_for(model: str) -> tuple[str, list[Reference]]:
    """(the class, its entries); an unknown class gets the dense chain-drafting range's two ends."""
    found = model_class(model)
    if found != UNKNOWN_CLASS:
        return found, [r for r in REFERENCES if r.model_class == found]
    chain = [r for r in REFERENCES if r.model_class in DENSE_CLASSES and r.drafting == "chain"]
    low = min(chain, key=lambda r: r.acceptance_length)
    high = max(chain, key=lambda r: r.acceptance_length)
    return found, [low, high]


@dataclass(frozen=True)
class PredictedLength:
    """An acceptance length to predict at: its value (clamped to k + 1), where it comes from, and what was
    published (None for the user's own target)."""

    acceptance_length: float
    source: str
    published: float | None = None
    clamped: bool = False


def clamp(value: float, k: int) -> tuple[float, bool]:
    """`value` within what k speculative tokens can reach ([1, k + 1]), and whether it was changed."""
    bounded = min(max(value, 1.0), float(k + 1))
    return bounded, bounded != value


def acceptance_lengths_for(
    model: str, k: int, target: float | None = None
) -> tuple[str, list[PredictedLength]]:
    """The class of `model` and the acceptance lengths to predict at, sorted, each with its source:
    the class's published figures (the dense chain-drafting range for an unknown class) and `target`.
    A figure above k + 1 is clamped to k + 1, and its source says so."""
    found, refs = references_for(model)
    out: list[PredictedLength] = []
    prefix = "" if found != UNKNOWN_CLASS else "unknown verifier class, dense chain-drafting range: "
    for ref in refs:
        value, clamped = clamp(ref.acceptance_length, k)
        note = f"; {ref.acceptance_length} published, clamped to k+1={k + 1}" if clamped else ""
        out.append(
            PredictedLength(
                value, f"{prefix}{ref.model_class} {ref.label}{note}", ref.acceptance_length, clamped
            )
        )
    if target is not None:
        value, clamped = clamp(target, k)
        note = f"; {target} asked, clamped to k+1={k + 1}" if clamped else ""
        out.append(PredictedLength(value, f"{TARGET_SOURCE}{note}", None, clamped))
    return found, sorted(out, key=lambda p: p.acceptance_length)
