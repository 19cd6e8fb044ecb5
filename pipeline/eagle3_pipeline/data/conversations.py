"""Chat datasets in, normalized conversations out: OpenAI messages, ShareGPT, prompt-only rows or captured
records (eagle3_pipeline.data.captured).

Every row becomes `{"id", "messages": [...], "tools"?: [...], "category"?: ...}`. A message is `{"role",
"content"}` with roles system, user, assistant and tool; an assistant turn may add `reasoning_content` and
`tool_calls` (each `{"id"?, "type": "function", "function": {"name", "arguments": {...}}}`, the arguments
decoded from their JSON text as vLLM hands them to a chat template), a tool turn `tool_call_id` and `name`. A
row's `tools` (the function schemas, a list or its JSON text) are what the chat template is rendered with; its
`category` (or the file it came from, in a directory of files: `category_of`) is what evaluate reports
acceptance by. Rows that cannot be read that way are counted by reason, never silently dropped.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from eagle3_contract.api.categories import CATEGORY_MAX_LENGTH
from eagle3_pipeline.data import captured
from eagle3_pipeline.data.dataset_files import COMPRESSIONS, DATA_SUFFIXES, read_rows
from eagle3_pipeline.data.json_rows import RowError as RowError
from eagle3_pipeline.data.json_rows import value_error

logger = logging.getLogger(__name__)

Message = dict[str, Any]
Conversation = dict[str, Any]
FUNCTION_CALL = "function_call"  # a ShareGPT turn whose value is the assistant's call(s), as JSON text
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
    FUNCTION_CALL: "assistant",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
}
MESSAGE_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",  # OpenAI's legacy function result: {"role": "function", "name", "content"}
}
EXAMPLES_PER_REASON = 5
EXAMPLE_CHARS = 300  # of one example's id and detail: a row may hold anything, the log line stays short


def printable(text: str) -> str:
    """`text` as UTF-8 can carry it: a lone surrogate (JSON's "\\ud800") shown as its escape, not raised
    later by a log handler or a file write."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class Skips:
    """Rows skipped, by reason, with a few example ids and details per reason."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, row_id: str, detail: str) -> None:
        self.counts[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append(printable(f"{row_id}: {detail}"[:EXAMPLE_CHARS]))

    def total(self) -> int:
        return sum(self.counts.values())


def detect_format(row: Any) -> str | None:
    if not isinstance(row, dict):
        return None
    if captured.is_record(row):
        return captured.CAPTURED
    if isinstance(row.get("messages"), list):
        return "messages"
    if isinstance(row.get("conversations"), list):
        return "sharegpt"
    if isinstance(row.get("prompt"), str):
        return "prompts"
    return None


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        if any(p.get("type", "text") != "text" for p in value):
            raise RowError("multimodal", f"{where} has non-text parts; only text conversations are supported")
        return "".join(str(p.get("text", "")) for p in value)
    raise RowError("malformed", f"{where} is {type(value).__name__}, expected a string")


def _message(raw: Any, index: int, roles: dict[str, str], role_key: str, content_key: str) -> Message:
    where = f"turn {index}"
    if not isinstance(raw, dict):
        raise RowError("malformed", f"{where} is not an object")
    source_role = str(raw.get(role_key, "")).lower()
    role = roles.get(source_role)
    if role is None:
        raise RowError(
            "malformed", f"{where} has {role_key} {raw.get(role_key)!r}, not one of {sorted(roles)}"
        )
    calls: list[dict[str, Any]] = []
    if source_role == FUNCTION_CALL:
        calls = _sharegpt_calls(raw.get(content_key), f"{where}.{content_key}")
        content = ""
    else:
        if role == "assistant":
            calls = _assistant_calls(raw, where)
        value = raw.get(content_key)
        # a turn that only calls tools has no text (OpenAI's null content): vLLM renders it as ""
        content = "" if value is None and calls else _text(value, f"{where}.{content_key}")
    message: Message = {"role": role, "content": content}
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if role == "assistant" and reasoning:
        message["reasoning_content"] = _text(reasoning, f"{where}.reasoning_content")
    if calls:
        message["tool_calls"] = calls
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if raw.get(key) is not None:
                message[key] = _tool_string(raw[key], f"{where}.{key}")
    return message


def _assistant_calls(raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An assistant turn's `tool_calls`, else its legacy `function_call` as one call; [] when it has none."""
    value = raw.get("tool_calls")
    if value is None or value == []:
        legacy = raw.get("function_call")
        if legacy is None:
            return []
        return [_tool_call({"type": "function", "function": legacy}, f"{where}.function_call", legacy=True)]
    if not isinstance(value, list):
        raise RowError("malformed", f"{where}.tool_calls is {type(value).__name__}, expected a list of calls")
    return [_tool_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(value)]


def _sharegpt_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """A ShareGPT `function_call` turn's value: JSON text of {"name", "arguments"} or a list of them."""
    parsed = _decoded(_text(value, where), where, " of a function call")
    calls = parsed if isinstance(parsed, list) else [parsed]
    if not calls:
        raise RowError("malformed", f"{where} is an empty list of calls")
    return [
        _tool_call(
            c if isinstance(c, dict) and "function" in c else {"function": c}, f"{where}[{j}]", legacy=True
        )
        for j, c in enumerate(calls)
    ]


def _tool_call(raw: Any, where: str, legacy: bool = False) -> dict[str, Any]:
    """One call as `{"id"?, "type": "function", "function": {"name", "arguments": {...}}}`."""
    if not isinstance(raw, dict):
        raise RowError("malformed", f"{where} is {type(raw).__name__}, expected an object")
    kind = raw.get("type", "function")
    if kind != "function":
        raise RowError("malformed", f"{where}.type is {kind!r}: only 'function' calls are supported")
    function = raw.get("function")
    at = where if legacy else f"{where}.function"
    if not isinstance(function, dict):
        raise RowError(
            "malformed", f"{at} is {type(function).__name__}, expected an object with name and arguments"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RowError("malformed", f"{at} has no name (name is {name!r})")
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": name, "arguments": _arguments(function.get("arguments"), f"{at}.arguments")},
    }
    if raw.get("id") is not None:
        call["id"] = _tool_string(raw["id"], f"{where}.id")
    return call


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments as the object chat templates expect (vLLM decodes the JSON text the same way);
    none at all is {}, as in vLLM."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = _decoded(value, where)
    if not isinstance(value, dict):
        raise RowError("malformed", f"{where} is {type(value).__name__}, expected a JSON object")
    return value


def _decoded(text: str, where: str, of: str = "") -> Any:
    """The JSON value of a field's text, or the RowError that names the field."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowError("malformed", f"{where} is not JSON{of} ({exc.msg})") from None
    except (RecursionError, ValueError) as exc:
        raise value_error(where, exc) from None


def _tool_string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RowError("malformed", f"{where} is {type(value).__name__}, expected a string")
    return value


def tools_of(row: Any) -> list[dict[str, Any]] | None:
    """The row's `tools` (the function schemas the chat template renders), a list or its JSON text."""
    value = row.get("tools") if isinstance(row, dict) else None
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        value = _decoded(value, "'tools'", " of a list of tools")
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RowError("malformed", f"'tools' is {type(value).__name__}, expected a list of tool objects")
    return value or None


def uses_tools(messages: list[Message]) -> bool:
    """Whether a conversation holds tool calls or tool turns."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def normalize(row: Any, fmt: str) -> list[Message]:
    """The row's messages, or RowError saying why the row cannot be used."""
    if isinstance(row, RowError):
        raise row
    row = _json_columns(row)
    if detect_format(row) is None:
        keys = sorted(map(str, row))[:6] if isinstance(row, dict) else type(row).__name__
        raise RowError("malformed", f"no 'messages', 'conversations' or 'prompt' field (found {keys})")
    if fmt == "prompts":
        if not isinstance(row.get("prompt"), str):
            raise RowError("malformed", "no 'prompt' string")
        system = row.get("system")
        head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
        messages = [*head, {"role": "user", "content": row["prompt"]}]
    elif fmt == "sharegpt":
        turns = row.get("conversations")
        if not isinstance(turns, list):
            raise RowError("malformed", "no 'conversations' list (is dataset.format right?)")
        messages = [_message(t, i, SHAREGPT_ROLES, "from", "value") for i, t in enumerate(turns)]
    elif fmt == captured.CAPTURED:
        turns = captured.turns_of(row)
        messages = [_message(t, i, MESSAGE_ROLES, "role", "content") for i, t in enumerate(turns)]
    else:
        turns = row.get("messages")
        if not isinstance(turns, list):
            raise RowError("malformed", "no 'messages' list (is dataset.format right?)")
        messages = [_message(t, i, MESSAGE_ROLES, "role", "content") for i, t in enumerate(turns)]
    return _checked(messages)


def _json_columns(row: Any) -> Any:
    """A row whose turns column holds a JSON string (common in Parquet exports), with the turns decoded."""
    if not isinstance(row, dict):
        return row
    for key in ("messages", "conversations"):
        value = row.get(key)
        if isinstance(value, str):
            try:
                turns = json.loads(value)
            except json.JSONDecodeError as exc:
                raise RowError(
                    "malformed", f"'{key}' is a string, not a list of turns (nor JSON text of one: {exc.msg})"
                ) from None
            except (RecursionError, ValueError) as exc:
                raise value_error(f"'{key}'", exc) from None
            if not isinstance(turns, list):
                raise RowError("malformed", f"'{key}' is a JSON string of {type(turns).__name__}, not a list")
            return {**row, key: turns}
    return row


def _checked(messages: list[Message]) -> list[Message]:
    if not messages:
        raise RowError("empty", "no turns")
    for i, m in enumerate(messages):
        # a tool may return nothing; an assistant turn may only call tools
        if m["role"] == "tool" or m.get("tool_calls"):
            continue
        if not m["content"].strip() and not m.get("reasoning_content"):
            raise RowError("empty", f"turn {i} ({m['role']}) is empty")
    if all(m["role"] == "system" for m in messages):
        raise RowError("empty", "only system turns")
    return messages


def load_conversations(
    source: str, split: str, fmt: str, max_samples: int | None = None
) -> tuple[list[Conversation], Skips, str]:
    """Normalized conversations (in source order), skipped rows, and the format(s) used.

    With format auto, each row's own layout decides, so a directory mixing ShareGPT and OpenAI-messages
    files loses nothing. Every row read is either returned or counted in the skips.
    """
    skips = Skips()
    out: list[Conversation] = []
    formats: Counter[str] = Counter()
    for conv, row_format in conversations_of(read_rows(source, split), fmt, skips):
        formats[row_format] += 1
        out.append(conv)
        if max_samples is not None and len(out) >= max_samples:
            break
    return out, skips, format_label(formats, fmt)


def format_label(formats: Counter[str], fmt: str) -> str:
    """The format(s) the rows were read as: `messages+sharegpt` for a mix; the asked format for no rows."""
    return "+".join(sorted(formats)) or (fmt if fmt != "auto" else "messages")


def conversations_of(
    rows: Iterable[tuple[str, Any]], fmt: str, skips: Skips
) -> Iterator[tuple[Conversation, str]]:
    """(conversation, its format) for each row that is one; every other row counted in `skips` with its id
    and the cause (a RowError: the documented row problems). Any other exception is a bug in this code,
    not in the row: it fails the stage with its traceback rather than turning every row into a skip."""
    ids = UniqueIds()
    for position, row in rows:
        row_id = ids.claim(_row_id(position, row))
        try:
            row_format = fmt if fmt != "auto" else detect_format(_decodable(row)) or "messages"
            conv = {"id": row_id, "messages": normalize(row, row_format)}
            tools = tools_of(_decodable(row))
            if tools is not None:
                conv["tools"] = tools
            category = category_of(position, row, row_format)
            if category is not None:
                conv["category"] = category
            _check_encodable(conv)
        except RowError as exc:
            skips.add(exc.reason, row_id, str(exc))
            continue
        yield conv, row_format


def category_of(position: str, row: Any, row_format: str | None = None) -> str | None:
    """The row's category (evaluate reports acceptance per category: eagle3_contract.api.categories): its
    own `category` (a non-blank string), else `captured` for a captured record (its file is a pod's segment,
    no category), else the file it came from when it was read from a directory (`position` is then
    `<file>:<row>`), without the data suffixes; None otherwise."""
    value = row.get("category") if isinstance(row, dict) else None
    if isinstance(value, str) and value.strip():
        return value.strip()[:CATEGORY_MAX_LENGTH].strip()
    if row_format == captured.CAPTURED:
        return captured.CAPTURED
    file, separator, _ = position.rpartition(":")
    if not separator or not file:
        return None
    name = PurePosixPath(file)
    while name.suffix.lower() in (*DATA_SUFFIXES, *COMPRESSIONS) and name.stem:
        name = name.with_suffix("")
    return str(name)[:CATEGORY_MAX_LENGTH].strip() or None


def _row_id(position: str, row: Any) -> str:
    """The row's own `id` (a string or an integer), else its position in the files."""
    if isinstance(row, dict) and isinstance(row.get("id"), str | int) and not isinstance(row["id"], bool):
        return str(row["id"])
    return position


def _check_encodable(conv: Conversation) -> None:
    """A conversation whose text UTF-8 cannot carry (a lone surrogate from a "\\ud800" escape) is no text:
    it could be neither tokenized nor written, so it is skipped here, by name."""
    try:
        json.dumps(conv, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode()
        raise RowError("encoding", f"holds {bad}, a lone UTF-16 surrogate, which is not text") from None


def _decodable(row: Any) -> Any:
    try:
        return _json_columns(row)
    except RowError:
        return row


class UniqueIds:
    """Row ids made unique: ids key the split and regeneration's resume, so no two rows may share one."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.next: dict[str, int] = {}  # per id, the suffix below which every `id#n` is taken

    def claim(self, row_id: str) -> str:
        """`row_id`, else `row_id#n` with the smallest n >= 2 not taken. The search for an id resumes where
        the last one ended (the numbers below it stay taken), so N rows that share one id cost O(N), not
        O(N^2): an export whose id field is constant is read in linear time."""
        if row_id not in self.used:
            self.used.add(row_id)
            return row_id
        n = self.next.get(row_id, 2)
        while f"{row_id}#{n}" in self.used:
            n += 1
        self.next[row_id] = n + 1
        unique = f"{row_id}#{n}"
        self.used.add(unique)
        return unique


def prompt_of(messages: list[dict[str, Any]]) -> list[Message] | None:
    """The conversation up to its first assistant turn (role and content only); None if it has no user turn
    to answer there."""
    prompt: list[Message] = []
    for message in messages:
        if message.get("role") == "assistant":
            break
        prompt.append({"role": str(message.get("role")), "content": str(message.get("content", ""))})
    if not prompt or prompt[-1]["role"] != "user":
        return None
    return prompt
