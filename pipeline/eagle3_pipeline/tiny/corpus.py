"""The procedural chat corpus the tiny verifier is pretrained on, and the example dataset drawn from it.

A conversation is one to three structured requests (see `tasks`), sometimes after a system message. The
answer depends only on the request, so the verifier's greedy predictions are confident and regular, which is
what lets an EAGLE-3 draft trained on it reach a high acceptance length. Two deterministic rules shape each
answer: a request containing "please" is answered with "Sure! " first, and one ending in " Thanks!" ends with
" Happy to help!". A request ending in " Think step by step." gets an assistant `reasoning_content` (a short
numbered step list, rendered by the chat template inside `<think>` ... `</think>`).

The example dataset's rows carry a `category`: the task kind of their first request (`count`, `add`, ...:
`tasks.TASKS`), the categories evaluate reports acceptance by.

Everything is a pure function of a seed: the same seed gives the same conversations, byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from eagle3_pipeline.tiny.tasks import Turn, again, random_turn

Message = dict[str, str]

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a friendly assistant.",
    "You are a concise assistant. Answer briefly.",
)
THINK_SUFFIX = " Think step by step."
THANKS_SUFFIX = " Thanks!"
POLITE_OPENER = "Sure! "
CLOSER = " Happy to help!"
SYSTEM_RATE, MULTI_TURN_RATE, REASONING_RATE, THANKS_RATE, AGAIN_RATE = 0.25, 0.45, 0.15, 0.08, 0.12


def assistant_content(turn: Turn, thanks: bool = False) -> str:
    """The answer to `turn.request` as the verifier gives it (the opener and closer rules included)."""
    opener = POLITE_OPENER if "please" in turn.request.lower() else ""
    return f"{opener}{turn.answer}{CLOSER if thanks else ''}"


def turn_messages(turn: Turn, think: bool = False, thanks: bool = False) -> list[Message]:
    """The user request and the assistant answer of one turn."""
    request = turn.request + (THINK_SUFFIX if think else "") + (THANKS_SUFFIX if thanks else "")
    answer: Message = {"role": "assistant", "content": assistant_content(turn, thanks)}
    if think:
        answer["reasoning_content"] = turn.reasoning
    return [{"role": "user", "content": request}, answer]


def conversation(rng: random.Random) -> list[Message]:
    """One conversation: optional system message, then one to three request/answer turns."""
    return categorized(rng)[0]


def categorized(rng: random.Random) -> tuple[list[Message], str]:
    """One conversation and its category: the kind of its first request (the one evaluate asks)."""
    messages: list[Message] = []
    kinds: list[str] = []
    if rng.random() < SYSTEM_RATE:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = rng.choice((2, 3)) if rng.random() < MULTI_TURN_RATE else 1
    think_at = rng.randrange(turns) if rng.random() < REASONING_RATE else -1
    previous: Turn | None = None
    for index in range(turns):
        turn = again(previous) if previous is not None and rng.random() < AGAIN_RATE else random_turn(rng)
        messages += turn_messages(turn, think=index == think_at, thanks=rng.random() < THANKS_RATE)
        kinds.append(turn.kind)
        previous = turn
    return messages, kinds[0]


def conversations(seed: int) -> Iterator[list[Message]]:
    """An endless, deterministic stream of conversations."""
    rng = random.Random(seed)
    while True:
        yield conversation(rng)


def sample(seed: int, count: int) -> list[list[Message]]:
    stream = conversations(seed)
    return [next(stream) for _ in range(count)]


def categorized_sample(seed: int, count: int) -> list[tuple[list[Message], str]]:
    """`sample`'s conversations (the same ones) with their categories."""
    rng = random.Random(seed)
    return [categorized(rng) for _ in range(count)]


def messages_row(messages: list[Message], category: str | None = None) -> dict[str, Any]:
    """OpenAI messages format."""
    return {"messages": messages} | ({"category": category} if category else {})


def sharegpt_row(messages: list[Message], category: str | None = None) -> dict[str, Any]:
    """ShareGPT format; reasoning has no ShareGPT field and is dropped."""
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    turns = [{"from": names[m["role"]], "value": m["content"]} for m in messages]
    return {"conversations": turns} | ({"category": category} if category else {})


def prompt_row(messages: list[Message], category: str | None = None) -> dict[str, Any]:
    """The first user turn, as a bare prompt."""
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    return {"prompt": prompt} | ({"category": category} if category else {})
