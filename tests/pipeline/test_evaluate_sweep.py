"""evaluate's speculation-length sweep (eagle3_pipeline.stages.evaluate.sweep) without vLLM: the cells'
prompts, the servers' options, the table, its notes and the paired rounds' prompts. The sweep on vLLM is the
demo's (tests/pipeline/test_main_job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.spec_metrics import SpecDecodeCounters
from eagle3_pipeline.serving.vllm_server import VllmServer
from eagle3_pipeline.stages.evaluate.rounds import Arm
from eagle3_pipeline.stages.evaluate.servers import server_options
from eagle3_pipeline.stages.evaluate.summary import with_sweep
from eagle3_pipeline.stages.evaluate.sweep import (
    SpeculationSweep,
    cell_prompts,
    prompts_wanted,
)
from tests.pipeline.draft_support import evaluate_spec
from tests.pipeline.manifests import write_manifest


def context(tmp_path: Path, **evaluation: Any) -> StageContext[Any, Any]:
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", evaluate_spec(**evaluation)))
    return StageContext.of_spec(
        Stage.EVALUATE, manifest.name, manifest.spec, tmp_path, tmp_path / "evaluate" / "h"
    )


def prompts_of(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"q{i}"}] for i in range(n)]


def test_a_cells_prompts_are_the_first_held_out_ones_reused_only_to_fill_the_concurrency() -> None:
    held_out = prompts_of(5)
    assert cell_prompts(held_out, 3, 1) == held_out[:3]
    assert cell_prompts(held_out, 8, 2) == held_out  # capped at the prompts there are
    assert cell_prompts(held_out, 8, 7) == held_out + held_out[:2]  # 7 in flight: reused cyclically


def test_the_sweep_plans_its_cells_and_says_when_it_reuses_prompts(tmp_path: Path) -> None:
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [3, 1, 3]}, concurrencies=[16, 1, 4])
    assert prompts_wanted(ctx.params) == 32  # the largest cell's: 2 x 16
    sweep = SpeculationSweep.of(ctx, prompts_of(10))
    assert sweep is not None and sweep.ks == [1, 3]
    # default max(2 x concurrency, 8) prompts, capped at the 10 held out, but 16 to keep 16 in flight
    assert {c: len(p) for c, p in sweep.prompts.items()} == {1: 8, 4: 8, 16: 16}
    assert list(sweep.prompts) == [1, 4, 16]
    assert sweep.total_prompts == (1 + 2) * 6 * 32  # two ks and the verifier alone once a round, 6 rounds
    assert sweep.notes() == [
        "the sweep reuses the 10 held-out prompts cyclically to keep concurrency 16 in flight"
    ]
    no_sweep = context(tmp_path, prompts=3)
    assert SpeculationSweep.of(no_sweep, prompts_of(10)) is None and prompts_wanted(no_sweep.params) == 0
    fixed = SpeculationSweep.of(context(tmp_path, sweep={"prompts": 3}, concurrencies=[1, 2]), prompts_of(10))
    assert fixed is not None and {c: len(p) for c, p in fixed.prompts.items()} == {1: 3, 2: 3}
    assert fixed.notes() == []


def test_prompts_screened_as_degenerate_are_left_out_of_every_cell(tmp_path: Path) -> None:
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1], "prompts": 4}, concurrencies=[1, 2])
    held_out = prompts_of(6)
    sweep = SpeculationSweep.of(ctx, held_out)
    assert sweep is not None and sweep.prompts[1] == held_out[:4]
    sweep.leave_out([0, 2])  # the screening's indices into the held-out prompts
    kept = [held_out[i] for i in (1, 3, 4, 5)]
    assert sweep.prompts == {1: kept, 2: kept} and sweep.total_prompts == 2 * 6 * 8
    assert sweep.notes() == ["the sweep leaves out the 2 prompts screened as degenerate"]
    everything = SpeculationSweep.of(ctx, held_out)
    assert everything is not None
    everything.leave_out(list(range(6)))  # nothing left to measure: the cells keep the prompts there are
    assert everything.prompts[1] == held_out[:4] and everything.notes() == []


def test_only_a_concurrency_above_vllms_defaults_sets_max_num_seqs(tmp_path: Path) -> None:
    def options(**evaluation: Any) -> list[str]:
        return server_options(context(tmp_path, **evaluation).params)

    assert options(sweep={}, concurrencies=[1, 8, 32]) == []  # the command stays the Deployment's
    assert options(sweep={}, concurrencies=[1, 512]) == ["--max-num-seqs", "512"]
    assert options(concurrencies=[1, 512]) == []  # no sweep: the concurrencies are not read


def measured(sweep: SpeculationSweep, k: int, rounds: dict[int, tuple[list[float], list[float]]]) -> None:
    """k's rounds as the sweep records them: per concurrency, the verifier alone's and k's tokens/s."""
    server = cast(VllmServer, None)  # record() reads only what the rounds measured
    alone, drafted = Arm("verifier alone", server, False), Arm(f"k={k}", server, True)
    for concurrency, (base, draft) in rounds.items():
        alone.speeds[concurrency], drafted.speeds[concurrency] = list(base), list(draft)
        drafted.counters[concurrency] = SpecDecodeCounters(
            drafts=10.0, draft_tokens=10.0 * k, accepted=5.0, accepted_per_position=(5.0,) + (0.0,) * (k - 1)
        )
    sweep.record_alone(alone)
    sweep.record(k, alone, drafted)


def steady(speed: float, rounds: int = 6) -> list[float]:
    """Rounds that agree within 1 %."""
    return [speed * (1 + 0.01 * ((i % 3) - 1)) for i in range(rounds)]


def test_the_table_has_the_speedups_and_the_schedule_they_justify(tmp_path: Path) -> None:
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1, 2]}, concurrencies=[1, 8])
    sweep = SpeculationSweep.of(ctx, prompts_of(16))
    assert sweep is not None
    measured(sweep, 2, {1: (steady(20.0), steady(30.0)), 8: (steady(100.0), steady(90.0))})
    measured(sweep, 1, {1: (steady(20.0), steady(24.0)), 8: (steady(100.0), steady(120.0))})
    table = sweep.table()
    assert [(c.num_speculative_tokens, c.concurrency, c.speedup) for c in table.cells] == [
        (1, 1, 1.2), (1, 8, 1.2), (2, 1, 1.5), (2, 8, 0.9),
    ]  # fmt: skip
    assert [b.output_tokens_per_second for b in table.baselines] == [20.0, 100.0]  # medians of all rounds
    ranges = [(r.min_batch_size, r.max_batch_size, r.num_speculative_tokens) for r in table.schedule]
    assert ranges == [(1, 2, 2), (3, 8, 1)]  # k 2 is fastest at 1, k 1 at 8 (k 2 is slower than no draft)
    result = with_sweep({"message": "measured on 3 held-out prompts"}, sweep)
    first = result["speculation"]["schedule"][0]
    assert (first["numSpeculativeTokens"], first["speedup"], first["verdict"]) == (2, 1.5, "better")
    assert first["comparison"]["rounds"] == 6 and first["comparison"]["low"] > 1.0
    assert result["message"] == "measured on 3 held-out prompts"
    parsed = EvaluateResult.model_validate(result)
    assert parsed.speculation is not None and parsed.speculation.schedule == table.schedule
    sweep.failures.append("prompt 2: APITimeoutError: timed out")
    failed = with_sweep({"message": None}, sweep)["message"]
    assert failed.startswith("1 sweep requests failed") and "APITimeoutError" in failed
    assert with_sweep({"message": None}, None) == {"message": None, "speculation": None}


def test_a_k_whose_interval_holds_1_is_not_distinguishable_and_speculation_stays_off(tmp_path: Path) -> None:
    """Issue 43: the demo once tuned k 1 at concurrency 4 from one baseline run taken while a build had the
    cores (3.96x). A k is chosen only where its rounds' interval lies above 1."""
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1]}, concurrencies=[1, 4])
    sweep = SpeculationSweep.of(ctx, prompts_of(16))
    assert sweep is not None
    straddles = [20.0 * r for r in (0.9, 1.2, 1.05, 1.15, 0.95, 1.1)]  # median 1.075, interval [0.9, 1.2]
    measured(sweep, 1, {1: ([20.0] * 6, straddles), 4: (steady(50.0), steady(80.0))})
    table = sweep.table()
    assert [(r.num_speculative_tokens, r.verdict) for r in table.schedule] == [
        (0, "notDistinguishable"), (1, "better"),
    ]  # fmt: skip
    message = with_sweep({"message": None}, sweep)["message"]
    assert message.startswith(
        "batch sizes 1-2: k 1 not distinguishable from the verifier alone, 1.07x [0.90, 1.20]"
    )
    assert "speculation stays off" in message


def test_noisy_rounds_are_flagged_and_decide_only_through_their_interval(tmp_path: Path) -> None:
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1]}, concurrencies=[1, 4])
    sweep = SpeculationSweep.of(ctx, prompts_of(16))
    assert sweep is not None
    wild = [50.0 * r for r in (1.3, 3.9, 1.4, 3.5, 1.2, 4.0)]  # every round faster, but by 1.2x to 4x
    wilder = [50.0 * r for r in (0.6, 3.9, 1.4, 3.5, 1.2, 4.0)]  # one round slower
    measured(sweep, 1, {1: ([50.0] * 6, wilder), 4: ([50.0] * 6, wild)})
    table = sweep.table()
    assert all(c.comparison is not None and c.comparison.noisy for c in table.cells)
    assert [(r.num_speculative_tokens, r.verdict) for r in table.schedule] == [
        (0, "notDistinguishable"), (1, "better"),
    ]  # fmt: skip
    message = with_sweep({"message": None}, sweep)["message"] or ""
    assert "noisy sweep cells" in message and "k 1 at concurrency 4" in message


def test_the_headline_speedup_is_the_sweeps_cell_at_evaluates_k_nearest_its_concurrency(
    tmp_path: Path,
) -> None:
    """Issue 29: the demo's summary said speedup 0.7059 (the main runs, 8 in flight) while the sweep under it
    said 1.02x and 1.07x for the same k. With a sweep that measured evaluate's k, the headline is one of its
    cells, at the measured concurrency nearest the main runs' (ties: the larger), and says which."""
    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1, 3]}, concurrencies=[1, 4])
    sweep = SpeculationSweep.of(ctx, prompts_of(16))
    assert sweep is not None
    measured(sweep, 3, {1: (steady(25.0), steady(25.5)), 4: (steady(60.0), steady(64.2))})
    measured(sweep, 1, {1: (steady(25.0), steady(22.0)), 4: (steady(60.0), steady(70.0))})
    main = {"numSpeculativeTokens": 3, "speedup": 0.7059, "speedupConcurrency": 8, "message": None}
    result = with_sweep(main, sweep)
    assert (result["speedup"], result["speedupConcurrency"]) == (1.07, 4)  # 64.2 / 60, at 4 in flight
    assert EvaluateResult.model_validate(result).summary() == {"speedup": 1.07, "speedupConcurrency": 4}
    nearer_one = with_sweep(main | {"speedupConcurrency": 2}, sweep)  # 2 is 1 from 1 and 2 from 4
    assert (nearer_one["speedup"], nearer_one["speedupConcurrency"]) == (1.02, 1)
    other = SpeculationSweep.of(
        context(tmp_path, sweep={"numSpeculativeTokens": [3]}, concurrencies=[1, 3]), prompts_of(16)
    )
    assert other is not None
    measured(other, 3, {1: (steady(25.0), steady(25.5)), 3: (steady(60.0), steady(64.2))})
    tie = with_sweep(main | {"speedupConcurrency": 2}, other)
    assert tie["speedupConcurrency"] == 3  # equally near 1 and 3: the larger
    other_k = with_sweep(main | {"numSpeculativeTokens": 2}, sweep)  # the sweep never measured k 2
    assert (other_k["speedup"], other_k["speedupConcurrency"]) == (0.7059, 8)  # the main runs' figure


def test_the_paired_rounds_answer_the_prompts_repeated_to_last_long_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On servers up together (a CPU), every round of every k answers the cells' prompts as long_enough
    repeated them, on both arms: a round of a few short answers times overheads, not decoding."""
    from contextlib import nullcontext

    from eagle3_pipeline.stages.evaluate import rounds
    from eagle3_pipeline.stages.evaluate import sweep as sweep_module

    ctx = context(tmp_path, sweep={"numSpeculativeTokens": [1, 3], "prompts": 2}, concurrencies=[1, 2])
    planned = SpeculationSweep.of(ctx, prompts_of(4))
    assert planned is not None
    answered: list[tuple[str, int, int]] = []

    class Server:
        worker_spins = False

        def check(self) -> None:
            pass

    def one_round(arm: Arm, prompts: Any, concurrency: int, max_tokens: int, progress: Any) -> None:
        answered.append((arm.name, concurrency, len(prompts)))
        arm.speeds.setdefault(concurrency, []).append(100.0)

    monkeypatch.setattr(sweep_module, "warm", lambda server, prompts: None)
    monkeypatch.setattr(sweep_module, "long_enough", lambda s, p, t: {c: cell * 3 for c, cell in p.items()})
    monkeypatch.setattr(rounds, "one_round", one_round)
    monkeypatch.setattr(rounds, "SETTLE_S", 0.0)

    monkeypatch.setattr(SpeculationSweep, "server", lambda self, *args: nullcontext(Server()))

    class Pool:
        together = True

        def serve(self, *args: Any, **kwargs: Any) -> Any:
            return nullcontext(Server())

    planned._paired(Path("draft"), Path("checkpoint"), cast(Any, Pool()))
    assert answered and {n for _, _, n in answered} == {3 * len(planned.prompts[1])}, answered
    assert {name for name, _, _ in answered} == {"verifier alone", "k=1", "k=3"}
    by_arm = {name: sum(1 for n, _, _ in answered if n == name) for name in ("verifier alone", "k=1", "k=3")}
    assert len(set(by_arm.values())) == 1, by_arm  # the verifier alone once a round, not once per k
