"""online_samples: speculators' online dataset adapted for a day-long run (waiting for producers, keeping)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file
from speculators.train.recovery import GenerationRecoveryGuard, SampleUnavailable

from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.train.online_samples import (
    KeepingTransfer,
    WaitingRecoveryGuard,
    producers_answer,
    unreachable,
    wait_for_producers,
)

pytestmark = pytest.mark.pipeline


class Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"object": "list", "data": [{"id": "tiny"}]}'
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def models_server() -> Any:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def closed_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def connection_error() -> openai.APIConnectionError:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/completions")
    return openai.APIConnectionError(request=request)


def test_producers_answer_only_with_a_model(models_server: str) -> None:
    assert producers_answer(models_server)
    assert not producers_answer(closed_endpoint())


def test_waiting_for_producers_that_never_come_fails_with_the_endpoint() -> None:
    endpoint = closed_endpoint()
    with pytest.raises(StageError, match=endpoint.replace("/", ".")):
        wait_for_producers(endpoint, deadline_s=0.5)


def test_only_connection_failures_count_as_unreachable() -> None:
    assert unreachable(connection_error())
    wrapped = RuntimeError("round trip failed")
    wrapped.__cause__ = connection_error()
    assert unreachable(wrapped)
    assert not unreachable(ValueError("token ids do not match"))


def test_the_guard_waits_for_unreachable_producers_instead_of_skipping(models_server: str) -> None:
    calls = []

    def flaky() -> dict[str, torch.Tensor]:
        calls.append(1)
        if len(calls) <= 5:  # more failures than speculators' own retries (2) would allow
            raise connection_error()
        return {"hidden_states": torch.ones(2, 2, 4)}

    guard = WaitingRecoveryGuard(
        GenerationRecoveryGuard(retries=2, max_consecutive_failures=1), models_server
    )
    result = guard.run(flaky, description="sample 0")
    assert isinstance(result, dict) and len(calls) == 6
    assert guard.consecutive_failures == 0


def test_the_guard_leaves_bad_samples_to_speculators(models_server: str) -> None:
    def bad() -> dict[str, torch.Tensor]:
        raise ValueError("non-finite hidden states")

    inner = GenerationRecoveryGuard(retries=1, max_consecutive_failures=5)
    result = WaitingRecoveryGuard(inner, models_server).run(bad, description="sample 3")
    assert isinstance(result, SampleUnavailable) and inner.consecutive_failures == 1


class Generated:
    """An hs-connectors transfer's surface: nothing cached, one generated sample per handle."""

    def __init__(self, samples: dict[str, dict[str, torch.Tensor]]) -> None:
        self.samples, self.deleted = samples, []  # type: ignore[var-annotated]

    def setup(self) -> None:
        pass

    def get_cached(self, file_idx: int) -> None:
        return None

    def get_generated(self, params: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.samples[params["handle"]]

    def delete(self, handle: str) -> None:
        self.deleted.append(handle)


def test_keeping_writes_checked_samples_under_their_index_and_reads_them_back(
    tmp_path: Path, models_server: str
) -> None:
    sample = {"hidden_states": torch.randn(3, 2, 4).to(torch.bfloat16), "token_ids": torch.tensor([5, 6, 7])}
    inner = Generated({"h1": sample})
    keeper = KeepingTransfer(inner, tmp_path / "kept")
    guard = WaitingRecoveryGuard(
        GenerationRecoveryGuard(retries=0, max_consecutive_failures=3), models_server, keeper
    )
    assert keeper.get_cached(7) is None  # asked for index 7: not kept yet

    def round_trip() -> dict[str, torch.Tensor]:
        loaded = keeper.get_generated({"handle": "h1"})
        assert loaded is not None
        keeper.delete("h1")
        return loaded

    guard.run(round_trip, description="sample 7")
    assert inner.deleted == ["h1"]  # the producer's copy is still deleted
    kept = load_file(str(tmp_path / "kept" / "hs_7.safetensors"))
    assert torch.equal(kept["hidden_states"], sample["hidden_states"])
    assert torch.equal(keeper.get_cached(7)["token_ids"], sample["token_ids"])  # type: ignore[index]
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["hs_7.safetensors"]  # no temporary file left


def test_a_failed_sample_is_not_kept(tmp_path: Path, models_server: str) -> None:
    keeper = KeepingTransfer(Generated({}), tmp_path / "kept")
    guard = WaitingRecoveryGuard(
        GenerationRecoveryGuard(retries=0, max_consecutive_failures=3), models_server, keeper
    )
    keeper.get_cached(2)

    def bad() -> dict[str, torch.Tensor]:
        raise ValueError("token ids do not match")

    assert isinstance(guard.run(bad, description="sample 2"), SampleUnavailable)
    assert not (tmp_path / "kept").exists()


def test_the_adapted_objects_survive_pickling_into_loader_workers(tmp_path: Path, models_server: str) -> None:
    import pickle

    keeper = KeepingTransfer(Generated({}), tmp_path / "kept")
    guard = WaitingRecoveryGuard(
        GenerationRecoveryGuard(retries=1, max_consecutive_failures=3), models_server, keeper
    )
    copy = pickle.loads(pickle.dumps({"guard": guard, "transfer": keeper}))
    assert copy["guard"].keeper is copy["transfer"]  # one object in the worker too
    assert copy["guard"].consecutive_failures == 0 and copy["transfer"].cache == tmp_path / "kept"
