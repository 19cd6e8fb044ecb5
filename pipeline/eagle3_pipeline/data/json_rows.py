"""One JSON row at a time: whatever a row holds (bytes that are not UTF-8, nesting deeper than the parser
follows, an integer longer than Python converts, broken syntax) makes that row a `RowError`, never an
exception that ends the stage. A JSON array's elements are parsed one by one for the same reason."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_pipeline.runtime.errors import StageError

BOM = "\ufeff"
_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR_END = re.compile(r"[,\]\s]")


class RowError(ValueError):
    """Why one row is skipped; `reason` is the counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def json_row(line: bytes, where: str) -> Any:
    """The JSON value of one row's bytes, or the RowError that says why it cannot be read."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RowError(
            "encoding", f"{where} is not UTF-8 (byte {line[exc.start]:#04x} at column {exc.start + 1})"
        )
    try:
        return json.loads(text.removeprefix(BOM))  # a BOM opens each file of a concatenation, too
    except json.JSONDecodeError as exc:
        return RowError("malformed", f"{where} is not JSON ({exc.msg})")
    except (RecursionError, ValueError) as exc:
        return value_error(where, exc)


def value_error(where: str, exc: BaseException) -> RowError:
    """A row the parser cannot turn into values although it is JSON: too deep, or an integer too long."""
    if isinstance(exc, RecursionError):
        return RowError("malformed", f"{where} nests arrays or objects deeper than the JSON reader follows")
    return RowError("malformed", f"{where} holds a value Python cannot convert ({exc})")


def json_array_rows(path: Path, data: bytes, prefix: str) -> Iterator[tuple[str, Any]]:
    """The elements of a JSON array file, each parsed alone: an element too deep or with too long an
    integer is a RowError in its place; broken syntax, which hides where the next element starts, fails the
    file with its position."""
    try:
        text = data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        raise StageError(
            f"dataset.source {path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
            "re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    at = _skip(text, text.index("[") + 1)
    index = 0
    while at < len(text) and text[at] != "]":
        try:
            row, end = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise StageError(f"dataset.source {path}: not valid JSON ({exc})") from None
        except (RecursionError, ValueError) as exc:
            row, end = value_error(f"element {index}", exc), _element_end(path, text, at)
        yield f"{prefix}{index}", row
        index += 1
        at = _skip(text, end)
        if at < len(text) and text[at] == ",":
            at = _skip(text, at + 1)
        elif at >= len(text) or text[at] != "]":
            raise StageError(f"dataset.source {path}: not valid JSON (expected ',' or ']' at offset {at})")
    if at >= len(text) or _skip(text, at + 1) != len(text):
        raise StageError(
            f"dataset.source {path}: not valid JSON (the array does not end where the file does)"
        )


def _skip(text: str, at: int) -> int:
    match = _WHITESPACE.match(text, at)
    return match.end() if match else at


def _element_end(path: Path, text: str, start: int) -> int:
    """Where the element at `start` ends, found without recursion (it is too deep for the parser)."""
    if text[start] not in "[{":
        match = _SCALAR_END.search(text, start)
        return match.start() if match else len(text)
    depth, at = 0, start
    while (match := _BRACKET_OR_QUOTE.search(text, at)) is not None:
        char = match.group()
        if char == '"':
            string = _STRING.match(text, match.start())
            if string is None:
                break
            at = string.end()
            continue
        depth += 1 if char in "[{" else -1
        at = match.end()
        if depth == 0:
            return at
    raise StageError(
        f"dataset.source {path}: not valid JSON (an element opened at offset {start} never closes)"
    )
