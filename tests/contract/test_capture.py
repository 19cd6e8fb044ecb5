"""serving.capture's middleware (eagle3_contract.capture) against a fake ASGI app: what it records,
what it leaves alone, its bounds, and a kill in the middle of writing."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.capture import config as capture_config
from eagle3_contract.capture.config import MIDDLEWARE, PACKAGE, CaptureConfig, Exchange
from eagle3_contract.capture.middleware import CaptureMiddleware
from eagle3_contract.capture.recorder import Recorder
from eagle3_contract.capture.records import record_of
from eagle3_contract.capture.segments import SegmentStore, read_records, segments

MESSAGES = [{"role": "user", "content": "Spell 'cat'."}]
SPEC = {
    "mean_acceptance_length": 2.5,
    "draft_acceptance_rate": 0.5,
    "num_draft_tokens": 6,
    "num_accepted_draft_tokens": 3,
}


def answer(content: str = "c-a-t", metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
    }
    if metrics is not None:
        body["metrics"] = metrics
    return body


def stream(parts: list[str], metrics: dict[str, Any] | None) -> bytes:
    chunks = [{"model": "tiny", "choices": [{"index": 0, "delta": {"content": p}}]} for p in parts]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    chunks.append({"model": "tiny", "choices": [], "metrics": metrics})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class FakeApp:
    """An ASGI app that reads the request and answers `body` (in pieces, as a stream does)."""

    def __init__(self, body: bytes, status: int = 200, content_type: bytes = b"application/json") -> None:
        self.body, self.status, self.content_type = body, status, content_type
        self.received: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            self.received.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", self.content_type)],
            }
        )
        half = len(self.body) // 2
        await send({"type": "http.response.body", "body": self.body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": self.body[half:]})


def call(middleware: CaptureMiddleware, request: dict[str, Any], path: str = "/v1/chat/completions") -> bytes:
    raw = json.dumps(request).encode()
    pieces = [
        {"type": "http.request", "body": raw[:10], "more_body": True},
        {"type": "http.request", "body": raw[10:]},
    ]
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return pieces.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    scope = {"type": "http", "method": "POST", "path": path}
    asyncio.run(middleware(scope, receive, send))
    return b"".join(sent)


def config(tmp_path: Path, **changes: Any) -> CaptureConfig:
    return CaptureConfig(directory=tmp_path / "capture", source="vllm-0", **changes)


def test_a_chat_is_recorded_with_its_answer_and_vllms_acceptance(tmp_path: Path) -> None:
    recorder = Recorder(config(tmp_path))
    app = FakeApp(json.dumps(answer(metrics={"speculative_decoding": SPEC})).encode())
    returned = call(CaptureMiddleware(app, recorder), {"model": "tiny", "messages": MESSAGES})
    recorder.close()
    assert json.loads(returned) == answer(metrics={"speculative_decoding": SPEC}), (
        "the answer passes untouched"
    )
    assert b"".join(app.received) == json.dumps({"model": "tiny", "messages": MESSAGES}).encode()
    [record] = read_records(tmp_path / "capture")
    assert record["messages"] == MESSAGES and record["response"] == {"role": "assistant", "content": "c-a-t"}
    assert (record["acceptanceLength"], record["draftTokens"], record["acceptedTokens"]) == (2.5, 6, 3)
    assert record["finishReason"] == "stop" and record["model"] == "tiny"
    assert abs(time.time() - _epoch(record["servedAt"])) < 60
    assert recorder.counters.records == {"written": 1, "dropped": 0, "skipped": 0, "failed": 0}


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_stream_is_reassembled_and_its_final_chunk_gives_the_acceptance() -> None:
    body = stream(["c-", "a-", "t"], {"speculative_decoding": SPEC})
    record = record_of(
        Exchange(0.0, json.dumps({"messages": MESSAGES, "stream": True}).encode(), body, 200, True)
    )
    assert (
        record is not None and record["response"]["content"] == "c-a-t" and record["acceptanceLength"] == 2.5
    )
    # a client that did not ask for usage gets no final chunk: the record has no acceptance, not a wrong one
    bare = stream(["c-a-t"], None)
    record = record_of(Exchange(0.0, json.dumps({"messages": MESSAGES}).encode(), bare, 200, True))
    assert (
        record is not None and "acceptanceLength" not in record and record["response"]["content"] == "c-a-t"
    )


def test_the_requests_tools_are_kept_for_the_chat_template_to_render() -> None:
    tools = [{"type": "function", "function": {"name": "spell", "parameters": {"type": "object"}}}]
    request = json.dumps({"messages": MESSAGES, "tools": tools}).encode()
    record = record_of(Exchange(0.0, request, json.dumps(answer()).encode(), 200, False))
    assert record is not None and record["tools"] == tools
    plain = record_of(
        Exchange(0.0, json.dumps({"messages": MESSAGES}).encode(), json.dumps(answer()).encode(), 200, False)
    )
    assert plain is not None and "tools" not in plain


def test_errors_and_several_choices_are_not_records() -> None:
    request = json.dumps({"messages": MESSAGES}).encode()
    assert record_of(Exchange(0.0, request, b'{"error": "x"}', 400, False)) is None
    several = json.dumps({"messages": MESSAGES, "n": 2}).encode()
    assert record_of(Exchange(0.0, several, json.dumps(answer()).encode(), 200, False)) is None
    assert record_of(Exchange(0.0, b'{"prompt": "x"}', json.dumps(answer()).encode(), 200, False)) is None


def test_requests_not_sampled_and_other_paths_pass_through_untouched(tmp_path: Path) -> None:
    recorder = Recorder(config(tmp_path, sample_rate=0.25))
    app = FakeApp(json.dumps(answer()).encode())
    middleware = CaptureMiddleware(app, recorder, random.Random(7))
    for _ in range(200):
        call(middleware, {"messages": MESSAGES})
    call(middleware, {"prompt": "x"}, path="/v1/completions")
    recorder.close()
    written = recorder.counters.records["written"]
    assert 30 <= written <= 70, written  # 200 at 0.25: 50 expected (seeded)
    assert len(read_records(tmp_path / "capture")) == written
    nothing = Recorder(config(tmp_path / "off", sample_rate=0.0))
    call(CaptureMiddleware(FakeApp(json.dumps(answer()).encode()), nothing), {"messages": MESSAGES})
    assert nothing.thread is None, "nothing sampled: no thread, no directory"


def test_a_full_queue_drops_and_never_blocks_the_request(tmp_path: Path) -> None:
    recorder = Recorder(config(tmp_path, queue_items=2))
    recorder._ensure_started = lambda: None  # type: ignore[method-assign]  # no writer: the queue fills
    exchange = Exchange(0.0, b"{}", b"{}", 200, False)
    for _ in range(1000):  # with no writer, an offer that waited on the full queue would never return
        recorder.offer(exchange)
    assert recorder.queue.qsize() == 2 and recorder.counters.records["dropped"] == 998


def test_an_answer_over_the_body_bound_is_dropped_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(capture_config, "MAX_BODY_BYTES", 64)
    recorder = Recorder(config(tmp_path))
    app = FakeApp(json.dumps(answer("x" * 200)).encode())
    assert len(call(CaptureMiddleware(app, recorder), {"messages": MESSAGES})) > 200, "the client gets it all"
    recorder.close()
    assert recorder.counters.records["dropped"] == 1 and read_records(tmp_path / "capture") == []


def _segment(store: SegmentStore, lines: int, age_s: float, now: float) -> Path:
    path = store.write([b'{"n": 1}\n'] * lines, now - age_s)
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_pruning_deletes_past_the_retention_then_the_oldest_beyond_max_bytes(tmp_path: Path) -> None:
    now = time.time()
    store = SegmentStore(config(tmp_path, max_bytes=100, retention_seconds=3600))
    store.start()
    other = SegmentStore(CaptureConfig(directory=tmp_path / "capture", source="vllm-1"))
    other.start()
    expired = _segment(store, 1, 7200, now)
    oldest = _segment(other, 5, 300, now)  # 45 bytes each (9 a line): three exceed 100, two do not
    middle = _segment(store, 5, 200, now)
    newest = _segment(other, 5, 100, now)
    deleted = store.prune(now)
    assert not expired.exists() and not oldest.exists() and middle.exists() and newest.exists()
    assert deleted == 9 + 45 and segments(tmp_path / "capture") == sorted(
        [middle, newest], key=lambda p: p.name
    )


def test_segments_are_written_when_they_are_old_enough(tmp_path: Path) -> None:
    recorder = Recorder(config(tmp_path, segment_seconds=0.2))
    request = json.dumps({"messages": MESSAGES}).encode()
    recorder.offer(Exchange(time.time(), request, json.dumps(answer()).encode(), 200, False))
    deadline = time.monotonic() + 30
    while not segments(tmp_path / "capture"):
        assert time.monotonic() < deadline, "no segment within 30 s of a 0.2 s segment time"
        time.sleep(0.05)
    assert len(read_records(tmp_path / "capture")) == 1
    recorder.close()


WRITER = """
import json, sys, time
from pathlib import Path
from eagle3_contract.capture.config import CaptureConfig, Exchange
from eagle3_contract.capture.recorder import Recorder
recorder = Recorder(CaptureConfig(directory=Path(sys.argv[1]), source="vllm-0", segment_bytes=4096))
request = json.dumps({"messages": [{"role": "user", "content": "x" * 500}]}).encode()
answer = json.dumps({"choices": [{"message": {"content": "y" * 500}, "finish_reason": "stop"}]}).encode()
print("ready", flush=True)
while True:
    recorder.offer(Exchange(time.time(), request, answer, 200, False))
    time.sleep(0.0005)
"""


def test_a_kill_mid_write_leaves_only_whole_records(tmp_path: Path) -> None:
    directory = tmp_path / "capture"
    for attempt in range(3):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)], stdout=subprocess.PIPE)
        assert writer.stdout is not None and writer.stdout.readline().strip() == b"ready"
        before = len(segments(directory))
        deadline = time.monotonic() + 120  # a hang bound: a segment is due within milliseconds
        while len(segments(directory)) == before:  # this writer has written one: then kill it anywhere
            assert time.monotonic() < deadline, "no segment within 120 s"
            time.sleep(0.01)
        time.sleep(0.07 * attempt)  # wherever it lands: in a write, a rename or between them
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    for path in segments(directory):
        for line in path.read_bytes().splitlines():
            assert json.loads(line)["response"]["content"] == "y" * 500, path
    assert len(read_records(directory)) > 0
    SegmentStore(CaptureConfig(directory=directory, source="vllm-0")).start()
    assert not list((directory / "vllm-0").glob("*.partial")), "a killed writer's partial file is removed"


def test_the_package_runs_on_its_own_under_the_name_vllm_loads_it_by(tmp_path: Path) -> None:
    """In the vLLM pod there is no eagle3_contract: the package's files alone, as `eagle3_capture`."""
    import eagle3_contract.capture as package

    mounted = tmp_path / PACKAGE
    mounted.mkdir()
    for source in Path(package.__file__).parent.glob("*.py"):
        (mounted / source.name).write_text(source.read_text())
    module, name = MIDDLEWARE.rsplit(".", 1)
    probe = f"import importlib, sys; sys.path[:0] = [{str(tmp_path)!r}]; "
    probe += f"getattr(importlib.import_module({module!r}), {name!r}); "
    probe += "assert not [m for m in sys.modules if m.startswith('eagle3_contract')]"
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_server_started_without_its_settings_says_which_one() -> None:
    with pytest.raises(ValueError, match="needs EAGLE3_CAPTURE_DIR"):
        CaptureConfig.from_env({})
    with pytest.raises(ValueError, match="not a number"):
        CaptureConfig.from_env({"EAGLE3_CAPTURE_DIR": "/x", "EAGLE3_CAPTURE_SAMPLE_RATE": "lots"})
