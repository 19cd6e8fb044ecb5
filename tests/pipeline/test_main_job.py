"""The main job, as `make demo` runs it: the tiny example from chat data to an exported draft, on vLLM.

Every stage runs for real (generate and evaluate start vLLM CPU servers; train runs speculators on the CPU),
and the acceptance gate is checked on vLLM's own speculative-decoding counters.

Then the same example trained for one epoch, offline and online (`extraction.mode: online`), in the same
artifacts directory (prepare, generate and vocab are reused by their hashes): online, `eagle3 run` starts a
hidden-state producer (`eagle3 produce`: real vLLM CPU with the `extract_hidden_states` method) and the train
stage asks it for each sample through speculators' own online dataset, deleting each once consumed. Half-way
through the epoch the producer is killed; the local executor replaces it (as the producer Deployment would)
and the trainer waits for it instead of skipping samples. The two drafts' validation estimates are compared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.comparison import DEFAULT_ROUNDS
from eagle3_contract.api.speculation import plan_schedule
from eagle3_contract.gate import judge_evaluation
from eagle3_contract.results import EvaluateResult
from eagle3_pipeline.stages.evaluate.bakeoff import decide
from tests.pipeline.test_vllm_server import suffix_vllm_or_skip, vllm_or_skip

pytestmark = [pytest.mark.pipeline, pytest.mark.vllm]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "eagle3run.yaml"
# The quality bar for the tiny verifier: mean acceptance length with 3 speculative tokens at T=0.
MIN_ACCEPTANCE_LENGTH = 2.0


def results(artifacts: Path, stage: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((artifacts / stage).glob("*/result.json"))]


def run(
    manifest: Path, art: Path, models: Path, vllm: str, until: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "eagle3_cli", "run", str(manifest), "--artifacts", str(art)]
    argv += ["--models", str(models), "--vllm", vllm] + (["--until", until] if until else [])
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, tiny_models: Path) -> tuple[Path, str]:
    """The example's artifacts after `eagle3 run` (the online test adds its own run beside it)."""
    vllm = vllm_or_skip()
    art = tmp_path_factory.mktemp("demo") / "art"
    first = run(EXAMPLE, art, tiny_models, vllm)
    assert first.returncode == 0, first.stderr[-4000:]
    return art, vllm


@pytest.mark.timeout(3600)
def test_the_tiny_example_trains_a_draft_vllm_accepts(demo: tuple[Path, str], tiny_models: Path) -> None:
    art, vllm = demo
    [evaluate] = results(art, "evaluate")
    # the gate is computed from vLLM's raw counters: 1 + accepted / drafts
    assert evaluate["acceptanceLength"] == pytest.approx(
        1 + evaluate["acceptedTokens"] / evaluate["drafts"], abs=1e-5
    )
    assert sum(evaluate["acceptedTokensByPosition"]) == evaluate["acceptedTokens"]
    assert evaluate["acceptanceLength"] >= MIN_ACCEPTANCE_LENGTH, evaluate
    assert judge_evaluation(EvaluateResult.parse(evaluate), MIN_ACCEPTANCE_LENGTH).passed
    assert evaluate["outputsMatchingBaseline"] == evaluate["prompts"]
    [export] = results(art, "export")
    assert len(export["sha256"]) == 64 and export["ratio"] <= 1.05
    second = run(EXAMPLE, art, tiny_models, vllm)
    assert second.returncode == 0 and "==> stage" not in second.stderr, (
        "a second run finds every stage complete"
    )


@pytest.mark.timeout(3600)
def test_the_examples_sweep_measures_every_k_and_concurrency_against_the_verifier_alone(
    demo: tuple[Path, str],
) -> None:
    """The example's evaluation.sweep (serving.speculationLength tuned): every k at every concurrency, each
    k's server beside the verifier alone in paired rounds; a cell's speedup is its rounds' median ratio
    inside its own interval, and a k serves a batch-size range only where its interval cleared 1."""
    art, _ = demo
    [evaluate] = results(art, "evaluate")
    asked = yaml.safe_load(EXAMPLE.read_text())["spec"]["evaluation"]
    ks, concurrencies = asked["sweep"]["numSpeculativeTokens"], asked["concurrencies"]
    table = EvaluateResult.parse(evaluate).speculation
    assert table is not None and table.schedule, evaluate
    assert [(c.num_speculative_tokens, c.concurrency) for c in table.cells] == [
        (k, c) for k in ks for c in concurrencies
    ]
    baseline = {b.concurrency: b.output_tokens_per_second for b in table.baselines}
    assert sorted(baseline) == concurrencies and all(v and v > 0 for v in baseline.values())
    for cell in table.cells:
        assert cell.output_tokens_per_second and cell.output_tokens_per_second > 0
        c = cell.comparison  # evaluation.rounds, doubled once when the first rounds did not decide
        assert c is not None and c.rounds in (DEFAULT_ROUNDS, 2 * DEFAULT_ROUNDS) and c.confidence >= 0.95
        assert cell.speedup == c.ratio and c.low <= c.ratio <= c.high
        # at most k + 1 tokens per verifier step, and the fitted draft gets some accepted
        length = cell.acceptance_length
        assert length is not None and 1.0 < length <= cell.num_speculative_tokens + 1
    assert table.schedule == plan_schedule(table.cells)
    assert table.schedule[0].min_batch_size == 1 and table.schedule[-1].max_batch_size == max(concurrencies)
    for r in table.schedule:  # a k serves only where its interval cleared 1
        assert r.num_speculative_tokens == 0 or r.verdict == "better", r
    # the headline speedup is the cell at evaluate's k and its measured concurrency, not a second figure
    cells = {(c.num_speculative_tokens, c.concurrency): c.speedup for c in table.cells}
    at = (evaluate["numSpeculativeTokens"], evaluate["speedupConcurrency"])
    assert at == (3, max(concurrencies)) and evaluate["speedup"] == cells[at], evaluate
    message = evaluate["message"] or ""
    assert "sweep reuses" not in message and "sweep requests failed" not in message, message
    # the verifier alone stays up beside each k's server; it and the draft at evaluate's k are the servers
    # evaluate measured with, still warm (eagle3_pipeline.stages.evaluate.servers): each started once
    [evaluated] = [p.parent for p in (art / "evaluate").glob("*/result.json")]
    logs = sorted(p.name for p in evaluated.glob("vllm-*.log"))
    assert logs == ["vllm-baseline.log", "vllm-draft.log", *(f"vllm-sweep-k{k}.log" for k in ks if k != 3)]
    for name in logs:
        assert (evaluated / name).read_text().count("Starting vLLM server on") == 1, name


# --- another draft method ---------------------------------------------------------------------------------


# Issue 31: each method vLLM CPU serves, trained from the demo's data with the example's learning rate (tuned
# for EAGLE-3) for METHOD_EPOCHS epochs (the demo trains six): what vLLM resolves it to, and the least
# acceptance length it reaches here (measured at three epochs: P-EAGLE 2.38, DFlash 1.51 with one layer; at
# six 2.79 and 1.66, against EAGLE-3's 3.10). Three, not six: the test is about serving each method
# losslessly, and half the training saved about 55 s of CPU (docs/benchmarks.md, "The suite's time").
METHODS = {
    "peagle": ({"method": "peagle"}, "PeagleQwen3ForCausalLM", 2.0),
    "dflash": ({"method": "dflash", "blockSize": 4}, "DFlashDraftModel", 1.3),
}
METHOD_EPOCHS = 3


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_another_draft_method_of_the_same_data_is_served_losslessly(
    method: str, demo: tuple[Path, str], tiny_models: Path, tmp_path: Path
) -> None:
    """draft.method peagle or dflash trains from the demo's prepared data, hidden states and vocabulary
    (reused: their hashes are the same), and vLLM CPU serves the draft with its own method (P-EAGLE as
    eagle3 with parallel drafting, DFlash as dflash: non-causal within its block on the CPU's attention),
    its outputs the verifier's own."""
    draft, architecture, least = METHODS[method]
    demo_art, vllm = demo
    art = (
        tmp_path / "art"
    )  # the demo's upstream stages, copied: the demo's own outputs stay the only ones there
    for stage in ("prepare", "generate", "extract", "vocab"):
        shutil.copytree(demo_art / stage, art / stage)
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["draft"].update(draft)
    doc["spec"]["training"]["epochs"] = METHOD_EPOCHS
    doc["spec"]["evaluation"].pop("sweep")  # one draft server is enough here (the demo measures the sweep)
    doc["spec"]["serving"]["speculationLength"] = "fixed"
    manifest = tmp_path / f"{method}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    done = run(manifest, art, tiny_models, vllm, until="evaluate")
    assert done.returncode == 0, done.stderr[-4000:]
    ran = dict(line.split()[2:4] for line in done.stderr.splitlines() if line.startswith("==> stage"))
    assert ran.keys() == {"train", "evaluate"}, done.stderr[-2000:]  # prepare to vocab: reused
    evaluated = art / ran["evaluate"].strip("()")
    result = json.loads((evaluated / "result.json").read_text())
    assert result["acceptanceLength"] == pytest.approx(
        1 + result["acceptedTokens"] / result["drafts"], abs=1e-5
    )
    assert result["acceptanceLength"] >= least, result
    assert result["outputsMatchingBaseline"] == result["prompts"]
    assert f"Resolved architecture: {architecture}" in (evaluated / "vllm-draft.log").read_text()


@pytest.mark.timeout(3600)
def test_the_bake_off_ships_only_what_its_rounds_justify_and_the_table_shows_it(
    demo: tuple[Path, str], tiny_models: Path, tmp_path: Path
) -> None:
    """The tiny example with draft.candidates [eagle3, ngram, suffix] (issue 43): the demo's EAGLE-3 draft
    (train reused: one trained candidate leaves train's parameters as they are), vLLM's n-gram prompt lookup,
    vLLM's suffix decoding (arctic-inference, built beside vLLM CPU by scripts/build-vllm-suffix.sh) and the
    verifier alone, served by vLLM CPU side by side in paired rounds on the same held-out prompts. Which one
    ships, if any, depends on this machine's timing: the test checks that the verdict is the one the recorded
    rounds give (the pure rule's cases are tests/pipeline/test_bakeoff.py's), that the run acts on it, that
    every contender answered greedily as the verifier alone does, token for token, and that `eagle3 run`'s
    table and `eagle3 status` show the intervals."""
    demo_art, _ = demo
    vllm = suffix_vllm_or_skip()  # vLLM CPU's own environment, with arctic-inference beside it
    art = tmp_path / "art"
    for stage in ("prepare", "generate", "extract", "vocab", "train"):
        shutil.copytree(demo_art / stage, art / stage)
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["draft"]["candidates"] = ["eagle3", "ngram", "suffix"]
    doc["spec"]["evaluation"].pop("sweep")  # the bake-off is the whole measurement
    doc["spec"]["serving"]["speculationLength"] = "fixed"
    manifest = tmp_path / "candidates.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    done = run(manifest, art, tiny_models, vllm)
    ran = dict(line.split()[2:4] for line in done.stderr.splitlines() if line.startswith("==> stage"))
    assert "train" not in ran, done.stderr[-2000:]  # the demo's draft is the trained entrant
    evaluated = art / ran["evaluate"].strip("()")
    result = EvaluateResult.model_validate(json.loads((evaluated / "result.json").read_text()))
    choice = result.checkpoint_selection
    assert choice is not None and choice.by == "outputTokensPerSecond" and choice.verdict is not None
    figures = {c.method: c for c in choice.checkpoints}
    rivals = {r.method: r for r in choice.rivals}
    assert sorted(figures) == ["eagle3"] and sorted(rivals) == ["ngram", "none", "suffix"]
    speeds = {m: c.rounds or [] for m, c in {**figures, **rivals}.items()}
    # evaluation.rounds, doubled once when the first rounds did not decide
    assert all(len(v) in (DEFAULT_ROUNDS, 2 * DEFAULT_ROUNDS) for v in speeds.values()), speeds
    recomputed = decide(speeds, ["eagle3"], ["none", "ngram", "suffix"], default="eagle3")
    shipped = next(c.method for c in choice.checkpoints if c.checkpoint == choice.checkpoint)
    assert (recomputed.verdict, recomputed.shipped) == (choice.verdict, shipped), choice
    eagle3 = figures["eagle3"]
    assert eagle3.acceptance_length is not None and eagle3.acceptance_length >= MIN_ACCEPTANCE_LENGTH, eagle3
    for c in [*choice.checkpoints, *choice.rivals]:
        if c.method != "none":  # the verifier alone is the ratios' denominator
            assert c.comparison is not None and c.comparison.low <= c.comparison.ratio <= c.comparison.high
            # lossless: the first round's greedy answers are the verifier alone's, token for token
            assert c.outputs_compared and c.outputs_matching_alone == c.outputs_compared, c
    suffix = rivals["suffix"].acceptance_length  # vLLM ran suffix decoding: its counters moved
    assert suffix is not None and suffix > 1.0, rivals["suffix"]
    assert result.outputs_matching_baseline == result.prompts  # lossless, whichever is measured in full
    # vLLM's engine took the n-gram config (its SpeculativeConfig's repr in the engine's config line)
    for rival in ("ngram", "suffix"):
        log = (evaluated / f"vllm-bakeoff-{rival}.log").read_text()
        assert f"SpeculativeConfig(method='{rival}'" in log, log[-3000:]
    # `none` is evaluate's verifier alone, and the eagle3 draft measured in full is its bake-off server
    logs = sorted(p.name for p in evaluated.glob("vllm-*.log"))
    assert logs == [f"vllm-bakeoff-{m}.log" for m in ("eagle3", "ngram", "suffix")] + ["vllm-baseline.log"]
    # the demo's table: every contender with its speedup and interval
    table = " ".join(done.stderr.split())  # eagle3 run's tables: on stderr, with its progress lines
    assert "bake-off" in table and "ngram" in table and "none" in table, done.stderr[-3000:]
    ngram = rivals["ngram"].comparison
    assert ngram is not None and f"{ngram.ratio:.2f}x [{ngram.low:.2f}," in table, done.stderr[-3000:]
    if choice.verdict == "rivalNotBeaten":  # nothing beat every rival: nothing ships, and the run says why
        assert done.returncode != 0 and "RivalNotBeaten" in done.stderr and "export" not in ran, done.stderr[
            -3000:
        ]
    else:
        assert done.returncode == 0, done.stderr[-4000:]
        assert ran.keys() == {"evaluate", "export"}, done.stderr[-2000:]
        exported = json.loads((art / ran["export"].strip("()") / "result.json").read_text())
        assert exported["method"] == shipped
    status = subprocess.run(
        [sys.executable, "-m", "eagle3_cli", "status", str(manifest), "--artifacts", str(art)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    shown = " ".join(status.stdout.split())
    assert "bake-off: eagle3:" in shown and "ngram:" in shown and "interval" in shown, status.stdout


# --- online ---------------------------------------------------------------------------------------------

ONLINE_TOLERANCE = 0.05  # the bar: the online draft's mean acceptance length within 5% of offline's
# Online and offline are compared after one epoch (an offline run of its own, beside the demo's six): every
# epoch asks the producer for every sample again, so the online run's time grows with its epochs. The
# producer is killed half-way through that epoch, so the trainer waits for its replacement to go on.
COMPARED_EPOCHS = 1
# the producer answers this many completions per epoch of the tiny example (its train and validation rows)
COMPLETIONS_PER_EPOCH = 400


def by_hash(artifacts: Path, stage: str) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in (artifacts / stage).glob("*/result.json")}


def producer_pids(art: Path) -> list[int]:
    """The producer's vLLM process: its command line names this run's staging directory."""
    marker = str(art / "hidden-states")
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "serve" in cmdline:
            pids.append(int(entry.name))
    return pids


def completions_answered(art: Path) -> int:
    """The completions the producers of this artifacts directory answered so far (their log, appended to by
    each producer the executor starts)."""
    try:
        log = (art / ".producers" / "producer.log").read_text(errors="replace")
    except FileNotFoundError:
        return 0
    return log.count('"POST /v1/completions HTTP/1.1" 200')


def kill_producer_mid_epoch(art: Path, killed: list[int], stop: threading.Event, after: int) -> None:
    """SIGKILL the producer's process group once it has answered `after` more completions (once)."""
    start = completions_answered(art)
    while not stop.wait(0.2):
        if completions_answered(art) - start < after:
            continue
        for pid in producer_pids(art):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                continue
        if killed:
            return


def with_epochs(tmp_path: Path, epochs: int, mode: str) -> Path:
    """The example with `training.epochs` and `extraction.mode` changed (prepare, generate, vocab reused)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["extraction"]["mode"] = mode
    doc["spec"]["training"]["epochs"] = epochs
    manifest = tmp_path / f"{mode}.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    return manifest


@pytest.mark.timeout(3600)
def test_online_training_matches_offline_and_leaves_no_hidden_states(
    demo: tuple[Path, str], tiny_models: Path, tmp_path: Path
) -> None:
    art, vllm = demo
    [(demo_eval_hash, demo_eval)] = by_hash(art, "evaluate").items()
    before = set(by_hash(art, "train"))
    # train only: evaluate is the same program for any draft, and its vLLM run costs the suite minutes
    offline = run(with_epochs(tmp_path, COMPARED_EPOCHS, "offline"), art, tiny_models, vllm, until="train")
    assert offline.returncode == 0, offline.stderr[-4000:]
    [offline_hash] = set(by_hash(art, "train")) - before
    offline_train = by_hash(art, "train")[offline_hash]

    killed: list[int] = []
    stop = threading.Event()
    half = COMPLETIONS_PER_EPOCH // 2
    killer = threading.Thread(target=kill_producer_mid_epoch, args=(art, killed, stop, half), daemon=True)
    killer.start()
    try:
        online = run(with_epochs(tmp_path, COMPARED_EPOCHS, "online"), art, tiny_models, vllm, until="train")
    finally:
        stop.set()
    assert online.returncode == 0, online.stderr[-6000:]
    assert "==> stage prepare" not in online.stderr and "==> stage vocab" not in online.stderr  # reused
    assert "==> stage extract" not in online.stderr
    assert killed, "the producer was never killed mid-training"
    assert "starting it again" in online.stderr, online.stderr[-3000:]

    trains = by_hash(art, "train")
    [online_hash] = set(trains) - before - {offline_hash}
    online_train = trains[online_hash]
    hidden_states = dict(online_train["hiddenStates"])
    # a kill that lands mid-write leaves a partial sample, which the trainer removes: how many depends on
    # where the kill landed; that none is kept does not
    assert hidden_states.pop("removedLeftovers") >= 0
    assert hidden_states == {"mode": "online", "transfer": "volume", "keptSamples": 0, "keptBytes": 0}
    # every sample was trained on in every epoch: none skipped while the producer was down
    tokens = [e["trainTokens"] for e in offline_train["epochs"]]
    assert len(tokens) == COMPARED_EPOCHS
    assert [e["trainTokens"] for e in online_train["epochs"]] == tokens
    # no hidden state is left behind: the staging directory is gone and the train output holds no samples
    assert not (art / "hidden-states" / online_hash).exists()
    assert not list((art / "train" / online_hash).rglob("hs_*.safetensors"))

    assert list(by_hash(art, "evaluate")) == [demo_eval_hash]  # --until train
    # the drafts learned alike: the acceptance length each one's last epoch estimates from its validation
    # accuracy on the same held-out rows (the evaluated one is the demo's draft, checked above)
    offline_len = offline_train["epochs"][-1]["estimatedAcceptanceLength"]
    online_len = online_train["epochs"][-1]["estimatedAcceptanceLength"]
    print(f"estimated acceptance length: offline {offline_len:.3f}, online {online_len:.3f}")
    assert abs(online_len - offline_len) <= ONLINE_TOLERANCE * offline_len, (offline_len, online_len)
    assert demo_eval["acceptanceLength"] >= MIN_ACCEPTANCE_LENGTH
