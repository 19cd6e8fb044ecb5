"""evaluate's server pool (eagle3_pipeline.stages.evaluate.servers): a configuration is started once and
handed out again; on an accelerator one server at a time. vLLM replaced by a recording fake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eagle3_pipeline.stages.evaluate import servers
from eagle3_pipeline.stages.evaluate.servers import ALONE, ServerPool, draft_key, rival_key
from tests.pipeline.test_evaluate_sweep import context


class FakeServer:
    """Records its start and stop in `events`."""

    events: list[tuple[str, str]] = []

    def __init__(self, ctx: Any, engine: Any, **kwargs: Any) -> None:
        self.log_path: Path = kwargs["log_path"]
        self.config = kwargs["speculative_config"]
        self.options = kwargs["options"]
        self.up = False

    def start(self) -> None:
        self.up = True
        self.events.append(("start", self.log_path.name))

    def stop(self) -> None:
        if self.up:
            self.up = False
            self.events.append(("stop", self.log_path.name))


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    FakeServer.events = []
    monkeypatch.setattr(servers, "VllmServer", FakeServer)
    return FakeServer.events


def test_a_configuration_asked_for_again_is_the_same_server_where_servers_share_the_machine(
    tmp_path: Path, events: list[tuple[str, str]]
) -> None:
    draft = draft_key(tmp_path / "train" / "checkpoint_best", 3)
    with ServerPool(context(tmp_path), together=True) as pool:
        with pool.serve(ALONE, None, "vllm-baseline.log") as first:
            pass
        with pool.serve(draft, {"method": "eagle3"}, "vllm-draft.log"):
            with pool.serve(ALONE, None, "vllm-sweep-baseline.log") as again:
                assert again is first and first.up  # warm, beside the draft's
            with pool.serve(rival_key("ngram", 3), {"method": "ngram"}, "vllm-bakeoff-ngram.log", keep=False):
                pass
        assert events == [
            ("start", "vllm-baseline.log"),
            ("start", "vllm-draft.log"),
            ("start", "vllm-bakeoff-ngram.log"),
            ("stop", "vllm-bakeoff-ngram.log"),  # not kept: gone when its `with` ends
        ]
        with pool.serve(draft_key(tmp_path / "train" / "." / "checkpoint_best", 3), None, "x.log") as same:
            assert same.log_path.name == "vllm-draft.log"  # keyed by train's checkpoint, resolved
        pool.release(draft)
        assert events[-1] == ("stop", "vllm-draft.log")
        assert (pool.started, pool.reused) == (3, 2)
    assert events[-1] == ("stop", "vllm-baseline.log") and not first.up  # the stage's end stops the rest


def test_on_an_accelerator_the_pool_holds_one_server_and_shares_it_only_between_consecutive_uses(
    tmp_path: Path, events: list[tuple[str, str]]
) -> None:
    with ServerPool(context(tmp_path), together=False) as pool:
        with pool.serve(ALONE, None, "vllm-baseline.log") as baseline:
            pass
        with pool.serve(ALONE, None, "vllm-bakeoff-none.log") as none:
            assert none is baseline
        with pool.serve(rival_key("ngram", 3), {"method": "ngram"}, "vllm-bakeoff-ngram.log", keep=False):
            assert events == [("start", "vllm-baseline.log"), ("stop", "vllm-baseline.log"), events[-1]]
            assert not baseline.up  # stopped before the next one starts: their memory would not fit
        with pool.serve(ALONE, None, "vllm-sweep-baseline.log") as base:
            assert base is not baseline and base.up  # started again
            another = pool.serve(draft_key(tmp_path, 3), {}, "vllm-sweep-k3.log")
            with pytest.raises(RuntimeError, match="still in use"), another:
                pass
    assert [e for e in events if e[0] == "start"] == [
        ("start", "vllm-baseline.log"),
        ("start", "vllm-bakeoff-ngram.log"),
        ("start", "vllm-sweep-baseline.log"),
    ]
    assert events[-1] == ("stop", "vllm-sweep-baseline.log")


def test_every_server_of_the_stage_gets_the_sweeps_max_num_seqs(
    tmp_path: Path, events: list[tuple[str, str]]
) -> None:
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [3]}, concurrencies=[1, 256])
    with ServerPool(ctx, together=True) as pool, pool.serve(rival_key("ngram", 3), {}, "n.log") as server:
        assert server.options == ["--max-num-seqs", "256"]  # the bake-off's rivals too
