"""A small function-calling dataset in every layout prepare reads: OpenAI tool calls and tool turns, OpenAI's
legacy function_call and function turns, ShareGPT function_call and observation turns; and rows whose tool
fields are malformed, each with the reason prepare gives."""

from __future__ import annotations

import json
from typing import Any

Row = dict[str, Any]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "the time in a zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        },
    },
]
# Tool answers, argument values and tool schemas hold these words; no assistant text does.
RESULT = "toolresult"


def call(name: str, arguments: Row, call_id: str | None = None, as_text: bool = True) -> Row:
    """An OpenAI tool call; its arguments JSON text (OpenAI's wire format) or an object."""
    out: Row = {
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments) if as_text else arguments},
    }
    return out if call_id is None else {"id": call_id, **out}


def openai_calls_row(i: int) -> Row:
    """Two steps: a call without text (content null), then a call after some text, then the answer."""
    return {
        "id": f"fc{i}",
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"weather and time in city{i}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("get_weather", {"city": f"city{i}"}, f"w{i}")],
            },
            {"role": "tool", "tool_call_id": f"w{i}", "content": f"{RESULT} sunny {i}"},
            {
                "role": "assistant",
                "content": f"it is sunny in city{i}",
                "tool_calls": [call("get_time", {"zone": f"zone{i}"}, f"t{i}", as_text=False)],
            },
            {"role": "tool", "tool_call_id": f"t{i}", "content": f"{RESULT} noon {i}"},
            {"role": "assistant", "content": f"sunny at noon {i}"},
        ],
    }


def parallel_calls_row(i: int) -> Row:
    """Two calls in one turn, two tool turns answering them; tools as JSON text (as Parquet exports have)."""
    calls = [
        call("get_weather", {"city": f"city{i}"}, f"a{i}"),
        call("get_time", {"zone": f"zone{i}"}, f"b{i}"),
    ]
    return {
        "id": f"par{i}",
        "tools": json.dumps(TOOLS),
        "messages": [
            {"role": "user", "content": f"both for city{i}"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"a{i}", "content": f"{RESULT} rain {i}"},
            {"role": "tool", "tool_call_id": f"b{i}", "content": f"{RESULT} dusk {i}"},
            {"role": "assistant", "content": f"rain at dusk {i}"},
        ],
    }


def legacy_calls_row(i: int) -> Row:
    """OpenAI's legacy functions: an assistant function_call and a function turn."""
    return {
        "id": f"leg{i}",
        "messages": [
            {"role": "user", "content": f"weather in city{i}?"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": json.dumps({"city": f"city{i}"})},
            },
            {"role": "function", "name": "get_weather", "content": f"{RESULT} snow {i}"},
            {"role": "assistant", "content": f"snow today {i}"},
        ],
    }


def sharegpt_calls_row(i: int) -> Row:
    """ShareGPT as LLaMA-Factory writes function calling: function_call, observation, tools as text."""
    return {
        "id": f"sg{i}",
        "tools": json.dumps(TOOLS),
        "conversations": [
            {"from": "human", "value": f"weather in city{i}?"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "get_weather", "arguments": {"city": f"city{i}"}}),
            },
            {"from": "observation", "value": f"{RESULT} fog {i}"},
            {"from": "gpt", "value": f"foggy today {i}"},
        ],
    }


def calls_only_row(i: int) -> Row:
    """A row whose only assistant turn calls a tool: nothing to train where the template cannot render it."""
    return {
        "id": f"only{i}",
        "messages": [
            {"role": "user", "content": f"weather in city{i}?"},
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": f"city{i}"})]},
            {"role": "tool", "content": f"{RESULT} hail {i}"},
        ],
    }


def function_calling_rows(n: int) -> list[Row]:
    """n rows of each layout above but the calls-only one."""
    return [
        make(i)
        for i in range(n)
        for make in (openai_calls_row, parallel_calls_row, legacy_calls_row, sharegpt_calls_row)
    ]


def _with_turn(turn: Row) -> Row:
    return {"messages": [{"role": "user", "content": "q"}, turn, {"role": "assistant", "content": "a"}]}


def _with_call(bad: Any) -> Row:
    return _with_turn({"role": "assistant", "content": None, "tool_calls": [bad]})


# (row, the text its `malformed` skip names)
MALFORMED: list[tuple[Row, str]] = [
    (
        _with_turn({"role": "assistant", "content": None, "tool_calls": {"a": 1}}),
        "turn 1.tool_calls is dict, expected a list",
    ),
    (_with_call("get_weather"), "turn 1.tool_calls[0] is str, expected an object"),
    (
        _with_call({"type": "function", "function": {"arguments": "{}"}}),
        "turn 1.tool_calls[0].function has no name",
    ),
    (
        _with_call({"type": "function", "function": "get_weather"}),
        "turn 1.tool_calls[0].function is str, expected an object",
    ),
    (
        _with_call({"function": {"name": "f", "arguments": "{city"}}),
        "turn 1.tool_calls[0].function.arguments is not JSON",
    ),
    (
        _with_call({"function": {"name": "f", "arguments": "[1, 2]"}}),
        "arguments is list, expected a JSON object",
    ),
    (_with_call({"type": "custom", "custom": {"name": "f"}}), "turn 1.tool_calls[0].type is 'custom'"),
    (_with_call({"id": 7, "function": {"name": "f"}}), "turn 1.tool_calls[0].id is int, expected a string"),
    (
        _with_turn({"role": "assistant", "content": None, "function_call": {"arguments": "{}"}}),
        "turn 1.function_call has no name",
    ),
    (_with_turn({"role": "assistant", "content": None}), "turn 1.content is NoneType, expected a string"),
    (
        _with_turn({"role": "tool", "tool_call_id": 3, "content": "x"}),
        "turn 1.tool_call_id is int, expected a string",
    ),
    (_with_turn({"role": "tool", "content": None}), "turn 1.content is NoneType, expected a string"),
    (
        _with_turn({"role": "function", "name": ["f"], "content": "x"}),
        "turn 1.name is list, expected a string",
    ),
    (
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "function_call", "value": "get_weather(city)"},
            ]
        },
        "turn 1.value is not JSON of a function call",
    ),
    (
        {**_with_turn({"role": "assistant", "content": "x"}), "tools": {"a": 1}},
        "'tools' is dict, expected a list of tool objects",
    ),
    (
        {**_with_turn({"role": "assistant", "content": "x"}), "tools": "[{broken"},
        "'tools' is not JSON of a list of tools",
    ),
]
