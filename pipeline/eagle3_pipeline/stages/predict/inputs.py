"""The predict stage's inputs: an untrained EAGLE-3 draft of the spec's shape, and chat prompts.

No dataset is prepared when predict runs: the prompts are the first user turns of dataset.source when it is
a local file or directory, else GENERIC_PROMPTS. The draft is speculators' Eagle3DraftModel with random
weights and an identity-like mapping over the first `vocabSize` tokens: its proposals are hardly ever
accepted, but a speculative step costs what a trained draft's costs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from eagle3_pipeline.data.conversations import detect_format, normalize, prompt_of
from eagle3_pipeline.data.dataset_files import read_rows
from eagle3_pipeline.data.draft_checkpoint import write_serving_checkpoint
from eagle3_pipeline.data.hidden_states import resolve_aux_layers
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.requests import Message

logger = logging.getLogger(__name__)

GENERIC_SOURCE = "generic chat prompts (eagle3_pipeline.stages.predict.inputs)"
GENERIC_PROMPTS = (
    "Explain how a hash table works, with an example.",
    "Write a short poem about the sea at night.",
    "What are the main differences between TCP and UDP?",
    "Summarize the causes of the French Revolution in a paragraph.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give me three tips for a job interview.",
    "How does photosynthesis work?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What is the difference between a list and a tuple in Python?",
    "Plan a three-day trip to Rome.",
    "Explain recursion to a ten-year-old.",
    "Write a SQL query that returns the ten most recent orders.",
    "Why is the sky blue?",
    "Compare renewable and fossil energy sources.",
    "Write a short story opening about a lost key.",
    "What is 17 times 23? Show your steps.",
)


def local_prompts(source: str, wanted: int) -> list[list[Message]] | None:
    """Up to `wanted` prompts (each conversation up to its first assistant turn) from a local dataset;
    None when `source` is not on this machine."""

    if not Path(source).exists():
        return None
    prompts: list[list[Message]] = []
    for _, row in read_rows(source, "train"):
        fmt = detect_format(row)
        if fmt is None:
            continue
        try:
            prompt = prompt_of(normalize(row, fmt))
        except ValueError:
            continue
        if prompt is not None:
            prompts.append(prompt)
        if len(prompts) >= wanted:
            break
    return prompts or None


def chat_prompts(source: str, wanted: int) -> tuple[list[list[Message]], str]:
    """`wanted` prompts (repeated when there are fewer) and where they come from."""
    found = local_prompts(source, wanted)
    origin = f"first user turns of {source}"
    if found is None:
        found = [[{"role": "user", "content": p}] for p in GENERIC_PROMPTS]
        origin = GENERIC_SOURCE
    return [found[i % len(found)] for i in range(wanted)], origin


def aux_layers(num_hidden_layers: int) -> list[int]:
    """speculators' default auxiliary layers, or three distinct ones for a verifier too shallow for them
    (the cost of a step does not depend on which)."""

    try:
        return list(resolve_aux_layers(None, num_hidden_layers))
    except StageError:
        n = num_hidden_layers
        return sorted({1, max(n // 2, 1), max(n - 1, 1)})


def build_untrained_draft(
    verifier: str, verifier_name: str, out: Path, layers: int, vocab_size: int, trust_remote_code: bool
) -> Path:
    """The slim serving checkpoint (as evaluate serves it) of a random draft for `verifier` in `out`."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoConfig

    torch.manual_seed(0)
    config: Any = AutoConfig.from_pretrained(verifier, trust_remote_code=trust_remote_code)
    aux = aux_layers(config.num_hidden_layers)
    config.num_hidden_layers = layers
    size = min(vocab_size, config.vocab_size)
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[:size] = True
    d2t = torch.zeros(size, dtype=torch.long)  # draft token i is target token i
    model: Any = Eagle3DraftModel.from_training_args(
        config, t2d=t2d, d2t=d2t, verifier_name_or_path=verifier, draft_vocab_size=size,
        norm_before_residual=False, ttt_steps=3, target_layer_ids=aux, draft_attn_impl="sdpa",
    )  # fmt: skip
    full = out.with_name(out.name + "-full")
    model.to(torch.bfloat16).save_pretrained(full)
    slim = write_serving_checkpoint(full, out, verifier_name)
    shutil.rmtree(full, ignore_errors=True)
    logger.info("untrained draft: %d layers, vocabulary %d, aux layers %s in %s", layers, size, aux, out)
    return slim.path
