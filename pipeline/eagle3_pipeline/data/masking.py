"""Token ids and the assistant-only loss mask of a conversation, through the verifier's own chat template.

The conversation is rendered once; each assistant turn is located in the rendered text (where the template's
generation prompt ends, or by its content when a template is not prefix-stable, e.g. one that rewrites earlier
turns), extended over the template's end-of-turn marker so the draft learns to stop, and mapped to tokens
by character offsets (fast tokenizers) or by tokenizing the text piecewise at span boundaries (slow ones, such
as tiktoken-based remote-code tokenizers). Reasoning blocks can stay in the context but out of the loss.

Tool turns (and the row's tool schemas) are context only. An assistant turn's tool calls are trained where the
template renders them inside the turn its end-of-turn marker closes (probed once per template): the turn then
runs from its start to that marker, text, calls and marker. Where it does not (a template without tool
support, or one that closes a call with another marker), the turn is its text alone, and a turn that only
calls tools has nothing to train: not even its end-of-turn marker, which the verifier never wrote there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from eagle3_pipeline.data.conversations import Message, RowError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_SENTINEL = "\x00EAGLE3-SENTINEL\x00"
# The tool call the template is probed with: a 9-character id (Mistral's templates refuse any other length)
_PROBE_NAME, _PROBE_ID = "eagle3_probe_function", "eagle3prb"
_PROBE_CALL = {"id": _PROBE_ID, "type": "function", "function": {"name": _PROBE_NAME, "arguments": {"a": 1}}}

# What a prepared row holds (prepare's `kept` counts):
CHAT = "chat"  # no tool calls, no tool turns
TOOL_CALLS = "tool_calls"  # tool calls, every one trained
TOOL_CALLS_UNTRAINED = "tool_calls_untrained"  # tool calls not all trained: not rendered, or not in the turn
TOOL_RESULTS = "tool_results"  # tool turns, no structured calls (calls written as the assistant's text)

Span = tuple[int, int]
# How a chat template refuses a conversation: jinja's TemplateError (a template's own `raise_exception` too),
# and transformers' ValueError. These are the row's problem; anything else raised while rendering is a bug.
TEMPLATE_REFUSALS = (TemplateError, ValueError)


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]
    kind: str = CHAT  # what the row holds: CHAT, TOOL_CALLS, TOOL_CALLS_UNTRAINED or TOOL_RESULTS


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
        self.closes_tool_calls = self._closes_tool_calls()

    def render(
        self, messages: list[Message], generation_prompt: bool = False, tools: list[Any] | None = None
    ) -> str:
        text: str = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, tools=tools
        )
        return text

    def _closes_tool_calls(self) -> bool:
        """Whether the template renders an assistant's tool call inside a turn that its end-of-turn marker
        closes before the tool's answer: only then is the turn up to that marker the assistant's own."""
        call = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
        answer = {"role": "tool", "content": _SENTINEL, "tool_call_id": _PROBE_ID, "name": _PROBE_NAME}
        try:
            probe = self.render([{"role": "user", "content": "u"}, call, answer])
        except TEMPLATE_REFUSALS:
            return False
        named = probe.find(_PROBE_NAME)
        closed = probe.find(self.end_of_turn, named) if named >= 0 and self.end_of_turn else -1
        return 0 <= closed < probe.find(_SENTINEL, named)


@dataclass(frozen=True)
class Spans:
    """The character spans the loss is computed on, and how many tool-calling turns keep their calls out."""

    spans: list[Span]
    untrained_calls: int = 0


def assistant_spans(
    template: ChatTemplate,
    messages: list[Message],
    text: str,
    loss_on_reasoning: bool,
    tools: list[Any] | None = None,
) -> Spans:
    """Character spans of the rendered `text` that the loss is computed on."""
    spans: list[Span] = []
    untrained = 0
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn = _locate(template, messages, i, text, cursor, tools)
        untrained += bool(message.get("tool_calls")) and (turn is None or not turn[2])
        if turn is None:  # a turn that only calls tools, and its calls are not trained: nothing to train
            continue
        start, end, _ = turn
        cursor = end
        block = _reasoning_block(text, start, end) if not loss_on_reasoning else None
        if block is None:
            spans.append((start, end))
        else:
            spans += [s for s in ((start, block[0]), (block[1], end)) if s[0] < s[1]]
    if not spans:
        if untrained:
            raise RowError(
                TOOL_CALLS_UNTRAINED,
                "its assistant turns only call tools, and the verifier's chat template does not render the "
                "calls inside the assistant's turn: nothing to train",
            )
        raise RowError("no_assistant_turn", "no assistant turn to train on")
    return Spans(spans, untrained)


def _locate(
    template: ChatTemplate,
    messages: list[Message],
    i: int,
    text: str,
    cursor: int,
    tools: list[Any] | None,
) -> tuple[int, int, bool] | None:
    """(start, end, whether its tool calls are inside) of assistant turn `i`; None for a turn that only calls
    tools whose calls are not trained."""
    message = messages[i]
    calls = message.get("tool_calls") or []
    prompt = _prefix(template, messages[:i], tools)
    if prompt is not None and text.startswith(prompt) and len(prompt) >= cursor:
        start = len(prompt)
    else:  # not prefix-stable: find the turn by its own text
        # the reasoning where the template renders it, else the answer (templates may drop old reasoning)
        heads = [h.strip()[:64] for h in (message.get("reasoning_content"), message["content"]) if h]
        start = next((at for at in (text.find(h, cursor) for h in heads if h) if at >= 0), -1)
        if start < 0:
            if calls:  # a turn whose calls cannot be located: its calls are not guessed at
                return None
            raise RowError("template_mismatch", f"turn {i}: the rendered chat does not contain its text")
        head = text.rfind(THINK_OPEN, cursor, start)
        if head >= 0 and not text[head + len(THINK_OPEN) : start].strip():
            start = head  # the reasoning block's opening tag belongs to the answer
    eot = template.end_of_turn
    content = message["content"].strip()
    if calls:
        closed = text.find(eot, start) if eot else -1
        inside = closed >= 0 and all(c["function"]["name"] in text[start:closed] for c in calls)
        if inside and template.closes_tool_calls:
            return start, closed + len(eot), True  # text, calls and the marker that closes them
        # its calls are not trained: the turn is its text alone, where the template renders that text
        if not content or content not in text[start : closed if closed >= 0 else len(text)]:
            return None
    pos = text.find(content, start) if content else start
    if pos < 0:
        raise RowError("template_mismatch", f"turn {i}: the rendered chat does not contain its content")
    end = pos + len(content)
    rest = text[end:]
    if eot and rest.lstrip(" \t\n").startswith(eot):
        end += len(rest) - len(rest.lstrip(" \t\n")) + len(eot)
    return start, end, False


def _prefix(template: ChatTemplate, before: list[Message], tools: list[Any] | None = None) -> str | None:
    """The rendered prompt before a turn, or None where the template cannot render it alone.

    An assistant turn that opens the conversation (a greeting) has no prompt before it, and transformers
    refuses an empty conversation; some templates refuse a prefix they would accept whole. Either way the
    turn is then found by its own text.
    """
    if not before:
        return None
    try:
        return template.render(before, generation_prompt=True, tools=tools)
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
    template: ChatTemplate,
    messages: list[Message],
    loss_on_reasoning: bool = True,
    tools: list[Any] | None = None,
) -> Tokenized:
    """Input ids and loss mask (1 on assistant tokens, their end-of-turn marker included), the conversation
    rendered with the row's `tools`.

    A conversation the template refuses, or that has nothing to train on, is a RowError (a counted skip);
    any other exception is a bug and fails the stage.
    """
    return _tokenize(template, messages, loss_on_reasoning, tools)


def _tokenize(
    template: ChatTemplate, messages: list[Message], loss_on_reasoning: bool, tools: list[Any] | None
) -> Tokenized:
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no_assistant_turn", "no assistant turn to train on")
    try:
        text = template.render(messages, tools=tools)
    except TEMPLATE_REFUSALS as exc:
        raise RowError("template_error", f"the chat template refused it: {exc}") from None
    found = assistant_spans(template, messages, text, loss_on_reasoning, tools)
    out = tokenize_with_mask(template.tokenizer, text, found.spans)
    if not any(out.loss_mask):
        raise RowError("no_assistant_turn", "no assistant token after tokenization")
    return Tokenized(out.input_ids, out.loss_mask, _kind(messages, found.untrained_calls))


def _kind(messages: list[Message], untrained_calls: int) -> str:
    if untrained_calls:
        return TOOL_CALLS_UNTRAINED
    if any(m.get("tool_calls") for m in messages):
        return TOOL_CALLS
    return TOOL_RESULTS if any(m["role"] == "tool" for m in messages) else CHAT
