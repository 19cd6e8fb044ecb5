"""Raw rows of a chat dataset: local JSON Lines, JSON arrays and Parquet (plain or compressed), or the Hub.

A row that cannot be read (a line that is not JSON, bytes that are not UTF-8, nesting too deep to parse, an
integer too long to convert) is yielded as a `RowError` in its place, so the caller counts it as a skip
instead of losing it silently or failing the stage. Text is never decoded with replacement characters: they
would be trained on. A file that cannot be read at all (truncated or corrupt compression, a corrupt Parquet
file, a JSON document that is not a list of rows) fails the stage with one line that names it.

JSON Lines and Parquet are streamed (memory does not grow with the file); a `.json` file is read whole.

In a dataset directory every file is read or named as ignored, with the rule that ignored it (`Listing`):
hidden files and directories (`.git/`, `.ipynb_checkpoints/`) and files of other types are ignored; links
are followed when they stay inside the directory, and one that leads out of it fails the stage by name.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import importlib
import io
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from eagle3_pipeline.data.json_rows import RowError as RowError
from eagle3_pipeline.data.json_rows import json_array_rows, json_row
from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

# suffix (lower case) -> the layout read
DATA_SUFFIXES = {".jsonl": ".jsonl", ".ndjson": ".jsonl", ".json": ".json", ".parquet": ".parquet"}
COMPRESSIONS = (".gz", ".zst")
TYPES = "a .jsonl, .ndjson, .json or .parquet file, optionally .gz or .zst compressed"
PARQUET_BATCH_ROWS = 1024
SHOWN_PER_RULE = 5
# Ignore rules, as the warning names them.
HIDDEN = "hidden"
OTHER_TYPE = f"not {TYPES}"
LOOP = "a link to a directory read already"
NOT_REGULAR = "not a regular file (a broken link, a socket, a device)"


def data_kind(path: Path) -> tuple[str, str] | None:
    """(data layout suffix, compression suffix or "") of a dataset file, or None for a file that is not data.

    Suffixes are compared in lower case: `C.JSONL` and `b.ndjson` are JSON Lines."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in DATA_SUFFIXES:
        return DATA_SUFFIXES[suffixes[-1]], ""
    if len(suffixes) == 2 and suffixes[0] in DATA_SUFFIXES and suffixes[1] in COMPRESSIONS:
        return DATA_SUFFIXES[suffixes[0]], suffixes[1]
    return None


@dataclass
class Listing:
    """A dataset directory: the data files to read (sorted by path) and what is ignored, by rule."""

    root: Path
    files: list[Path] = field(default_factory=list)
    ignored: dict[str, list[str]] = field(default_factory=dict)

    def ignore(self, rule: str, relative: str) -> None:
        self.ignored.setdefault(rule, []).append(relative)

    def ignored_line(self) -> str | None:
        """One line naming what is not read and why; None when every file is read."""
        if not self.ignored:
            return None
        total = sum(len(names) for names in self.ignored.values())
        parts = []
        for rule, names in self.ignored.items():
            shown = ", ".join(repr(n) for n in names[:SHOWN_PER_RULE])
            more = f" and {len(names) - SHOWN_PER_RULE} more" if len(names) > SHOWN_PER_RULE else ""
            parts.append(f"{shown}{more} ({rule})")
        return f"dataset.source {self.root}: {total} not read: " + "; ".join(parts)


def list_dataset(root: Path) -> Listing:
    """Every entry under `root`, walked without recursion (any depth), links followed inside `root`."""
    real_root = root.resolve()
    listing = Listing(root)
    visited = {real_root}
    pending = [root]
    while pending:
        directory = pending.pop()
        for entry in sorted(directory.iterdir(), key=lambda p: p.name, reverse=True):
            relative = str(entry.relative_to(root))
            if entry.name.startswith("."):
                listing.ignore(HIDDEN, relative + ("/" if entry.is_dir() else ""))
                continue
            if entry.is_symlink():
                _check_link(root, real_root, entry, relative)
            if entry.is_dir():
                real = entry.resolve()
                if real in visited:
                    listing.ignore(LOOP, relative + "/")
                    continue
                visited.add(real)
                pending.append(entry)
            elif not entry.is_file():
                listing.ignore(NOT_REGULAR, relative)
            elif data_kind(entry) is None:
                listing.ignore(OTHER_TYPE, relative)
            else:
                listing.files.append(entry)
    listing.files.sort(key=lambda p: p.relative_to(root).parts)
    for names in listing.ignored.values():
        names.sort()
    return listing


def _check_link(root: Path, real_root: Path, link: Path, relative: str) -> None:
    target = link.resolve()
    if target != real_root and not target.is_relative_to(real_root):
        raise StageError(
            f"dataset.source {root}: {relative} is a link to {target}, outside the dataset directory; "
            "links are followed only inside it: copy the files in, or point dataset.source at a directory "
            "that holds them"
        )


def local_fingerprint(source: str) -> str | None:
    """A hash of the local dataset files' paths, sizes and mtimes; None for a Hub id or a missing path.

    Stages are keyed by the spec, not by the files: this lets `eagle3 run` notice a dataset edited in place
    under a cached prepare output (the cluster cannot: the operator does not read the volume).
    """
    path = Path(source)
    if path.is_dir():
        files = list_dataset(path).files
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
        listing = list_dataset(path)
        line = listing.ignored_line()
        if not listing.files:
            raise StageError(
                f"dataset.source {source}: a directory without data files ({TYPES}); "
                + (line or "it is empty")
            )
        if line:
            logger.warning("%s", line)
        for file in listing.files:
            yield from read_file(file, prefix=f"{file.relative_to(path)}:")
    elif path.is_file():
        yield from read_file(path, prefix="")
    elif source.startswith(("/", ".")) or data_kind(path) is not None:
        raise StageError(f"dataset.source {source}: no such file or directory")
    else:
        yield from _read_hub(source, split)


def read_file(path: Path, prefix: str) -> Iterator[tuple[str, Any]]:
    """The rows of one file; a file that cannot be read (as opposed to a row) is a StageError naming it."""
    kind, compression = data_kind(path) or (path.suffix.lower(), "")
    try:
        if kind == ".parquet":
            yield from _parquet_rows(path, compression, prefix)
        elif kind == ".json":
            with _open(path, compression) as f:
                yield from _json_file_rows(path, f.read(), prefix)
        else:
            with _open(path, compression) as f:
                yield from _json_lines(f, prefix)
    except StageError:
        raise
    except (EOFError, OSError, zlib.error) as exc:
        raise StageError(_unreadable(path, compression, exc)) from None
    except Exception as exc:  # pyarrow's and zstandard's own errors: the file, not a row, is broken
        if type(exc).__module__.split(".")[0] not in ("pyarrow", "zstandard"):
            raise
        raise StageError(_unreadable(path, compression, exc)) from None


def _unreadable(path: Path, compression: str, exc: BaseException) -> str:
    what = {".gz": "gzip", ".zst": "zstd"}.get(compression)
    if isinstance(exc, EOFError):
        cause = (
            f"the {what} stream ends early (a truncated file)" if what else "it ends early (a truncated file)"
        )
    elif isinstance(exc, gzip.BadGzipFile | zlib.error) or type(exc).__name__ == "ZstdError":
        cause = f"not valid {what} data ({exc})"
    elif ".parquet" in [s.lower() for s in path.suffixes]:
        cause = f"not a readable Parquet file ({type(exc).__name__}: {exc})"
    else:
        cause = f"{type(exc).__name__}: {exc}"
    return (
        f"dataset.source {path}: cannot read the file: {cause}; replace it with a complete copy or remove "
        "it, then run again (a retry of the same file fails the same way)"
    )


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


def _json_lines(f: IO[bytes], prefix: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(_lines(f), 1):
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8) :]
        if line.strip():
            yield f"{prefix}{number}", json_row(line, f"line {number}")


def _lines(f: IO[bytes]) -> Iterator[bytes]:
    """The lines of a JSON Lines file, whichever of LF, CR LF or a lone CR (classic Mac OS, some exports)
    ends them: JSON text holds no raw line end (one inside a string is escaped), so each is a row boundary.
    As bytes, so that a row that is not UTF-8 stays that row's problem: latin-1 maps every byte to one
    character and back, and the text layer's universal newlines find the ends."""
    for line in io.TextIOWrapper(f, encoding="latin-1", newline=None):
        yield line.encode("latin-1")


def _json_file_rows(path: Path, data: bytes, prefix: str) -> Iterator[tuple[str, Any]]:
    """A `.json` file: a JSON array of rows, JSON Lines, or one row; any other document is refused once."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    if data.lstrip().startswith(b"["):
        yield from json_array_rows(path, data, prefix)
        return
    document = json_row(data, "the file")  # one JSON value, on one line or written over several
    if isinstance(document, dict) and _looks_like_a_row(document):
        yield f"{prefix}1", document
        return
    if isinstance(document, RowError) or not isinstance(document, dict):
        for number, line in enumerate(data.splitlines(), 1):  # JSON Lines (LF, CR LF or CR) or broken
            if line.strip():
                yield f"{prefix}{number}", json_row(line, f"line {number}")
        return
    keys = sorted(map(str, document))[:6]
    lists = [k for k in keys if isinstance(document[k], list)]
    hint = f" (rows under '{lists[0]}': jq -c '.{lists[0]}[]' {path.name} > rows.jsonl)" if lists else ""
    raise StageError(
        f"dataset.source {path}: the file's layout is neither a list of rows nor JSON Lines: it is one JSON "
        f"object with the keys {keys}; write its rows as a JSON array or one JSON object per line{hint}"
    )


def _looks_like_a_row(document: dict[str, Any]) -> bool:
    return any(key in document for key in ("messages", "conversations", "prompt"))


def _parquet_rows(path: Path, compression: str, prefix: str) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    with _open(path, compression) as f:
        parquet = pq.ParquetFile(f)
        index = 0
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield f"{prefix}{index}", row
                index += 1


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
