"""Raw rows of a chat dataset: local JSON Lines, JSON arrays and Parquet (plain or compressed), or the Hub.

A row that cannot be read (a line that is not JSON, bytes that are not UTF-8) is yielded as a `RowError`
in its place, so the caller counts it as a skip instead of losing it silently or failing the stage. Text is
never decoded with replacement characters: they would be trained on. Hidden files and anything under a
hidden directory (`.ipynb_checkpoints/`, `.git/`) are not part of a dataset directory.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import importlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
COMPRESSIONS = (".gz", ".zst")
BOM = "\ufeff"


class RowError(ValueError):
    """Why one row is skipped; `reason` is the counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def data_kind(path: Path) -> tuple[str, str] | None:
    """(data suffix, compression suffix or "") of a dataset file, or None for a file that is not data."""
    suffixes = path.suffixes[-2:]
    if suffixes and suffixes[-1] in DATA_SUFFIXES:
        return suffixes[-1], ""
    if len(suffixes) == 2 and suffixes[0] in DATA_SUFFIXES and suffixes[1] in COMPRESSIONS:
        return suffixes[0], suffixes[1]
    return None


def dataset_files(directory: Path) -> list[Path]:
    """The data files of a directory, sorted; hidden files and hidden directories' contents left out."""
    files = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_file() and data_kind(path) is not None:
            files.append(path)
    return files


def local_fingerprint(source: str) -> str | None:
    """A hash of the local dataset files' paths, sizes and mtimes; None for a Hub id or a missing path.

    Stages are keyed by the spec, not by the files: this lets `eagle3 run` notice a dataset edited in place
    under a cached prepare output (the cluster cannot: the operator does not read the volume).
    """
    path = Path(source)
    if path.is_dir():
        files = dataset_files(path)
    elif path.is_file():
        files = [path]
    else:
        return None
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(
            f"{file.relative_to(path) if file != path else ''}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
        )
    return digest.hexdigest()[:16]


def read_rows(source: str, split: str) -> Iterator[tuple[str, Any]]:
    """(row id, raw row or RowError) from a local file or directory, or a Hugging Face dataset id."""
    path = Path(source)
    if path.is_dir():
        files = dataset_files(path)
        if not files:
            raise StageError(
                f"dataset.source {source}: a directory without .jsonl, .json or .parquet files "
                "(optionally .gz or .zst compressed; hidden files and directories are not read)"
            )
        for file in files:
            yield from read_file(file, prefix=f"{file.relative_to(path)}:")
    elif path.is_file():
        yield from read_file(path, prefix="")
    elif source.startswith(("/", ".")) or data_kind(path) is not None:
        raise StageError(f"dataset.source {source}: no such file or directory")
    else:
        yield from _read_hub(source, split)


def read_file(path: Path, prefix: str) -> Iterator[tuple[str, Any]]:
    kind, compression = data_kind(path) or (path.suffix, "")
    if kind == ".parquet":
        import pyarrow.parquet as pq

        with _open(path, compression) as f:
            table = pq.read_table(f)
        for i, row in enumerate(table.to_pylist()):
            yield f"{prefix}{i}", row
        return
    with _open(path, compression) as f:
        data = f.read()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    if kind == ".json" and data.lstrip().startswith(b"["):
        yield from _json_array(path, data, prefix)
        return
    for i, line in enumerate(data.split(b"\n")):
        if line.strip():
            yield f"{prefix}{i + 1}", _json_line(line, i + 1)


def _open(path: Path, compression: str) -> IO[bytes]:
    try:
        if compression == ".gz":
            return cast(IO[bytes], gzip.open(path, "rb"))
        if compression == ".zst":
            return _open_zstd(path)
        return path.open("rb")
    except OSError as exc:
        raise StageError(f"dataset.source {path}: cannot read it ({exc})") from None


def _open_zstd(path: Path) -> IO[bytes]:
    try:
        zstandard = importlib.import_module("zstandard")  # optional: not a dependency of the pipeline
    except ImportError:
        raise StageError(
            f"dataset.source {path}: a .zst file needs the Python package 'zstandard', which is not "
            "installed in the pipeline image; install it, or recompress the file with gzip (.gz)"
        ) from None
    reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
    return reader


def _json_line(line: bytes, number: int) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RowError(
            "encoding", f"line {number} is not UTF-8 (byte {line[exc.start]:#04x} at column {exc.start + 1})"
        )
    try:
        return json.loads(text.removeprefix(BOM))  # a BOM opens each file of a concatenation, too
    except json.JSONDecodeError as exc:
        return RowError("malformed", f"line {number} is not JSON ({exc.msg})")


def _json_array(path: Path, data: bytes, prefix: str) -> Iterator[tuple[str, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StageError(
            f"dataset.source {path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
            "re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StageError(f"dataset.source {path}: not valid JSON ({exc})") from None
    for i, row in enumerate(rows):
        yield f"{prefix}{i}", row


def _read_hub(source: str, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    try:
        dataset = datasets.load_dataset(source, split=split)
    except Exception as exc:
        raise StageError(
            f"dataset.source {source}: not a local path, and loading it from the Hugging Face Hub failed "
            f"({type(exc).__name__}: {exc}); give a local .jsonl/.json/.parquet path, or check the id/split"
        ) from None
    for i, row in enumerate(dataset):
        yield str(i), row
