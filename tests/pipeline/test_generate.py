"""The generate stage: turn-by-turn regeneration, reasoning, failures, resume, and no server left behind.

Most tests run the stage against a fake `vllm` (a small OpenAI-compatible server that records its requests);
the `vllm` tests run it against a real vLLM CPU server with a tiny verifier, killing it once mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3_pipeline.runtime.context import RESULT_FILE
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.generate.program import FAILED_FILE
from tests.pipeline.chat_templates import save_verifier
from tests.pipeline.checkpoints import bfloat16_copy, weight_dtypes
from tests.pipeline.function_calling import TOOLS
from tests.pipeline.manifests import base_spec, write_manifest
from tests.pipeline.test_vllm_server import vllm_or_skip

Row = dict[str, Any]

FAKE_VLLM = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
name, port = args[args.index("--served-model-name") + 1], int(args[args.index("--port") + 1])
requests = os.environ["FAKE_VLLM_REQUESTS"]
with open(os.environ["FAKE_VLLM_PID"], "w") as f:
    f.write(str(os.getpid()))

def answer(messages):
    last, n = messages[-1]["content"], len(messages)
    if "CRASH" in last:
        os._exit(1)
    if "FAIL" in last:
        return None
    if "EMPTY" in last:
        return {"content": ""}
    if "THINK" in last:
        return {"content": f"<think>\nthought {n}\n</think>\n\nanswer {n}"}
    if "REASON" in last:
        return {"content": f"answer {n}", "reasoning": f"reasoned {n}"}
    return {"content": f"regenerated {n}: {last}"}

class Handler(BaseHTTPRequestHandler):
    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send(200, {})
        elif self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
        else:
            self.send(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(requests, "a") as f:
            f.write(json.dumps(body) + "\n")
        time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
        message = answer(body["messages"])
        if message is None:
            self.send(400, {"error": {"message": "injected failure", "type": "BadRequestError", "code": 400}})
            return
        choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        self.send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": name,
                        "choices": [choice], "usage": usage})

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def user(text: str) -> Row:
    return {"role": "user", "content": text}


def assistant(text: str) -> Row:
    return {"role": "assistant", "content": text}


def conversation(i: int, *messages: Row, split: str = "train") -> Row:
    return {"id": f"c{i}", "split": split, "messages": list(messages)}


def write_prepare_output(art: Path, rows: list[Row]) -> None:
    """A complete prepare output holding `conversations.jsonl` (all generate reads)."""
    out = art / "prepare" / "h"
    out.mkdir(parents=True)
    (out / "conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / RESULT_FILE).write_text("{}\n")


def regeneration_spec(verifier: Path, **regeneration: Any) -> dict[str, Any]:
    spec = base_spec(verifier, verifier / "unused.jsonl", seed=100)
    spec["regeneration"] = {"enabled": True, "maxTokens": 32, "concurrency": 4, **regeneration}
    return spec


OUTPUT, INPUT = "generate/h", "prepare=prepare/h"


def write_spec(tmp_path: Path, spec: dict[str, Any]) -> str:
    return str(write_manifest(tmp_path / "run.yaml", spec))


def read_jsonl(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


# --- against a fake `vllm` ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_verifier(tmp_path_factory.mktemp("verifier"))


class Fake:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.exe = tmp_path / "vllm"
        self.exe.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
        self.exe.chmod(0o755)
        self.requests_file, self.pid_file = tmp_path / "requests.jsonl", tmp_path / "fake.pid"
        monkeypatch.setenv("EAGLE3_VLLM", str(self.exe))
        monkeypatch.setenv("FAKE_VLLM_REQUESTS", str(self.requests_file))
        monkeypatch.setenv("FAKE_VLLM_PID", str(self.pid_file))

    def requests(self) -> list[Row]:
        return read_jsonl(self.requests_file) if self.requests_file.exists() else []

    def pid(self) -> int:
        return int(self.pid_file.read_text())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    return Fake(tmp_path, monkeypatch)


def generate(tmp_path: Path, verifier: Path, rows: list[Row], **regeneration: Any) -> tuple[int, Path]:
    write_prepare_output(tmp_path / "art", rows)
    spec = write_spec(tmp_path, regeneration_spec(verifier, **regeneration))
    code = run_stage("generate", spec, str(tmp_path / "art"), OUTPUT, [INPUT], token_budget=1024)
    return code, tmp_path / "art" / OUTPUT


MIXED = [
    conversation(0, user("hello"), assistant("old 0")),
    conversation(
        1,
        {"role": "system", "content": "be brief"},
        user("first"),
        assistant("old a"),
        user("second"),
        assistant("old b"),
        split="val",
    ),
    conversation(2, user("prompt only")),
    conversation(3, user("THINK please"), assistant("old 3")),
    conversation(4, user("REASON please"), assistant("old 4")),
]


@pytest.mark.pipeline
def test_every_turn_is_regenerated_in_order(tmp_path: Path, verifier: Path, fake: Fake) -> None:
    code, out = generate(tmp_path, verifier, MIXED, temperature=0.3)
    assert code == 0
    rows = read_jsonl(out / "conversations.jsonl")
    assert [(r["id"], r["split"]) for r in rows] == [(r["id"], r["split"]) for r in MIXED]
    by_id = {r["id"]: r["messages"] for r in rows}
    assert by_id["c0"] == [user("hello"), assistant("regenerated 1: hello")]
    assert by_id["c1"][3:] == [user("second"), assistant("regenerated 4: second")]
    assert by_id["c2"] == [user("prompt only"), assistant("regenerated 1: prompt only")]
    assert by_id["c3"][1] == {"role": "assistant", "content": "answer 1", "reasoning_content": "thought 1"}
    assert by_id["c4"][1] == {"role": "assistant", "content": "answer 1", "reasoning_content": "reasoned 1"}
    # the second turn of c1 was asked with the first turn already regenerated
    second = next(r for r in fake.requests() if r["messages"][-1]["content"] == "second")
    assert second["messages"][2] == assistant("regenerated 2: first")
    assert {(r["seed"], r["max_tokens"], r["temperature"]) for r in fake.requests() if r["seed"] == 101} == {
        (101, 32, 0.3)
    }, "seed = dataset.seed + row index"
    result = json.loads((out / RESULT_FILE).read_text())
    assert (result["rows"], result["regenerated"], result["failed"], result["resumed"]) == (5, 5, 0, 0)
    assert result["outputTokens"] == 3 * 6 and result["samples"] == 5
    assert result["tokensPerSecond"] == pytest.approx(18 / result["generationSeconds"], rel=0.05)
    assert (out / "data").is_dir() and (out / "token_freq.pt").is_file()
    assert (out / "vllm.log").read_text().startswith("==> eagle3: ")
    assert not alive(fake.pid()), "the server is stopped with the stage"


@pytest.mark.pipeline
def test_a_conversation_with_tools_is_kept_as_recorded(tmp_path: Path, verifier: Path, fake: Fake) -> None:
    """Function calling: the verifier's own calls would need the tools' answers to them, so a conversation
    with tool calls or tool turns is kept as the dataset recorded it (and counted), never sent half-read."""
    call = {
        "id": "w",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    with_tools = {
        **conversation(
            5,
            user("weather?"),
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "sunny", "tool_call_id": "w"},
            assistant("sunny today"),
        ),
        "tools": TOOLS,
    }
    code, out = generate(tmp_path, verifier, [MIXED[0], with_tools])
    assert code == 0
    assert read_jsonl(out / "conversations.jsonl")[1] == with_tools
    assert [r["messages"][-1]["content"] for r in fake.requests()] == ["hello"]
    result = json.loads((out / RESULT_FILE).read_text())
    assert (result["regenerated"], result["keptAsRecorded"], result["samples"]) == (1, 1, 2)
    assert result["kept"] == {"chat": 1, "tool_calls_untrained": 1}, "this verifier's template has no tools"


@pytest.mark.pipeline
def test_reasoning_drop_keeps_only_the_answer(tmp_path: Path, verifier: Path, fake: Fake) -> None:
    code, out = generate(tmp_path, verifier, MIXED[3:], reasoning="drop")
    assert code == 0
    for row in read_jsonl(out / "conversations.jsonl"):
        assert row["messages"][1] == assistant("answer 1")


def with_markers(count: int, markers: dict[int, str]) -> list[Row]:
    return [conversation(i, user(f"{markers.get(i, '')} row {i}"), assistant("old")) for i in range(count)]


@pytest.mark.pipeline
def test_failed_rows_are_recorded_and_dropped(tmp_path: Path, verifier: Path, fake: Fake) -> None:
    code, out = generate(tmp_path, verifier, with_markers(10, {3: "FAIL", 7: "EMPTY"}), maxFailedFraction=0.2)
    assert code == 0
    failed = read_jsonl(out / "failed.jsonl")
    assert sorted(f["id"] for f in failed) == ["c3", "c7"]
    assert any("empty answer" in f["error"] for f in failed) and any("400" in f["error"] for f in failed)
    assert [r["id"] for r in read_jsonl(out / "conversations.jsonl")] == [
        f"c{i}" for i in range(10) if i not in (3, 7)
    ]
    result = json.loads((out / RESULT_FILE).read_text())
    assert (result["regenerated"], result["failed"], result["samples"]) == (8, 2, 8)


@pytest.mark.pipeline
def test_too_many_failures_fail_the_stage(
    tmp_path: Path, verifier: Path, fake: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = generate(
        tmp_path, verifier, with_markers(10, {1: "FAIL", 4: "FAIL", 8: "EMPTY"}), maxFailedFraction=0.2
    )
    assert code == 1
    error = capsys.readouterr().err
    assert "3 of 10 rows failed to regenerate" in error and "maxFailedFraction allows (2)" in error
    assert "c1: turn 1: BadRequestError" in error
    assert not out.exists()
    assert not alive(fake.pid())


@pytest.mark.pipeline
def test_a_dead_server_fails_the_stage_not_the_rows(
    tmp_path: Path, verifier: Path, fake: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = generate(tmp_path, verifier, with_markers(6, {2: "CRASH"}), maxFailedFraction=1.0)
    assert code == 1
    assert "the vLLM server exited with code 1" in capsys.readouterr().err


@pytest.mark.pipeline
def test_a_dead_servers_log_is_kept_where_the_failure_says(
    tmp_path: Path, verifier: Path, fake: Fake, capsys: pytest.CaptureFixture[str]
) -> None:
    """The message named `generate/.h.partial/vllm.log`, which the failure had already deleted."""
    code, _ = generate(tmp_path, verifier, with_markers(6, {2: "CRASH"}), maxFailedFraction=1.0)
    error = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "art" / "generate" / ".h.partial").exists()
    log = tmp_path / "art" / "generate" / ".h.failed" / "vllm.log"
    assert f"(log: {log})" in error, error
    assert log.read_text().startswith("==> eagle3: ")


@pytest.mark.pipeline
def test_resume_skips_finished_rows_and_a_torn_line(tmp_path: Path, verifier: Path, fake: Fake) -> None:
    rows = with_markers(8, {})
    work = tmp_path / "art" / "generate" / ".h.partial"
    work.mkdir(parents=True)
    earlier = [
        {**rows[i], "messages": [rows[i]["messages"][0], assistant(f"earlier {i}")]} for i in (5, 1, 6)
    ]
    torn = json.dumps({**rows[2], "messages": []})[:25]  # a killed writer's last line
    (work / "conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier) + torn)
    code, out = generate(tmp_path, verifier, rows)
    assert code == 0
    asked = sorted(r["messages"][0]["content"] for r in fake.requests())
    assert asked == [f" row {i}" for i in (0, 2, 3, 4, 7)]
    final = read_jsonl(out / "conversations.jsonl")
    assert [r["id"] for r in final] == [f"c{i}" for i in range(8)], "input order"
    assert final[5]["messages"][1] == assistant("earlier 5"), "finished rows are kept as they were"
    result = json.loads((out / RESULT_FILE).read_text())
    assert (result["resumed"], result["regenerated"], result["samples"]) == (3, 5, 8)


# --- against a real vLLM CPU server -------------------------------------------------------------------------


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (the stage, its vLLM server and engine processes)."""
    needle = f"EAGLE3_TEST_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def wait_for(condition: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def real_rows(datasets: Path) -> list[Row]:
    """120 of the tiny verifier's own chat rows (multi-turn, system prompts, reasoning) and 10 prompts."""
    chats = read_jsonl(datasets / "tiny-chat.jsonl")[:120]
    prompts = read_jsonl(datasets / "tiny-prompts.jsonl")[200:210]
    rows = [conversation(i, *row["messages"]) for i, row in enumerate(chats)]
    rows += [conversation(120 + i, user(row["prompt"])) for i, row in enumerate(prompts)]
    return [{**row, "split": "val" if i % 10 == 9 else "train"} for i, row in enumerate(rows)]


@pytest.fixture(scope="session")  # session: resolved before the session-scoped tiny_models (minutes to build)
def vllm() -> str:
    return vllm_or_skip()


@pytest.fixture(scope="module")
def killed_then_resumed(
    vllm: str, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Row]:
    """Attempt 1 is SIGKILLed while its server runs, after a few rows; attempt 2 resumes and finishes.

    Two vLLM starts in all. One request at a time, so the kill lands mid-run; the rerun at 8. The verifier
    is the tiny one's bfloat16 copy, as real checkpoints ship (issue 30): vLLM 0.32 on an x86 CPU serves the
    float32 tiny verifier in bfloat16 anyway (its "auto" dtype downcasts float32), so the answers are the
    same computation, and a bfloat16 checkpoint's regression fails here.
    """
    tmp = tmp_path_factory.mktemp("real")
    rows = real_rows(tiny_models / "datasets")
    write_prepare_output(tmp / "art", rows)
    verifier = bfloat16_copy(tiny_models / "tiny-llama", tmp / "tiny-llama-bf16")
    assert weight_dtypes(verifier) == {torch.bfloat16}
    spec = regeneration_spec(verifier, maxTokens=128, temperature=0.7, concurrency=1)
    spec["verifier"]["maxModelLen"] = 512
    marker = uuid.uuid4().hex
    env = {**os.environ, "EAGLE3_VLLM": vllm, "EAGLE3_TEST_MARKER": marker}
    argv = [sys.executable, "-m", "eagle3_cli", "stage", "generate", "--spec", write_spec(tmp, spec)]
    argv += ["--artifacts", str(tmp / "art"), "--output", OUTPUT, "--input", INPUT, "--token-budget", "2048"]
    done_file = tmp / "art" / "generate" / ".h.partial" / "conversations.jsonl"

    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: done_file.exists() and len(done_file.read_bytes().splitlines()) >= 3, 400, "3 rows")
    running = marked_processes(marker)  # the stage, the vLLM API server and its engine process
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_at_kill = {r["id"]: r for r in read_jsonl(done_file)}
    assert len(done_at_kill) < len(rows), "the first attempt finished before the kill: nothing to resume"
    gone_after = wait_for(lambda: not marked_processes(marker), 90, "the killed stage's vLLM to exit")

    # the rerun at 8 conversations in flight: concurrency is tuning, not part of the stage's hash, and the
    # resume keys rows by id (one at a time was only for the kill to land mid-run; the rest goes faster)
    rerun = tmp / "rerun"
    rerun.mkdir()
    spec["regeneration"]["concurrency"] = 8
    argv[argv.index("--spec") + 1] = write_spec(rerun, spec)
    started = time.monotonic()
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, second.stderr[-4000:]
    yield {
        "rows": rows,
        "running_at_kill": running,
        "done_at_kill": done_at_kill,
        "gone_after_s": gone_after,
        "left_after": marked_processes(marker),
        "second_s": time.monotonic() - started,
        "result": json.loads(second.stdout.strip().splitlines()[-1]),
        "out": tmp / "art" / OUTPUT,
    }


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_a_killed_stage_leaves_no_vllm_behind(killed_then_resumed: Row) -> None:
    assert len(killed_then_resumed["running_at_kill"]) >= 3, "the stage, vLLM and its engine were running"
    assert killed_then_resumed["gone_after_s"] < 90
    assert killed_then_resumed["left_after"] == [], "nor after the second, complete attempt"


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_the_rerun_resumes_without_redoing_rows(killed_then_resumed: Row) -> None:
    result, done = killed_then_resumed["result"], killed_then_resumed["done_at_kill"]
    assert result["resumed"] >= len(done) >= 3
    # at temperature 0.7 the tiny verifier may answer a row with nothing: such rows fail, within the limit
    assert result["regenerated"] + result["failed"] == len(killed_then_resumed["rows"]) - result["resumed"]
    final = {r["id"]: r for r in read_jsonl(killed_then_resumed["out"] / "conversations.jsonl")}
    for row_id, row in done.items():
        assert final[row_id] == row, f"{row_id} was regenerated again"


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_real_regeneration_end_to_end(killed_then_resumed: Row) -> None:
    result, out, all_rows = (killed_then_resumed[k] for k in ("result", "out", "rows"))
    failed = {r["id"] for r in read_jsonl(out / FAILED_FILE)} if (out / FAILED_FILE).exists() else set()
    assert len(failed) == result["failed"] <= 0.02 * len(all_rows) and result["outputTokens"] > 0
    rows = [r for r in all_rows if r["id"] not in failed]  # failed rows are recorded, then dropped
    rate = result["outputTokens"] / result["generationSeconds"]
    assert result["tokensPerSecond"] == pytest.approx(rate, rel=0.01), "generated tokens per second"
    final = read_jsonl(out / "conversations.jsonl")
    assert [(r["id"], r["split"]) for r in final] == [(r["id"], r["split"]) for r in rows]
    for before, after in zip(rows, final, strict=True):
        roles = [m["role"] for m in before["messages"]]
        if "assistant" not in roles:
            roles.append("assistant")
        assert [m["role"] for m in after["messages"]] == roles
        for old, new in zip(before["messages"], after["messages"], strict=False):
            if old["role"] != "assistant":
                assert new == old
        assert all(m["content"] for m in after["messages"])
    assert result["samples"] == len(rows) and (out / "data").is_dir()
    # the tiny verifier reasons when asked to think step by step: the reasoning is split out of the answer
    thinking = [r for r in final if r["messages"][-1].get("reasoning_content")]
    asked = [r for r in rows if any("Think step by step" in m["content"] for m in r["messages"])]
    assert len(thinking) >= len(asked) // 2 > 0
    assert all("<think>" not in m["content"] for r in final for m in r["messages"])
