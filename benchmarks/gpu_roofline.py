"""The verifier shapes of `gpu_pipeline.py` and the prefill roofline its extraction figures are compared with.

A prefill pass of a decoder-only model costs, per token, 2 FLOPs per weight of every matrix the token goes
through (the decoder layers; not the embedding lookup, and not the lm_head, which extraction never runs)
plus the attention scores and the weighted sum: QK^T and AV are 2 FLOPs per multiply-add each, over
`heads * head_dim` channels and, causally, half the sequence on average, i.e. 2 * L * heads * head_dim per
layer for a sequence of L tokens. The roofline is peak dense bf16 FLOP/s divided by that count, taken at the
mean sequence length of the data: the rate a device would reach running at its datasheet peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets, in FLOP/s, matched in this order as
# substrings of torch.cuda.get_device_name() (so "H100 PCIe" must come before "H100").
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),  # H200 SXM (also GH200's H100-class die)
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # H100 SXM
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
    ("L4", 121e12),
)


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-style verifier: `LlamaConfig`'s sizes, the layers extracted and the draft vocabulary."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    aux_layers: tuple[int, ...]
    draft_vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        """Weights of one decoder layer: q/o, k/v (grouped), the gated MLP and two RMSNorms."""
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def matmul_params(self) -> int:
        """Parameters a prefill token is multiplied with: the decoder layers and the final norm."""
        return self.layers * self.layer_params() + self.hidden

    def total_params(self) -> int:
        """All parameters, with untied input embeddings and lm_head."""
        return self.matmul_params() + 2 * self.vocab * self.hidden

    def describe(self) -> dict[str, Any]:
        sizes = {
            k: getattr(self, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")
        }
        return {
            "parameters": self.total_params(),
            "matmulParameters": self.matmul_params(),
            **sizes,
            "auxLayers": list(self.aux_layers),
            "draftVocab": self.draft_vocab,
        }


# 1b: 16 layers x 2048 (GQA 32/8 heads, MLP 8192, 32k vocabulary) = 1.1B parameters, a Llama-3.2-1B-like
# shape with a Llama-2 vocabulary; 3b: Llama-3.2-3B-like, 3.0B; tiny: the CPU smoke size.
SIZES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(4, 128, 384, 4, 2, 1024, (1, 2, 3), 256),
    "1b": LlamaShape(16, 2048, 8192, 32, 8, 32000, (2, 8, 13), 8192),
    "3b": LlamaShape(28, 3072, 8192, 24, 8, 32000, (2, 14, 25), 8192),
}


def attention_flops_per_token(shape: LlamaShape, mean_len: float) -> float:
    """Causal QK^T and AV at sequence length `mean_len`: a token sees mean_len / 2 others on average."""
    return 2.0 * shape.layers * mean_len * shape.heads * shape.head_dim


def prefill_flops_per_token(shape: LlamaShape, mean_len: float) -> float:
    return 2.0 * shape.matmul_params() + attention_flops_per_token(shape, mean_len)


def peak_flops(device_name: str, override_tflops: float | None) -> float | None:
    """Peak dense bf16 FLOP/s: the override (TFLOP/s) when given, else the table's entry, else None."""
    if override_tflops is not None:
        return override_tflops * 1e12
    for key, flops in PEAK_BF16:
        if key.lower() in device_name.lower():
            return flops
    return None


def roofline_tokens_per_s(shape: LlamaShape, mean_len: float, peak: float | None) -> float | None:
    return peak / prefill_flops_per_token(shape, mean_len) if peak else None


def fraction(tokens_per_s: float, roofline: float | None) -> float | None:
    return round(tokens_per_s / roofline, 4) if roofline else None
