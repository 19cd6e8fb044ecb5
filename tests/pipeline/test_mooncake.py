"""The `mooncake` transfer on CPU: a real Mooncake master started by `mooncake_master_argv`, hs_connectors'
store as the producer side and its `MooncakeTransfer` as the trainer side (speculators' online dataset reads
through it), then a real producer, `eagle3 produce` (vLLM CPU writing through the CPU Mooncake connector,
eagle3_pipeline/adapters/cpu_mooncake_connector.py). One master, one trainer client, one vLLM server for the
module.

Both sides are Mooncake clients over TCP with P2P handshake metadata on loopback (`MOONCAKE_LOCAL_HOSTNAME`),
each lending a 64 MiB segment to the store.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from eagle3_contract.online import mooncake_master_argv
from eagle3_pipeline.serving.kv_transfer import MOONCAKE, hs_connectors_config
from eagle3_pipeline.serving.vllm_server import free_port
from tests.pipeline.test_vllm_server import vllm_or_skip

pytestmark = pytest.mark.pipeline

CPU_CONNECTOR = "CpuMooncakeHiddenStatesConnector"
LOOPBACK = "127.0.0.1"
SEGMENT_GIB = "0.0625"  # each client's share of the store, and its local buffer: 64 MiB
MASTER_READY_S = 60.0
VERIFIER = "tiny-llama"  # tiny_models' verifier: 4 layers, hidden size 128
LAYER_IDS = [1, 2, 4]  # two auxiliary layers and n, as extraction stores them
HIDDEN = 128
# vLLM CPU (bf16 arithmetic) against transformers' float32 forward rounded to bf16, per token: measured at
# most 0.024 (||a - b|| / ||b|| over 245 tokens); a token shifted by one position is off by 0.25 or more.
REL_TOL = 0.06


@dataclass
class Master:
    address: str  # host:port, what the trainer and the producers are given
    metrics: str  # the admin/metrics server's root URL
    log: Path
    process: subprocess.Popen[bytes]


def launch_args(master: str) -> list[str]:
    return [
        "--mooncake-master", master,
        "--mooncake-global-segment-gib", SEGMENT_GIB,
        "--mooncake-local-buffer-gib", SEGMENT_GIB,
    ]  # fmt: skip


def train_args(master: str) -> argparse.Namespace:
    """The trainer's settings, parsed by hs_connectors' own parser (as speculators' train CLI does)."""
    from hs_connectors import MooncakeBackend

    parser = argparse.ArgumentParser()
    MooncakeBackend.add_train_args(parser)
    return parser.parse_args(launch_args(master))


def connector_manifest(handle: str, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> dict[str, Any]:
    """The transfer manifest the vLLM connector returns in `kv_transfer_params` (request_finished)."""
    from hs_connectors.mooncake_store import VERSION, packed_layout

    shapes: dict[str, Any] = {  # lists, as the connector passes them (the manifest travels as JSON)
        "hidden_states": (list(hidden_states.shape), hidden_states.dtype),
        "token_ids": (list(token_ids.shape), token_ids.dtype),
    }
    tensors, total = packed_layout(shapes)
    return {
        "handle": handle,
        "version": VERSION,
        "tensors": tensors,
        "metadata": {
            "num_tokens": token_ids.numel(),
            "total_aligned_bytes": total,
            "extract_mode": "prompt_only",
        },
    }


@pytest.fixture(scope="module")
def loopback() -> Iterator[None]:
    """hs_connectors names each client's segment by $MOONCAKE_LOCAL_HOSTNAME (else the host's address)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOONCAKE_LOCAL_HOSTNAME", LOOPBACK)
        yield


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory, loopback: None) -> Iterator[Master]:
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    executable = shutil.which("mooncake_master", path=search)
    if executable is None:
        pytest.fail("no mooncake_master beside this Python or on PATH: run `make mooncake`")
    port, metrics_port = free_port(), free_port()
    argv = mooncake_master_argv(port, metrics_port)
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [executable, *argv[1:]], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    found = Master(f"{LOOPBACK}:{port}", f"http://{LOOPBACK}:{metrics_port}", log, process)
    try:
        deadline = time.monotonic() + MASTER_READY_S
        while not _healthy(found.metrics):
            assert process.poll() is None, f"mooncake_master exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"mooncake_master is not healthy:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield found
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _healthy(metrics: str) -> bool:
    try:
        return httpx.get(f"{metrics}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def trainer(master: Master) -> Any:
    """The trainer's side: hs_connectors' MooncakeTransfer, built as speculators' train CLI builds it."""
    from hs_connectors import MooncakeBackend

    transfer = MooncakeBackend.from_train_args(train_args(master.address), "unused")
    transfer.setup()
    return transfer


@pytest.fixture(scope="module")
def producer_store(master: Master) -> Any:
    """A producer's store, configured from the `--kv-transfer-config` vLLM gets, as the connector reads it."""
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig

    config = hs_connectors_config(MOONCAKE, launch_args(master.address))
    return MooncakeHiddenStatesStore(
        MooncakeStoreConfig.from_dict(config["kv_connector_extra_config"]["mooncake"])
    ).setup()


def key_exists(transfer: Any, key: str) -> bool:
    return bool(transfer.store._require_store().is_exist(key) == 1)


# --- the master and the store, without vLLM --------------------------------------------------------------


def test_the_master_takes_the_contract_flags(master: Master) -> None:
    text = master.log.read_text()
    assert f"rpc_port={master.address.rsplit(':', 1)[1]}" in text
    assert "deprecated" not in text  # 0.3.13 warns "port is deprecated, use rpc_port instead"


def test_a_sample_round_trips_through_the_store(trainer: Any, producer_store: Any) -> None:
    from speculators.data_generation.offline import check_hidden_states

    tokens = torch.arange(3, 40, dtype=torch.int64)
    hidden = torch.randn(len(tokens), len(LAYER_IDS), HIDDEN).to(torch.bfloat16)
    manifest = connector_manifest("cmpl-round-trip-0", hidden, tokens)
    started = time.monotonic()
    producer_store.put_sample(manifest, {"hidden_states": hidden, "token_ids": tokens})
    put_s = time.monotonic() - started
    got = trainer.get_generated(manifest)
    get_s = time.monotonic() - started - put_s
    size = manifest["metadata"]["total_aligned_bytes"]
    print(f"{size} bytes: put {put_s * 1e3:.1f} ms, get {get_s * 1e3:.1f} ms")
    check_hidden_states(got, tokens.tolist())
    assert torch.equal(got["hidden_states"], hidden) and torch.equal(got["token_ids"], tokens)
    trainer.delete(manifest["handle"])
    assert not key_exists(trainer, manifest["handle"])
    with pytest.raises(TimeoutError, match=manifest["handle"]):
        trainer.store.get_sample(manifest, timeout=0.3)
    trainer.delete(manifest["handle"])  # deleting twice is no error


def test_a_producer_error_reaches_the_trainer(trainer: Any, producer_store: Any) -> None:
    from hs_connectors.mooncake_store import MooncakeIntegrityError

    tokens = torch.arange(5, dtype=torch.int64)
    manifest = connector_manifest("cmpl-failed-0", torch.zeros(5, 3, HIDDEN, dtype=torch.bfloat16), tokens)
    producer_store.put_error(manifest, "Non-finite producer tensor 'hidden_states'")
    with pytest.raises(MooncakeIntegrityError, match="Non-finite producer tensor"):
        trainer.get_generated(manifest)
    trainer.delete(manifest["handle"])
    assert not key_exists(trainer, manifest["handle"] + ":error")


def test_a_manifest_that_does_not_match_the_tensors_is_refused(producer_store: Any) -> None:
    from hs_connectors.mooncake_store import MooncakeIntegrityError

    tokens = torch.arange(4, dtype=torch.int64)
    manifest = connector_manifest("cmpl-mismatch-0", torch.zeros(4, 3, HIDDEN, dtype=torch.bfloat16), tokens)
    with pytest.raises(MooncakeIntegrityError, match="shape"):
        producer_store.put_sample(
            manifest, {"hidden_states": torch.zeros(5, 3, HIDDEN, dtype=torch.bfloat16), "token_ids": tokens}
        )


# --- a real vLLM CPU producer ----------------------------------------------------------------------------


@dataclass
class Producer:
    base_url: str
    model_name: str
    model: Path
    log: Path


@pytest.fixture(scope="module")
def producer(
    master: Master, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Producer]:
    """`eagle3 produce` for an online spec with `transfer: mooncake`, as the producer Deployment runs it: vLLM
    CPU extracting hidden states into the store through the CPU Mooncake connector."""
    from eagle3_pipeline.local.producers import LocalProcess, log_tail
    from eagle3_pipeline.stages.train.online_samples import producers_answer
    from tests.pipeline.manifests import write_manifest

    vllm = vllm_or_skip()
    base = tmp_path_factory.mktemp("mooncake-producer")
    spec = {
        "verifier": {"model": f"/models/{VERIFIER}", "maxModelLen": 512},
        "dataset": {"source": "unused", "maxSequenceLength": 512},
        "extraction": {
            "mode": "online",
            "transfer": "mooncake",
            "layers": LAYER_IDS[:-1],
            "tokenBudget": 512,
        },
        "training": {"sequenceLength": 512},
    }
    manifest = write_manifest(base / "run.yaml", spec)
    port = free_port()
    argv = [sys.executable, "-m", "eagle3_cli", "produce", "--spec", str(manifest), "--artifacts", str(base)]
    env = {
        **os.environ,
        "EAGLE3_VLLM": vllm,
        "EAGLE3_MODELS_ROOT": str(tiny_models),
        "EAGLE3_MOONCAKE_MASTER": master.address,
        "MOONCAKE_LOCAL_HOSTNAME": LOOPBACK,
    }
    process = LocalProcess("producer", [*argv, "--port", str(port)], env, base / "producer.log")
    process.start()
    base_url = f"http://{LOOPBACK}:{port}/v1"
    try:
        deadline = time.monotonic() + 900
        while not producers_answer(base_url):
            assert process.exited() is None, f"eagle3 produce exited:\n{log_tail(process.log)}"
            assert time.monotonic() < deadline, f"eagle3 produce never answered:\n{log_tail(process.log)}"
            time.sleep(1.0)
        yield Producer(base_url, "verifier", tiny_models / VERIFIER, process.log)
    finally:
        process.stop()


def reference_hidden_states(model: Path, rows: list[list[int]]) -> list[torch.Tensor]:
    """The same layers by the transformers backend (float32 forward), rounded to bf16 as vLLM stores them."""
    from eagle3_pipeline.data.hidden_states import Layout
    from eagle3_pipeline.data.verifier import LocalVerifier
    from eagle3_pipeline.stages.extract.transformers_backend import TransformersExtractor, load_verifier

    verifier = load_verifier(LocalVerifier(str(model), None, False), torch.device("cpu"))
    extractor = TransformersExtractor(
        verifier, Layout(tuple(LAYER_IDS[:-1]), LAYER_IDS[-1], HIDDEN, "bfloat16")
    )
    return [extractor.forward([row])[0].to(torch.bfloat16) for row in rows]


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_vllm_cpu_produces_samples_the_trainer_reads(producer: Producer, trainer: Any) -> None:
    import openai
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import generate_hidden_states

    from eagle3_pipeline.local.producers import log_tail

    rng = random.Random(3)
    rows = [[rng.randrange(3, 1000) for _ in range(n)] for n in (1, 7, 64, 300, 12, 33)]
    client = openai.Client(base_url=producer.base_url, api_key="unused")

    def produce(row: list[int]) -> tuple[str, dict[str, Any], float]:
        started = time.monotonic()
        handle, params = generate_hidden_states(client, producer.model_name, {"input_ids": row})
        return handle, params, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=3) as pool:  # requests in flight together: the writer threads
        try:
            answers = list(pool.map(produce, rows))
        except openai.APIError as err:  # the server's own account of it (e.g. its engine process died)
            raise AssertionError(f"{err}; eagle3 produce's log ends:\n{log_tail(producer.log)}") from err
    samples = []
    for row, (handle, params, request_s) in zip(rows, answers, strict=True):
        assert params["handle"] == handle and params["metadata"]["num_tokens"] == len(row)
        assert params["tensors"]["hidden_states"]["shape"] == [len(row), len(LAYER_IDS), HIDDEN]
        started = time.monotonic()
        sample = trainer.get_generated(params)
        get_s = time.monotonic() - started
        check_hidden_states(sample, row)
        assert sample["hidden_states"].dtype == torch.bfloat16
        size = prod(sample["hidden_states"].shape) * 2
        print(f"{len(row)} tokens ({size} bytes): request {request_s:.3f} s, get {get_s * 1e3:.1f} ms")
        samples.append(sample["hidden_states"])
        trainer.delete(handle)
        assert not key_exists(trainer, handle)

    worst = 0.0
    for row, got, want in zip(rows, samples, reference_hidden_states(producer.model, rows), strict=True):
        rel = (got.float() - want.float()).norm(dim=-1) / want.float().norm(dim=-1)
        worst = max(worst, rel.max().item())
        if len(row) > 1:  # the states are each token's own: one position off is far away
            shifted = (got[1:].float() - want[:-1].float()).norm(dim=-1) / want[:-1].float().norm(dim=-1)
            assert shifted.min().item() > REL_TOL
    print(f"vLLM CPU against transformers: worst per-token relative error {worst:.4f}")
    assert 0.0 < worst <= REL_TOL
    log = producer.log.read_text(errors="replace")
    assert f"Creating v1 connector with name: {CPU_CONNECTOR}" in log
    assert "Mooncake write failed" not in log and "Traceback" not in log
