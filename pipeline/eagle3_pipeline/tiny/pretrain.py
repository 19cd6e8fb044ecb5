"""Pretraining the tiny verifier: a plain-torch causal-LM loop over chat-templated corpus conversations.

The loss is on the assistant turns only (the requests are random draws the model need not predict).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from eagle3_pipeline.tiny.corpus import Message, conversations
from eagle3_pipeline.tiny.tokenizer import END_HEADER, EOT, START_HEADER

log = logging.getLogger(__name__)


IGNORE = -100
POOL = 2048  # conversations sorted by length together, so a batch's rows need little padding


@dataclass(frozen=True)
class PretrainParams:
    seed: int = 1
    steps: int = 1000
    tokens_per_step: int = 2048
    learning_rate: float = 5e-3
    warmup_steps: int = 30
    final_lr_fraction: float = 0.05
    weight_decay: float = 0.01


def assistant_labels(ids: list[int], special: dict[str, int]) -> list[int]:
    """`ids` with all but the assistant turns (after the header, through `<|eot_id|>`) set to IGNORE."""
    labels: list[int] = []
    header, inside, role = False, False, list[int]()
    for token in ids:
        if token == special[START_HEADER]:
            header, role = True, []
        elif token == special[END_HEADER]:
            header, inside = False, role == [special["assistant"]]
        elif header:
            role.append(token)
        labels.append(token if inside and token != special[END_HEADER] else IGNORE)
        inside = inside and token != special[EOT]
    return labels


def encoded_conversations(tokenizer: Any, seed: int) -> Iterator[tuple[list[int], list[int]]]:
    """Token ids and labels of the corpus stream's conversations, rendered with the chat template."""
    special = {token: tokenizer.convert_tokens_to_ids(token) for token in (START_HEADER, END_HEADER, EOT)}
    [special["assistant"]] = tokenizer.encode("assistant", add_special_tokens=False)
    stream = conversations(seed)
    while True:
        chunk: list[list[Message]] = [next(stream) for _ in range(256)]
        texts = [tokenizer.apply_chat_template(messages, tokenize=False) for messages in chunk]
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            yield ids, assistant_labels(ids, special)


def collate(group: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels: the loss ignores the padding, and causal attention never reaches it."""
    width = max(len(ids) for ids, _ in group)
    ids = [row + [pad] * (width - len(row)) for row, _ in group]
    labels = [row + [IGNORE] * (width - len(row)) for _, row in group]
    return torch.tensor(ids), torch.tensor(labels)


def batches(tokenizer: Any, params: PretrainParams) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of whole conversations, one per row, about `tokens_per_step` tokens each.

    A conversation starts at position 0 of its row as at inference, and never attends to another one (as it
    would in packed rows), so the model learns to copy from the request at hand.
    """
    rng = random.Random(params.seed)
    encoded = encoded_conversations(tokenizer, params.seed)
    while True:
        pool = sorted((next(encoded) for _ in range(POOL)), key=lambda pair: len(pair[0]))
        groups: list[list[tuple[list[int], list[int]]]] = [[]]
        for pair in pool:
            if groups[-1] and (len(groups[-1]) + 1) * len(pair[0]) > params.tokens_per_step:
                groups.append([])
            groups[-1].append(pair)
        rng.shuffle(groups)
        for group in groups:
            yield collate(group, tokenizer.pad_token_id)


def learning_rate(step: int, params: PretrainParams) -> float:
    """Linear warmup, then cosine decay to `final_lr_fraction` of the peak."""
    if step < params.warmup_steps:
        return params.learning_rate * (step + 1) / params.warmup_steps
    progress = (step - params.warmup_steps) / max(1, params.steps - params.warmup_steps)
    floor = params.final_lr_fraction
    return params.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def pretrain(model: torch.nn.Module, tokenizer: Any, params: PretrainParams) -> float:
    """Train `model` in place; returns the mean loss of the last 20 steps."""
    torch.manual_seed(params.seed)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": params.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=params.learning_rate,
        betas=(0.9, 0.95),
    )
    model.train()
    started, recent = time.monotonic(), list[float]()
    progress = tqdm(range(params.steps), desc="pretrain tiny-llama", mininterval=2.0)
    for step, (ids, labels) in zip(progress, batches(tokenizer, params), strict=False):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, params)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent = [*recent[-19:], loss.item()]
        progress.set_postfix(loss=f"{recent[-1]:.3f}", refresh=False)
    model.eval()
    final = sum(recent) / len(recent)
    log.info(
        "pretrained %d steps of about %d tokens in %.0f s: final loss (answers) %.3f",
        params.steps,
        params.tokens_per_step,
        time.monotonic() - started,
        final,
    )
    return final


@torch.no_grad()
def greedy_answer(model: Any, tokenizer: Any, messages: list[Message], max_new_tokens: int = 48) -> str:
    """The model's greedy reply to `messages` (rendered with the chat template and a generation prompt)."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(
        **ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    text: str = tokenizer.decode(output[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    return text.strip()
