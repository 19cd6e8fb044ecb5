"""serving.capture on a real vLLM CPU server (issue 44): the package loaded as vLLM loads it in the pod (by
name, from a directory on PYTHONPATH, with the operator's own arguments), records written while it serves,
each with the request, the answer the client got and vLLM's acceptance for that request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eagle3_contract.capture.segments import read_records
from eagle3_pipeline.serving.vllm_server import ENV_VLLM
from tests.pipeline.capture_support import MODEL, server, serving_draft
from tests.pipeline.test_vllm_server import vllm_or_skip

pytestmark = [pytest.mark.pipeline, pytest.mark.vllm]

QUESTIONS = [
    "Spell 'cat'.",
    "Reverse 'abc'.",
    "Count the letters in 'hello'.",
    "Add 2 and 3.",
    "Spell 'dog'.",
]


def chat(base: str, question: str, stream: bool = False, usage: bool = False) -> tuple[str, dict[str, Any]]:
    """(the answer's text, the last JSON document the server sent)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0.0,
    }
    if not stream:
        got = httpx.post(f"{base}/chat/completions", json=body, timeout=120).raise_for_status().json()
        return got["choices"][0]["message"]["content"], got
    body |= {"stream": True} | ({"stream_options": {"include_usage": True}} if usage else {})
    text, last = [], {}
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=120) as response:
        for line in response.raise_for_status().iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = json.loads(line[6:])
                text += [c["delta"].get("content") or "" for c in last.get("choices") or []]
    return "".join(text), last


@pytest.fixture(scope="module")
def served(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    vllm = vllm_or_skip()
    work = tmp_path_factory.mktemp("capture")
    draft = serving_draft(tiny_models, tmp_path_factory.getbasetemp(), work)
    capturing = server("tiny-vllm-0", draft, work, work / "capture", segment_seconds=0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_VLLM, vllm)
        mp.setenv("EAGLE3_MODELS_ROOT", str(tiny_models))  # /models/tiny-llama, as the pod names it
        with capturing:
            answers = [chat(capturing.base_url, q) for q in QUESTIONS[:3]]
            answers.append(chat(capturing.base_url, QUESTIONS[3], stream=True, usage=True))
            answers.append(chat(capturing.base_url, QUESTIONS[4], stream=True))
            deadline = time.monotonic() + 60
            while len(read_records(work / "capture")) < len(QUESTIONS):  # written while it serves
                assert time.monotonic() < deadline, "5 records within 60 s of 0.5 s segments"
                time.sleep(0.2)
            metrics = httpx.get(f"{capturing.root_url}/metrics", timeout=30).text
        yield {"answers": answers, "records": read_records(work / "capture"), "metrics": metrics}


def test_each_request_is_recorded_with_the_answer_the_client_got(served: dict[str, Any]) -> None:
    records = sorted(served["records"], key=lambda r: QUESTIONS.index(r["messages"][0]["content"]))
    assert [r["messages"] for r in records] == [[{"role": "user", "content": q}] for q in QUESTIONS]
    assert [r["response"]["content"] for r in records] == [text for text, _ in served["answers"]]
    assert all(r["finishReason"] in ("stop", "length") and r["servedAt"].endswith("Z") for r in records)


def test_vllms_acceptance_for_each_request_is_in_its_record(served: dict[str, Any]) -> None:
    by_question = {r["messages"][0]["content"]: r for r in served["records"]}
    for (_, document), question in zip(served["answers"][:4], QUESTIONS[:4], strict=True):
        spec = document["metrics"]["speculative_decoding"]  # what the client got too
        record = by_question[question]
        assert record["acceptanceLength"] == spec["mean_acceptance_length"] >= 1.0
        assert record["draftTokens"] == spec["num_draft_tokens"] > 0
        assert record["acceptedTokens"] == spec["num_accepted_draft_tokens"] >= 0
    # a stream whose client asked for no usage has no final chunk to carry it: no figure, not a wrong one
    assert "acceptanceLength" not in by_question[QUESTIONS[4]]


def test_vllms_metrics_count_the_records(served: dict[str, Any]) -> None:
    lines = [
        line for line in served["metrics"].splitlines() if line.startswith("eagle3_capture_records_total")
    ]
    assert 'eagle3_capture_records_total{outcome="written"} 5.0' in lines, lines
