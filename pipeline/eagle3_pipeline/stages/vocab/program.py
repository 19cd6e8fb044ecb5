"""vocab: the draft's vocabulary (the N most frequent assistant tokens) and its d2t/t2d mapping.

Built with speculators' own `build_vocab_mappings_from_distribution` from the data stage's `token_freq.pt`,
saved as `d2t-<N>.npy` / `t2d-<N>.npy` (the names speculators' trainer caches them under). Unlike speculators,
a missing frequency file is an error here: it would silently fall back to the full target vocabulary.
Progress: two steps, the frequencies read and the mapping saved.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from eagle3_contract.params import VocabParams, VocabTuning
from eagle3_pipeline.data.prepared import TOKEN_FREQ_FILE
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)
MAPPING_FILE = "vocab.json"


def d2t_file(n: int) -> str:
    return f"d2t-{n}.npy"


def t2d_file(n: int) -> str:
    return f"t2d-{n}.npy"


def target_vocab_size(ctx: StageContext[VocabParams, VocabTuning]) -> int:
    from transformers import AutoConfig

    v = ctx.params.verifier
    try:
        config = AutoConfig.from_pretrained(
            ctx.local_path(v.model), revision=v.revision, trust_remote_code=v.trust_remote_code
        )
    except Exception as exc:
        raise StageError(
            f"verifier.model {v.model}: cannot load its config ({type(exc).__name__}: {exc})"
        ) from None
    config = getattr(config, "text_config", config)  # multimodal verifiers keep the LM's config inside
    size = int(config.vocab_size)
    return size


def load_frequencies(data_dir: Path) -> dict[int, int]:
    import torch

    path = data_dir / TOKEN_FREQ_FILE
    if not path.is_file():
        raise StageError(
            f"{path} is missing: the draft vocabulary is chosen by token frequency, and without it "
            "speculators would silently use the full target vocabulary; re-run the data stage"
        )
    freq: dict[int, int] = torch.load(path, weights_only=True)
    if not freq:
        raise StageError(f"{path} counts no assistant tokens: the prepared dataset has no loss-masked tokens")
    return freq


def run(ctx: StageContext[VocabParams, VocabTuning]) -> dict[str, Any]:
    import numpy as np
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    ctx.progress.begin("steps", 2)
    data_dir = ctx.data_input()
    freq = load_frequencies(data_dir)
    ctx.progress.advance()
    n = ctx.params.vocab_size
    target = target_vocab_size(ctx)
    if n > target:
        raise StageError(f"draft.vocabSize {n} is larger than the verifier's vocabulary ({target} tokens)")
    if max(freq) >= target:
        raise StageError(
            f"{data_dir / TOKEN_FREQ_FILE} has token id {max(freq)} >= the verifier's vocabulary size "
            f"{target}: it was made with another tokenizer; re-run the data stage for this verifier"
        )
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size=n, target_vocab_size=target)
    np.save(ctx.work / d2t_file(n), d2t.cpu().numpy())
    np.save(ctx.work / t2d_file(n), t2d.cpu().numpy())
    ctx.progress.advance()
    total = sum(freq.values())
    covered = sum(c for tid, c in freq.items() if bool(t2d[tid]))
    seen = len(freq)
    coverage = round(covered / total, 6)
    result: dict[str, Any] = {
        "draftVocabSize": n,
        "targetVocabSize": target,
        "d2t": d2t_file(n),
        "t2d": t2d_file(n),
        "assistantTokens": total,
        "uniqueAssistantTokens": seen,
        "coverage": coverage,
        "uniqueCoverage": round(min(n, seen) / seen, 6),
    }
    (ctx.work / MAPPING_FILE).write_text(json.dumps(result, indent=2) + "\n")
    logger.info(
        "draft vocabulary %d of %d tokens covers %.2f%% of assistant tokens",
        n,
        target,
        100 * coverage,
    )
    return result
