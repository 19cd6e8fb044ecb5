"""Repeated, interleaved measurement of several vLLM servers: the rounds every speed decision is taken from.

An arm is one server (the verifier alone, or with a draft at some k, or with a training-free rival) and a
round is one short run of the same prompts at one concurrency on it. `interleave` measures every arm in
every round, the arms' order rotating from round to round (two arms alternate: AB, BA, AB, ...; an arm's
concurrencies back to back, with a pause where the rounds move on from a server whose worker still
spins), with each
server warm (its prompts answered once, one token each, not measured: their prefixes cached, as a serving
server has them). A disturbance of the machine (another tenant, a build, a throttle) then lands on every
arm of a round alike, and the per-round ratios (eagle3_contract.api.comparison) cancel it where one run per
arm would not.

Where the servers cannot be up together (an accelerator holds one server's weights and KV cache: vLLM
claims most of its memory), the caller measures each arm alone in turn (`interleave` with one arm), and
rounds pair by their index: the repetition still gives an interval, but a slow drift between the arms'
turns is not cancelled (docs/serving.md says so).

A comparison the rounds leave undecided (an interval holding its threshold, or rounds that vary beyond the
noise bound) gets the same number of rounds once more (`interleave_settled`): the decision is then taken on
all of them, the interval narrower (12 rounds: the 3rd to the 10th ratio, 96.1 %), and a comparison still
noisy is flagged in the result, never silently used.

Each arm keeps its per-round output tokens/s per concurrency and, for a server with a draft, the
spec-decode counters' differences summed over its rounds (their acceptance).
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eagle3_pipeline.runtime.reporter import StageReporter
from eagle3_pipeline.serving.requests import Message, answer_all, read_counters, settled_counters
from eagle3_pipeline.serving.spec_metrics import SpecDecodeCounters
from eagle3_pipeline.serving.vllm_server import VllmServer

logger = logging.getLogger(__name__)

Prompts = dict[int, list[list[Message]]]  # by concurrency: the prompts of one round
MIN_ROUND_S = 1.0  # a round's least duration (long_enough)
# A pause where the rounds move from one server to another: vLLM's model worker busy-polls its shared-memory
# queue for 1 s after its last step (vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition's
# busy_loop_s; measured on vLLM CPU 0.32: a full core for 1.0 s after an answer, then none), and on CPU
# every server's worker is bound to the same cores (VLLM_CPU_OMP_THREADS_BIND=auto). The next server's round
# would start on a core the previous one still spins on. Rounds on the same server need no pause, nor do
# servers whose worker is no process of its own (`VllmServer.worker_spins`: V1 multiprocessing off).
SETTLE_S = 1.2
MAX_REPEATS = 16


@dataclass
class Arm:
    """One server in the rounds and what it measured."""

    name: str
    server: VllmServer
    counted: bool  # a server with a draft: its spec-decode counters are read around each round
    speeds: dict[int, list[float | None]] = field(default_factory=dict)  # by concurrency, per round
    counters: dict[int, SpecDecodeCounters] = field(default_factory=dict)  # by concurrency, all rounds
    output_tokens: dict[int, int] = field(default_factory=dict)  # by concurrency, all rounds
    failures: list[str] = field(default_factory=list)
    # by concurrency, the first round's answers (token ids, None where a request failed): greedy answers
    # on every arm are the verifier's own where speculative decoding is lossless
    answers: dict[int, list[list[int] | None]] = field(default_factory=dict)

    def speed(self, concurrency: int) -> float | None:
        """The median of the arm's rounds at `concurrency` (rounds that measured something)."""
        measured = [s for s in self.speeds.get(concurrency, []) if s]
        return statistics.median(measured) if measured else None

    def counted_total(self) -> SpecDecodeCounters | None:
        """The counters' differences over every round at every concurrency (None: not counted)."""
        if not self.counted or not self.counters:
            return None
        total: SpecDecodeCounters | None = None
        for counters in self.counters.values():
            total = counters if total is None else total + counters
        return total


def warm(server: VllmServer, prompts: Prompts) -> None:
    """Every prompt of the rounds once, one token each, not measured: the prefixes are cached."""
    largest = max(prompts.values(), key=len)
    asyncio.run(answer_all(server, largest, 1, None, None, max(prompts)))


def long_enough(server: VllmServer, prompts: Prompts, max_tokens: int) -> Prompts:
    """The rounds' prompts, each concurrency's list repeated so that a round lasts at least MIN_ROUND_S on
    `server` (timed by one unmeasured pass): a round of a few short answers times request overheads and the
    machine's bursts, not decoding (8 tiny answers at 4 in flight take 0.1 s, and their ratios varied by
    50 to 80 % on a quiet machine). At most MAX_REPEATS times."""
    longer: Prompts = {}
    for concurrency, cell in prompts.items():
        run = asyncio.run(answer_all(server, cell, max_tokens, None, None, concurrency))
        repeats = min(MAX_REPEATS, max(1, math.ceil(MIN_ROUND_S / max(run.seconds, 1e-3))))
        longer[concurrency] = cell * repeats
    return longer


def interleave(
    arms: Sequence[Arm],
    prompts: Prompts,
    rounds: int,
    max_tokens: int,
    progress: StageReporter | None = None,
    warmed: bool = False,
) -> None:
    """`rounds` rounds of every arm at every concurrency of `prompts`, the arms' order rotating each round;
    every server warmed first unless `warmed`."""
    if not warmed:
        for arm in arms:
            warm(arm.server, prompts)
    previous: VllmServer | None = None
    for index in range(rounds):
        shift = index % len(arms)
        order = [*arms[shift:], *arms[:shift]]
        for arm in order:  # an arm's concurrencies back to back: one move between servers per arm
            if previous is not None and previous is not arm.server and previous.worker_spins:
                time.sleep(SETTLE_S)
            previous = arm.server
            for concurrency, cell in prompts.items():
                one_round(arm, cell, concurrency, max_tokens, progress)
        logger.debug("round %d of %d done (%s)", index + 1, rounds, ", ".join(a.name for a in order))


def interleave_settled(
    arms: Sequence[Arm],
    prompts: Prompts,
    rounds: int,
    max_tokens: int,
    progress: StageReporter | None,
    settled: Callable[[], bool],
    warmed: bool = False,
) -> bool:
    """`interleave`, then as many rounds again once when `settled()` says the rounds did not decide; True
    when it did so (the rounds were extended)."""
    interleave(arms, prompts, rounds, max_tokens, progress, warmed)
    if settled():
        return False
    names = ", ".join(a.name for a in arms)
    logger.info("%s: undecided after %d rounds (or noisy): %d rounds more", names, rounds, rounds)
    if progress is not None:
        progress.grow_total(rounds * len(arms) * sum(len(p) for p in prompts.values()))
    interleave(arms, prompts, rounds, max_tokens, progress, warmed=True)
    return True


def one_round(
    arm: Arm,
    prompts: list[list[Message]],
    concurrency: int,
    max_tokens: int,
    progress: StageReporter | None,
) -> None:
    """One run of `prompts` on the arm's server: its tokens/s, and the counters' difference around it."""
    server = arm.server
    before = read_counters(server) if arm.counted else None
    run = asyncio.run(answer_all(server, prompts, max_tokens, progress, None, concurrency))
    server.check()
    tps = run.tokens_per_second
    arm.speeds.setdefault(concurrency, []).append(tps if tps else None)
    arm.output_tokens[concurrency] = arm.output_tokens.get(concurrency, 0) + run.output_tokens
    arm.failures += run.failures
    arm.answers.setdefault(concurrency, run.token_ids)
    if arm.counted:
        after = settled_counters(server, before, run.output_tokens)
        difference = after - before if before is not None else after
        known = arm.counters.get(concurrency)
        arm.counters[concurrency] = difference if known is None else known + difference
