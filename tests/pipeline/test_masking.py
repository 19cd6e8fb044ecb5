"""Assistant-only loss masks through real chat templates of several families."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_pipeline.data.conversations import RowError
from eagle3_pipeline.data.masking import (
    TOOL_CALLS,
    TOOL_CALLS_UNTRAINED,
    TOOL_RESULTS,
    ChatTemplate,
    tokenize_conversation,
)
from tests.pipeline.chat_templates import TEMPLATES, TOOL_TEMPLATES, make_tokenizer
from tests.pipeline.function_calling import RESULT, TOOLS

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hello world", "reasoning_content": "think one"},
    {"role": "user", "content": "count"},
    {"role": "assistant", "content": "one two three", "reasoning_content": "think two"},
]

EXPECTED = {
    "llama3": (
        "<think>\nthink one\n</think>\n\nhello world<|eot_id|>"
        "<think>\nthink two\n</think>\n\none two three<|eot_id|>"
    ),
    "chatml": "hello world<|im_end|>one two three<|im_end|>",
    "mistral": "hello world</s>one two three</s>",
    # Qwen3-style: only the last assistant turn carries its reasoning
    "qwen3": "hello world<|im_end|><think>\nthink two\n</think>\n\none two three<|im_end|>",
}
WITHOUT_REASONING = {
    "llama3": "hello world<|eot_id|>one two three<|eot_id|>",
    "chatml": "hello world<|im_end|>one two three<|im_end|>",
    "mistral": "hello world</s>one two three</s>",
    "qwen3": "hello world<|im_end|>one two three<|im_end|>",
}


def masked_text(tokenizer: Any, ids: list[int], mask: list[int], keep: int = 1) -> str:
    text: str = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == keep])
    return text


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def template(request: pytest.FixtureRequest) -> tuple[str, ChatTemplate]:
    return request.param, ChatTemplate(make_tokenizer(TEMPLATES[request.param]))


def test_every_assistant_turn_and_its_end_marker_is_trained(template: tuple[str, ChatTemplate]) -> None:
    name, chat = template
    out = tokenize_conversation(chat, CONVERSATION)
    assert masked_text(chat.tokenizer, out.input_ids, out.loss_mask) == EXPECTED[name]
    full = chat.tokenizer.decode(out.input_ids)
    assert full == chat.render(CONVERSATION), "the ids are the rendered conversation, special tokens included"


def test_the_reasoning_block_can_stay_in_context_but_out_of_the_loss(
    template: tuple[str, ChatTemplate],
) -> None:
    name, chat = template
    out = tokenize_conversation(chat, CONVERSATION, loss_on_reasoning=False)
    assert masked_text(chat.tokenizer, out.input_ids, out.loss_mask) == WITHOUT_REASONING[name]
    if "think two" in chat.render(CONVERSATION):
        assert "think two" in masked_text(chat.tokenizer, out.input_ids, out.loss_mask, keep=0)


def test_prompts_and_headers_are_never_trained(template: tuple[str, ChatTemplate]) -> None:
    _, chat = template
    out = tokenize_conversation(chat, CONVERSATION)
    context = masked_text(chat.tokenizer, out.input_ids, out.loss_mask, keep=0)
    for text in ("be brief" if "be brief" in chat.render(CONVERSATION) else "", "hello", "count"):
        assert text in context
    assert "assistant" not in masked_text(chat.tokenizer, out.input_ids, out.loss_mask)


class SlowTokenizer:
    """A tokenizer without offset mappings (like tiktoken-based remote-code ones)."""

    is_fast = False

    def __init__(self, fast: Any) -> None:
        self.fast = fast
        self.chat_template = fast.chat_template

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = self.fast.encode(text, add_special_tokens=add_special_tokens)
        return ids

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.fast.apply_chat_template(*args, **kwargs)


def test_slow_tokenizers_are_masked_piecewise_with_the_same_result(
    template: tuple[str, ChatTemplate],
) -> None:
    name, chat = template
    slow = ChatTemplate(SlowTokenizer(chat.tokenizer))
    out = tokenize_conversation(slow, CONVERSATION)
    assert masked_text(chat.tokenizer, out.input_ids, out.loss_mask) == EXPECTED[name]


def test_a_conversation_without_an_answer_is_refused_by_reason() -> None:
    chat = ChatTemplate(make_tokenizer(TEMPLATES["llama3"]))
    with pytest.raises(RowError) as caught:
        tokenize_conversation(chat, [{"role": "user", "content": "hello"}])
    assert caught.value.reason == "no_assistant_turn"


def test_a_template_that_refuses_the_roles_is_a_template_error() -> None:
    strict = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must start with user') }}{% endif %}"
    )
    chat = ChatTemplate(make_tokenizer(strict + TEMPLATES["mistral"]))
    with pytest.raises(RowError) as caught:
        tokenize_conversation(
            chat, [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]
        )
    assert caught.value.reason == "template_error"
    assert "roles must start with user" in str(caught.value)


def test_a_tokenizer_without_a_chat_template_is_refused() -> None:
    tok = make_tokenizer(TEMPLATES["llama3"])
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        ChatTemplate(tok)


ASSISTANT_FIRST = [
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "count"},
    {"role": "assistant", "content": "one two three"},
]


def test_an_assistant_first_conversation_is_masked_not_a_crash(template: tuple[str, ChatTemplate]) -> None:
    """Real dumps open with the assistant's greeting; the prefix before it is empty (issue 13, item 1)."""
    name, chat = template
    out = tokenize_conversation(chat, ASSISTANT_FIRST)
    trained = masked_text(chat.tokenizer, out.input_ids, out.loss_mask)
    assert "hello" in trained and "one two three" in trained, name
    assert "count" not in trained, name


def test_a_template_failing_on_a_prefix_falls_back_to_the_turns_text() -> None:
    picky = "{% if add_generation_prompt and messages|length == 1 %}{{ raise_exception('odd') }}{% endif %}"
    chat = ChatTemplate(make_tokenizer(picky + TEMPLATES["chatml"]))
    out = tokenize_conversation(chat, CONVERSATION[1:3])
    assert masked_text(chat.tokenizer, out.input_ids, out.loss_mask) == "hello world<|im_end|>"


def test_a_bug_while_tokenizing_is_raised_and_a_template_refusal_is_a_row_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 42: a bug in this code (here: an IndexError from the offsets) fails the stage; the template's
    own refusal of a conversation (jinja2's TemplateError) is that row's skip."""
    from jinja2 import TemplateError

    from eagle3_pipeline.data import masking

    def broken(*args: Any) -> Any:
        raise IndexError("offset out of range")

    chat = ChatTemplate(make_tokenizer(TEMPLATES["chatml"]))
    with monkeypatch.context() as patched:
        patched.setattr(masking, "tokenize_with_mask", broken)
        with pytest.raises(IndexError, match="offset out of range"):
            tokenize_conversation(chat, CONVERSATION[1:3])

    def refusing(messages: Any, generation_prompt: bool = False, tools: Any = None) -> str:
        raise TemplateError("Conversation roles must alternate user/assistant/user/assistant/...")

    monkeypatch.setattr(chat, "render", refusing)
    with pytest.raises(RowError) as caught:
        tokenize_conversation(chat, CONVERSATION[1:3])
    assert caught.value.reason == "template_error" and "must alternate" in str(caught.value)


# --- tool calls and tool turns (function-calling data) ------------------------------------------------------

WEATHER = {
    "id": "call00001",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}
TIME = {"id": "call00002", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}}
TOOL_CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [WEATHER]},
    {"role": "tool", "content": f"{RESULT} sunny", "tool_call_id": "call00001", "name": "get_weather"},
    {"role": "assistant", "content": "let me check the time too", "tool_calls": [TIME]},
    {"role": "tool", "content": f"{RESULT} noon", "tool_call_id": "call00002", "name": "get_time"},
    {"role": "assistant", "content": "It is sunny."},
]
HERMES_CALLS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
    'let me check the time too\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    "<|im_end|>",
]
# Where the template renders a call inside the turn its end-of-turn marker closes, the call is trained; where
# it does not, a turn that only calls is not trained at all (not even the marker), one with text trains that.
TOOL_EXPECTED = {
    "hermes": ("".join(HERMES_CALLS) + "It is sunny.<|im_end|>", TOOL_CALLS),
    "llama31": (  # the template drops a calling turn's text
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        '{"name": "get_time", "parameters": {"zone": "CET"}}<|eot_id|>It is sunny.<|eot_id|>',
        TOOL_CALLS,
    ),
    # closing a call with <|eom_id|>, the next <|eot_id|> would end the tool's answer: no call is trained
    "llama31_eom": ("It is sunny.<|eot_id|>", TOOL_CALLS_UNTRAINED),
    # no tool support: the calls are not in the text
    "llama3": ("let me check the time too<|eot_id|>It is sunny.<|eot_id|>", TOOL_CALLS_UNTRAINED),
    "chatml": ("let me check the time too<|im_end|>It is sunny.<|im_end|>", TOOL_CALLS_UNTRAINED),
    "mistral": ("let me check the time too</s>It is sunny.</s>", TOOL_CALLS_UNTRAINED),
    "qwen3": ("let me check the time too<|im_end|>It is sunny.<|im_end|>", TOOL_CALLS_UNTRAINED),
}


@pytest.fixture(scope="module", params=sorted(TOOL_EXPECTED))
def any_template(request: pytest.FixtureRequest) -> tuple[str, ChatTemplate]:
    source = {**TEMPLATES, **TOOL_TEMPLATES}[request.param]
    return request.param, ChatTemplate(make_tokenizer(source))


def trained_at(chat: ChatTemplate, text: str, mask: list[int], part: str) -> list[int]:
    """The mask of the tokens that overlap each occurrence of `part` in the rendered `text`."""
    offsets = chat.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans = [(at, at + len(part)) for at in range(len(text)) if text.startswith(part, at)]
    assert spans, f"{part!r} is not rendered"
    return [m for (a, b), m in zip(offsets, mask, strict=True) if any(a < e and b > s for s, e in spans)]


def test_tool_turns_are_context_and_tool_calls_are_trained_where_rendered(
    any_template: tuple[str, ChatTemplate],
) -> None:
    name, chat = any_template
    out = tokenize_conversation(chat, TOOL_CONVERSATION, tools=TOOLS)
    expected, kind = TOOL_EXPECTED[name]
    assert masked_text(chat.tokenizer, out.input_ids, out.loss_mask) == expected
    assert out.kind == kind
    text = chat.render(TOOL_CONVERSATION, tools=TOOLS)
    assert chat.tokenizer.decode(out.input_ids) == text, (
        "the ids are the conversation rendered with its tools"
    )
    for message in TOOL_CONVERSATION:  # no token of a tool's answer is trained, wherever it is rendered
        if message["role"] == "tool" and message["content"] in text:
            assert not any(trained_at(chat, text, out.loss_mask, message["content"]))
    if "the time in a zone" in text:  # the tool schemas are context too
        assert not any(trained_at(chat, text, out.loss_mask, "the time in a zone"))
    slow = ChatTemplate(SlowTokenizer(chat.tokenizer))
    assert tokenize_conversation(slow, TOOL_CONVERSATION, tools=TOOLS).loss_mask == out.loss_mask


def test_a_row_whose_turns_only_call_untrained_tools_is_refused_by_reason() -> None:
    calls_only = TOOL_CONVERSATION[:4]
    chat = ChatTemplate(make_tokenizer(TEMPLATES["chatml"]))
    with pytest.raises(RowError) as caught:
        tokenize_conversation(chat, calls_only)
    assert caught.value.reason == TOOL_CALLS_UNTRAINED and "does not render the calls" in str(caught.value)
    hermes = ChatTemplate(make_tokenizer(TOOL_TEMPLATES["hermes"]))
    out = tokenize_conversation(hermes, calls_only)
    assert masked_text(hermes.tokenizer, out.input_ids, out.loss_mask) == HERMES_CALLS[0]


def test_tool_turns_without_calls_are_context() -> None:
    """Hermes-style data whose calls are the assistant's own text: its tool turns stay out of the loss."""
    chat = ChatTemplate(make_tokenizer(TOOL_TEMPLATES["hermes"]))
    inline = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": '<tool_call>{"name": "get_weather"}</tool_call>'},
        {"role": "tool", "content": f"{RESULT} sunny"},
        {"role": "assistant", "content": "sunny"},
    ]
    out = tokenize_conversation(chat, inline)
    assert out.kind == TOOL_RESULTS
    assert masked_text(chat.tokenizer, out.input_ids, out.loss_mask) == (
        '<tool_call>{"name": "get_weather"}</tool_call><|im_end|>sunny<|im_end|>'
    )


def test_a_template_refusing_prefixes_finds_a_calling_turn_by_its_text_and_never_guesses() -> None:
    """Without the prompt before a turn, a calling turn is found by its text; one without text is left out."""
    picky = "{% if add_generation_prompt %}{{ raise_exception('no prefixes') }}{% endif %}"
    chat = ChatTemplate(make_tokenizer(picky + TOOL_TEMPLATES["hermes"]))
    out = tokenize_conversation(chat, TOOL_CONVERSATION, tools=TOOLS)
    assert (
        masked_text(chat.tokenizer, out.input_ids, out.loss_mask)
        == HERMES_CALLS[1] + "It is sunny.<|im_end|>"
    )
    assert out.kind == TOOL_CALLS_UNTRAINED


def test_reasoning_of_a_calling_turn_can_stay_out_of_the_loss() -> None:
    """dataset.lossOnReasoning false: a calling turn's <think> block is context, its text and call trained."""
    chat = ChatTemplate(make_tokenizer(TOOL_TEMPLATES["hermes"]))
    turn = {
        "role": "assistant",
        "content": "<think>\nweigh it\n</think>\n\nchecking",
        "tool_calls": [WEATHER],
    }
    messages = [TOOL_CONVERSATION[1], turn, TOOL_CONVERSATION[3], TOOL_CONVERSATION[6]]
    out = tokenize_conversation(chat, messages, loss_on_reasoning=False)
    trained = masked_text(chat.tokenizer, out.input_ids, out.loss_mask)
    assert "weigh it" not in trained and trained.startswith("checking\n<tool_call>")
