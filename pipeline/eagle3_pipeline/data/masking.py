"""Token ids and the assistant-only loss mask of a conversation, through the verifier's own chat template.

The conversation is rendered once; each assistant turn is located in the rendered text (where the template's
generation prompt ends, or by its content when a template is not prefix-stable, e.g. one that rewrites earlier
turns), extended over the template's end-of-turn marker so the draft learns to stop, and mapped to tokens
by character offsets (fast tokenizers) or by tokenizing the text piecewise at span boundaries (slow ones, such
as tiktoken-based remote-code tokenizers). Reasoning blocks can stay in the context but out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from eagle3_pipeline.data.conversations import Message, RowError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_SENTINEL = "\x00EAGLE3-SENTINEL\x00"

Span = tuple[int, int]
# How a chat template refuses a conversation: jinja's TemplateError (a template's own `raise_exception` too),
# and transformers' ValueError. These are the row's problem; anything else raised while rendering is a bug.
TEMPLATE_REFUSALS = (TemplateError, ValueError)


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]


class ChatTemplate:
    """The verifier tokenizer's chat template, with the end-of-turn marker it writes after an answer."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the verifier's tokenizer has no chat_template: use a chat (instruct) verifier that has one"
            )
        self.tokenizer = tokenizer
        probe = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}])
        after = probe.split(_SENTINEL, 1)[1] if _SENTINEL in probe else ""
        self.end_of_turn = after.rstrip()

    def render(self, messages: list[Message], generation_prompt: bool = False) -> str:
        text: str = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        return text


def assistant_spans(
    template: ChatTemplate, messages: list[Message], text: str, loss_on_reasoning: bool
) -> list[Span]:
    """Character spans of the rendered `text` that the loss is computed on."""
    spans: list[Span] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = _locate(template, messages, i, text, cursor)
        cursor = end
        block = _reasoning_block(text, start, end) if not loss_on_reasoning else None
        if block is None:
            spans.append((start, end))
        else:
            spans += [s for s in ((start, block[0]), (block[1], end)) if s[0] < s[1]]
    if not spans:
        raise RowError("no_assistant_turn", "no assistant turn to train on")
    return spans


def _locate(template: ChatTemplate, messages: list[Message], i: int, text: str, cursor: int) -> Span:
    message = messages[i]
    prompt = _prefix(template, messages[:i])
    if prompt is not None and text.startswith(prompt) and len(prompt) >= cursor:
        start = len(prompt)
    else:  # not prefix-stable: find the turn by its own text
        # the reasoning where the template renders it, else the answer (templates may drop old reasoning)
        heads = [h.strip()[:64] for h in (message.get("reasoning_content"), message["content"]) if h]
        start = next((at for at in (text.find(h, cursor) for h in heads if h) if at >= 0), -1)
        if start < 0:
            raise RowError("template_mismatch", f"turn {i}: the rendered chat does not contain its text")
        head = text.rfind(THINK_OPEN, cursor, start)
        if head >= 0 and not text[head + len(THINK_OPEN) : start].strip():
            start = head  # the reasoning block's opening tag belongs to the answer
    content = message["content"].strip()
    pos = text.find(content, start) if content else start
    if pos < 0:
        raise RowError("template_mismatch", f"turn {i}: the rendered chat does not contain its content")
    end = pos + len(content)
    eot = template.end_of_turn
    rest = text[end:]
    if eot and rest.lstrip(" \t\n").startswith(eot):
        end += len(rest) - len(rest.lstrip(" \t\n")) + len(eot)
    return start, end


def _prefix(template: ChatTemplate, before: list[Message]) -> str | None:
    """The rendered prompt before a turn, or None where the template cannot render it alone.

    An assistant turn that opens the conversation (a greeting) has no prompt before it, and transformers
    refuses an empty conversation; some templates refuse a prefix they would accept whole. Either way the
    turn is then found by its own text.
    """
    if not before:
        return None
    try:
        return template.render(before, generation_prompt=True)
    except TEMPLATE_REFUSALS:  # the template's own refusal of a prefix: locate the turn by its text instead
        return None


def _reasoning_block(text: str, start: int, end: int) -> Span | None:
    """The `<think>...</think>` block (with the whitespace after it) inside [start, end), if any."""
    open_at = text.find(THINK_OPEN, start, end)
    if open_at < 0:
        return None
    close_at = text.find(THINK_CLOSE, open_at, end)
    if close_at < 0:
        return None
    stop = close_at + len(THINK_CLOSE)
    while stop < end and text[stop] in " \t\n":
        stop += 1
    return open_at, stop


def tokenize_with_mask(tokenizer: Any, text: str, spans: list[Span]) -> Tokenized:
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = list(enc["input_ids"])
        mask = [int(any(a < e and b > s for s, e in spans)) if b > a else 0 for a, b in enc["offset_mapping"]]
        return Tokenized(ids, mask)
    return _tokenize_piecewise(tokenizer, text, spans)


def _tokenize_piecewise(tokenizer: Any, text: str, spans: list[Span]) -> Tokenized:
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for start, end in [*spans, (len(text), len(text))]:
        for piece, flag in ((text[cursor:start], 0), (text[start:end], 1)):
            if piece:
                piece_ids = tokenizer.encode(piece, add_special_tokens=False)
                ids += piece_ids
                mask += [flag] * len(piece_ids)
        cursor = end
    return Tokenized(ids, mask)


def tokenize_conversation(
    template: ChatTemplate, messages: list[Message], loss_on_reasoning: bool = True
) -> Tokenized:
    """Input ids and loss mask (1 on assistant tokens, their end-of-turn marker included).

    A conversation the template refuses, or that has nothing to train on, is a RowError (a counted skip);
    any other exception is a bug and fails the stage.
    """
    return _tokenize(template, messages, loss_on_reasoning)


def _tokenize(template: ChatTemplate, messages: list[Message], loss_on_reasoning: bool) -> Tokenized:
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no_assistant_turn", "no assistant turn to train on")
    try:
        text = template.render(messages)
    except TEMPLATE_REFUSALS as exc:
        raise RowError("template_error", f"the chat template refused it: {exc}") from None
    spans = assistant_spans(template, messages, text, loss_on_reasoning)
    out = tokenize_with_mask(template.tokenizer, text, spans)
    if not any(out.loss_mask):
        raise RowError("no_assistant_turn", "no assistant token after tokenization")
    return out
