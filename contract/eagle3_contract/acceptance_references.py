"""Published acceptance lengths of EAGLE-3 drafts, by verifier class: what the predict stage predicts at.

Acceptance length (tau) = mean tokens per verifier step, the bonus token included. Each entry is a typed
record of one published figure: the verifier class, the draft measured (its model id), the benchmark, how
many speculative tokens k it was measured with (None: tree decoding), the temperature (None: not stated),
the figure, and where it is published (a Citation: an https URL and a date, the page's own or the day the
figure was read). Chain drafting with k = 3..7 in vLLM or SGLang lands far below the EAGLE-3 paper's
tree-decoding figures; with k speculative tokens no draft reaches more than k + 1, so `acceptance_lengths_for`
clamps a higher figure to k + 1 and says so.

A verifier of a class the table does not know gets the dense-model chain-drafting range (the lowest and the
highest chain-drafting figure of the dense verifiers), marked as such. Bump REFERENCES_VERSION when the
table changes: it is part of the predict stage's hash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Literal

REFERENCES_VERSION = 2
UNKNOWN_CLASS = "unknown"
TARGET_SOURCE = "evaluation.targetAcceptanceLength"

# The day the figures without a date of their own were read off their pages.
READ_ON = date(2026, 12, 7)


@dataclass(frozen=True)
class Citation:
    """Where a figure is published: a page (https), and a date: the page's own (`published`) or, where the
    page gives none, the day the figure was read off it (`read`)."""

    url: str
    on: date
    date_kind: Literal["published", "read"]

    @property
    def date_label(self) -> str:
        return f"{'published' if self.date_kind == 'published' else 'read on'} {self.on.isoformat()}"


def hub(model_id: str, on: date = READ_ON) -> Citation:
    """A Hugging Face model card, read on `on`."""
    return Citation(f"https://huggingface.co/{model_id}", on, "read")


# EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test (v1, 2025-03-03).
PAPER = Citation("https://arxiv.org/abs/2503.01840", date(2025, 3, 3), "published")
# SpecForge's SpecBundle performance dashboard: SGLang, batch 1, topk 1, steps 3 / 5 / 7.
SPEC_BUNDLE = Citation("https://docs.sglang.io/SpecForge/SpecBundle/index.html", READ_ON, "read")
# nebius's card measures its own draft and RedHatAI's side by side (MT-Bench, HumanEval, GSM8K; T = 1, K = 7).
NEBIUS_CARD = hub("nebius/EAGLE3-Llama-3.3-70B-Instruct")


@dataclass(frozen=True)
class Reference:
    """One published figure: the verifier class it is for, the draft measured (its model id), the benchmark,
    k (None: tree decoding), the temperature (None: not stated), the acceptance length and its citation."""

    model_class: str
    model_id: str
    benchmark: str
    acceptance_length: float
    k: int | None
    temperature: float | None
    citation: Citation
    drafting: Literal["chain", "tree"] = "chain"

    @property
    def setting(self) -> str:
        k = f"k={self.k}" if self.k is not None else self.drafting
        t = f", T={self.temperature:g}" if self.temperature is not None else ""
        return f"{self.benchmark}, {k}{t}"

    @property
    def label(self) -> str:
        """The figure's setting and its source: the URL (the draft's model card, which names its model id; or
        the draft's model id at the page that measured it) and the date."""
        where = self.citation.url
        if where != hub(self.model_id).url:
            where = f"{self.model_id} at {where}"
        return f"{self.setting}: {where} ({self.citation.date_label})"


def _refs(
    model_class: str, model_id: str, figures: dict[str, float], k: int | None, temperature: float | None,
    citation: Citation, drafting: Literal["chain", "tree"] = "chain",
) -> list[Reference]:  # fmt: skip
    return [
        Reference(model_class, model_id, bench, tau, k, temperature, citation, drafting)
        for bench, tau in figures.items()
    ]


LLAMA_8B, LLAMA_70B = "Llama-3.1-8B", "Llama-3.3-70B"
KIMI_K2, KIMI_K25, KIMI_K26 = "Kimi-K2", "Kimi-K2.5", "Kimi-K2.6"
SPECBUNDLE_8B = "lmsys/SGLang-EAGLE3-Llama-3.1-8B-Instruct-SpecForge"
PAPER_8B, PAPER_70B = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
NEBIUS_70B = "nebius/EAGLE3-Llama-3.3-70B-Instruct"
REDHAT_70B = "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3"
K2_DRAFT = "AQ-MedAI/Kimi-K2-Instruct-eagle3"
K25_DRAFT = "lightseekorg/kimi-k2.5-eagle3"
K26_NVIDIA, K26_AQ = "nvidia/Kimi-K2.6-Eagle3", "AQ-MedAI/Kimi-K26-eagle3"
TREE: Literal["tree"] = "tree"

REFERENCES: tuple[Reference, ...] = (
    # the paper's tree decoding at temperature 0
    *_refs(LLAMA_8B, PAPER_8B, {"MT-Bench": 6.13, "HumanEval": 6.74, "GSM8K": 6.23}, None, 0.0, PAPER, TREE),
    *_refs(LLAMA_70B, PAPER_70B, {"MT-Bench": 5.63, "HumanEval": 6.52, "GSM8K": 6.15}, None, 0.0, PAPER,
           TREE),
    # chain drafting
    *_refs(LLAMA_8B, SPECBUNDLE_8B, {"MT-Bench": 2.90, "HumanEval": 3.34}, 3, None, SPEC_BUNDLE),
    *_refs(LLAMA_8B, SPECBUNDLE_8B, {"MT-Bench": 3.52, "HumanEval": 4.32}, 5, None, SPEC_BUNDLE),
    *_refs(LLAMA_8B, SPECBUNDLE_8B, {"MT-Bench": 3.86, "HumanEval": 4.91}, 7, None, SPEC_BUNDLE),
    *_refs(LLAMA_70B, REDHAT_70B, {"MT-Bench": 2.88, "HumanEval": 3.62, "GSM8K": 3.29}, 7, 1.0, NEBIUS_CARD),
    *_refs(LLAMA_70B, NEBIUS_70B, {"MT-Bench": 3.89, "HumanEval": 5.08, "GSM8K": 5.01}, 7, 1.0, NEBIUS_CARD),
    *_refs(KIMI_K2, K2_DRAFT, {"HumanEval": 3.372, "GSM8K": 3.165}, 3, None, hub(K2_DRAFT)),
    *_refs(KIMI_K25, K25_DRAFT, {"MT-Bench": 2.687, "GSM8K": 3.201, "HumanEval": 3.285}, 3, None,
           hub(K25_DRAFT)),
    Reference(KIMI_K26, K26_NVIDIA, "MT-Bench", 2.62, 3, None, hub(K26_NVIDIA)),
    Reference(KIMI_K26, K26_AQ, "HumanEval", 3.217, 3, None, hub(K26_AQ)),
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
    """An acceptance length to predict at: its value (clamped to k + 1), where it comes from (for a published
    figure: its setting, the draft's model id, the URL and the date), and what was published (None for the
    user's own target)."""

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
    for ref in refs:
        value, clamped = clamp(ref.acceptance_length, k)
        note = f"; {ref.acceptance_length} published, clamped to k+1={k + 1}" if clamped else ""
        # the result names the class (modelClass); a figure borrowed for an unknown class names its own
        prefix = "" if found != UNKNOWN_CLASS else f"unknown verifier class, {ref.model_class}'s range: "
        out.append(PredictedLength(value, f"{prefix}{ref.label}{note}", ref.acceptance_length, clamped))
    if target is not None:
        value, clamped = clamp(target, k)
        note = f"; {target} asked, clamped to k+1={k + 1}" if clamped else ""
        out.append(PredictedLength(value, f"{TARGET_SOURCE}{note}", None, clamped))
    return found, sorted(out, key=lambda p: p.acceptance_length)
