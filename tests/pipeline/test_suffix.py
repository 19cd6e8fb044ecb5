"""draft.candidates' `suffix` rival (vLLM's suffix decoding, from Snowflake's arctic-inference) where vLLM can
serve it: vLLM CPU 0.32 with arctic-inference 0.3.0 built beside it (scripts/build-vllm-suffix.sh).

One bake-off on the tiny verifier, evaluate's own (eagle3_pipeline.stages.evaluate.bakeoff.bake_off), with
its three servers up together: the verifier alone (`none`), a quickly fitted EAGLE-3 draft and `suffix`. It
proves that the stage serves suffix where arctic-inference is there (no refusal: contrast
tests/pipeline/test_bakeoff.py's test on vLLM CPU alone), that vLLM ran suffix decoding (its server log, and
its spec-decode counters moved: suffix has an acceptance), that suffix decoding is lossless (every greedy
answer of the rounds is the verifier's alone, token for token), and that the verdict is the one `decide`
gives from the rounds the result records. Skipped, saying how to build it, where that environment is not
built (`make test` does not build it: docs/benchmarks.md, "Suffix decoding on vLLM CPU").
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.results import CheckpointChoice
from eagle3_contract.stages import Stage
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.requests import Measurement, Message, answer_all
from eagle3_pipeline.serving.vllm_server import VllmServer
from tests.pipeline.draft_support import (
    DATASET,
    conversations,
    evaluate_spec,
    shared_draft,
    write_train_stage,
)
from tests.pipeline.manifests import write_manifest

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-vllm-suffix.sh"
PROMPTS = 8  # a round's prompts (the bake-off answers at most 16), 8 in flight
MAX_TOKENS = 48

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def suffix_vllm_or_skip() -> str:
    """The `vllm` of the environment scripts/build-vllm-suffix.sh built (asked with --check: nothing is
    built), else a skip that says how to build it."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.skip(
            "no vLLM environment with arctic-inference (vLLM's suffix decoding): run "
            "scripts/build-vllm-suffix.sh (about a minute once vLLM CPU is built; make test does not)"
        )
    return lines[-1]


def held_out(models: Path) -> list[list[Message]]:
    from eagle3_pipeline.data.conversations import prompt_of

    rows = [r for r in conversations(models / DATASET) if r["split"] == "val"]
    prompts = [p for p in (prompt_of(r["messages"]) for r in rows) if p is not None]
    return prompts[:PROMPTS]


def test_suffix_serves_losslessly_beside_a_trained_draft_and_the_verdict_is_its_rounds(
    tiny_models: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from eagle3_pipeline.serving.vllm_server import has_package
    from eagle3_pipeline.stages.evaluate import rounds
    from eagle3_pipeline.stages.evaluate.bakeoff import NONE, bake_off, decide
    from eagle3_pipeline.stages.evaluate.checkpoints import Candidate

    monkeypatch.setenv("EAGLE3_VLLM", suffix_vllm_or_skip())
    monkeypatch.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))
    assert has_package("vllm") and has_package("arctic_inference")
    draft = shared_draft(tiny_models, tmp_path_factory.getbasetemp())
    train = tmp_path / write_train_stage(tmp_path, draft)
    spec = evaluate_spec(prompts=PROMPTS, maxTokens=MAX_TOKENS)
    spec["draft"]["candidates"] = ["eagle3", "suffix"]
    manifest = load_manifest(write_manifest(tmp_path / "run.yaml", spec))
    ctx: Any = StageContext.of_spec(
        Stage.EVALUATE, manifest.name, manifest.spec, tmp_path, tmp_path / "evaluate" / "h"
    )
    assert [r.value for r in ctx.params.rivals] == ["suffix"]

    # every answer of the rounds, by server (the warm-up's one-token answers left out)
    answers: dict[str, dict[str, set[tuple[int, ...] | None]]] = defaultdict(lambda: defaultdict(set))

    async def recorded(
        server: VllmServer, prompts: list[list[Message]], max_tokens: int, *args: Any
    ) -> Measurement:
        run = await answer_all(server, prompts, max_tokens, *args)
        if max_tokens > 1:
            for prompt, ids in zip(prompts, run.token_ids, strict=True):
                answers[server.log_path.name][json.dumps(prompt)].add(tuple(ids) if ids is not None else None)
        return run

    monkeypatch.setattr(rounds, "answer_all", recorded)
    started = time.monotonic()
    trained = [Candidate(0, "checkpoints/checkpoint_best", None, "eagle3")]
    chosen, document = bake_off(ctx, held_out(tiny_models), train, trained, "eagle3")
    seconds = time.monotonic() - started
    choice = CheckpointChoice.model_validate(document)
    rivals = {r["method"]: r for r in document["rivals"]}
    figures = {
        r["method"]: (r["outputTokensPerSecond"], r["acceptanceLength"], (r["comparison"] or {}).get("ratio"))
        for r in [*document["checkpoints"], *document["rivals"]]
    }
    print(f"bake-off: {seconds:.0f} s; (tokens/s, acceptance length, over none): {figures}")
    print(choice.bake_off_text())

    # suffix decoding ran: vLLM's engine took the suffix config, and its spec-decode counters moved
    log = (ctx.work / "vllm-bakeoff-suffix.log").read_text()
    assert "speculative_config=SpeculativeConfig(method='suffix'" in log, log[-3000:]
    assert "SpecDecoding metrics" in log
    assert list(rivals) == [NONE, "suffix"]
    assert rivals[NONE]["acceptanceLength"] is None
    assert rivals["suffix"]["acceptanceLength"] is not None and rivals["suffix"]["acceptanceLength"] > 1.0

    # lossless: greedy answers on suffix's server (and the draft's) are the verifier's alone, token for token
    alone = answers[f"vllm-bakeoff-{NONE}.log"]
    assert alone and all(len(ids) == 1 and None not in ids for ids in alone.values())
    for contender in ("suffix", "eagle3"):
        served = answers[f"vllm-bakeoff-{contender}.log"]
        assert served.keys() == alone.keys()
        differ = [p for p in alone if served[p] != alone[p]]
        assert not differ, f"{contender}: {len(differ)} of {len(alone)} prompts answered otherwise"

    # the verdict is the one its recorded rounds give
    speeds = {r["method"]: r["rounds"] for r in [*document["checkpoints"], *document["rivals"]]}
    assert len(speeds[NONE]) in (6, 12) and all(len(s) == len(speeds[NONE]) for s in speeds.values())
    decision = decide(speeds, ["eagle3"], [NONE, "suffix"], default="eagle3")
    assert (document["verdict"], chosen.method) == (decision.verdict, decision.shipped)
    assert decision.decided_by is not None and document["decidedBy"]["rival"] == decision.decided_by.rival
