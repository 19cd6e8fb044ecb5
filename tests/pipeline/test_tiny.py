"""The tiny verifier: a loadable Llama whose greedy answers carry structure, and its example datasets."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3_pipeline.tiny import CHAT_FILE, DATASET_FILES, MODEL_DIR, PROMPTS_FILE, SHAREGPT_FILE, STAMP_FILE
from eagle3_pipeline.tiny.build import BuildParams, build_hash, is_built, main, write_datasets
from eagle3_pipeline.tiny.corpus import assistant_content
from eagle3_pipeline.tiny.model import build_tokenizer
from eagle3_pipeline.tiny.pretrain import greedy_answer
from eagle3_pipeline.tiny.tasks import held_out_turns
from eagle3_pipeline.tiny.tokenizer import ADDED_TOKENS, BOS, EOT, SPECIAL_TOKENS

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def tokenizer(tiny_models: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models / MODEL_DIR)


@pytest.fixture(scope="module")
def model(tiny_models: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_models / MODEL_DIR).eval()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_checkpoint_is_a_plain_llama_that_loads_offline(
    tiny_models: Path, tokenizer: Any, model: Any
) -> None:
    directory = tiny_models / MODEL_DIR
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (directory / name).is_file(), name
    assert json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and config.architectures == ["LlamaForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (4, 128, 384)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.max_position_embeddings == 1024 and not config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer) == 1024
    generation = json.loads((directory / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids(EOT) in generation["eos_token_id"]
    assert tokenizer.eos_token == EOT and tokenizer.bos_token == BOS and tokenizer.pad_token is not None


def test_the_chat_template_renders_the_llama_3_layout(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "2 plus 3 is 5.", "reasoning_content": "1. Start with 2."},
        {"role": "user", "content": "Spell cat."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAdd 2 and 3.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n1. Start with 2.\n</think>\n\n"
        "2 plus 3 is 5.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nSpell cat.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    plain = tokenizer.apply_chat_template(messages[1:3], tokenize=False)
    assert plain.endswith("2 plus 3 is 5.<|eot_id|>") and "<|start_header_id|>system" not in plain


def test_special_tokens_are_single_tokens(tokenizer: Any) -> None:
    for token in SPECIAL_TOKENS + ADDED_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)]
    assert tokenizer.encode("hi")[0] == tokenizer.bos_token_id  # like Llama 3: BOS with special tokens on
    ids = tokenizer.encode("<think>\nx\n</think>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>"


@pytest.mark.parametrize("kind", ["count", "add"])
def test_greedy_answers_to_held_out_requests_are_mostly_right(tokenizer: Any, model: Any, kind: str) -> None:
    turns = random.Random(7).sample(held_out_turns(kind), 12)
    right = [
        greedy_answer(model, tokenizer, [{"role": "user", "content": turn.request}])
        == assistant_content(turn)
        for turn in turns
    ]
    assert sum(right) >= 9, f"{sum(right)}/{len(right)} held-out {kind} requests answered right"


def test_the_held_out_requests_are_not_in_the_dataset(tiny_models: Path) -> None:
    held_out = {turn.request for kind in ("count", "add") for turn in held_out_turns(kind)}
    requests = {
        m["content"] for row in read_jsonl(tiny_models / "datasets" / CHAT_FILE) for m in row["messages"]
    }
    assert held_out and not held_out & requests


def test_dataset_rows_are_valid_chats_in_three_formats(tiny_models: Path) -> None:
    datasets = tiny_models / "datasets"
    rows = [row["messages"] for row in read_jsonl(datasets / CHAT_FILE)]
    assert len(rows) == BuildParams().dataset_rows
    for messages in rows:
        turns = messages[1:] if messages[0]["role"] == "system" else messages
        assert [m["role"] for m in turns] == ["user", "assistant"] * (len(turns) // 2) and turns
        assert all(isinstance(m["content"], str) and m["content"] for m in messages)
    assert 0.05 <= sum(any("reasoning_content" in m for m in row) for row in rows) / len(rows) <= 0.3
    assert 0.25 <= sum(len(row) > 3 for row in rows) / len(rows) <= 0.65  # multi-turn
    assert 0.1 <= sum(row[0]["role"] == "system" for row in rows) / len(rows) <= 0.4
    sharegpt = read_jsonl(datasets / SHAREGPT_FILE)
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    for messages, row in zip(rows, sharegpt, strict=True):
        assert row["conversations"] == [{"from": names[m["role"]], "value": m["content"]} for m in messages]
    prompts = [row["prompt"] for row in read_jsonl(datasets / PROMPTS_FILE)]
    assert prompts == [next(m["content"] for m in messages if m["role"] == "user") for messages in rows]


def test_datasets_and_tokenizer_are_deterministic(tiny_models: Path, tmp_path: Path) -> None:
    params = BuildParams()
    write_datasets(tmp_path / "datasets", params)
    build_tokenizer(tmp_path / "tokenizer", params)
    for name in DATASET_FILES:
        assert (tmp_path / "datasets" / name).read_bytes() == (tiny_models / "datasets" / name).read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "tokenizer" / name).read_bytes() == (tiny_models / MODEL_DIR / name).read_bytes()


def test_a_complete_build_is_reused_at_once(tiny_models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stamp = tiny_models / MODEL_DIR / STAMP_FILE
    before = stamp.stat().st_mtime_ns
    started = time.monotonic()
    assert main(str(tiny_models)) == 0
    assert time.monotonic() - started < 5
    assert capsys.readouterr().out == f"{tiny_models}\n"
    assert stamp.stat().st_mtime_ns == before
    assert json.loads(stamp.read_text())["hash"] == build_hash(BuildParams())


def test_a_stale_or_incomplete_build_is_not_reused(tmp_path: Path) -> None:
    digest = build_hash(BuildParams())
    assert build_hash(BuildParams(dataset_rows=401)) != digest
    (tmp_path / MODEL_DIR).mkdir()
    (tmp_path / "datasets").mkdir()
    for name in DATASET_FILES:
        (tmp_path / "datasets" / name).write_text("{}\n")
    assert not is_built(tmp_path, digest)  # no stamp: an interrupted build
    (tmp_path / MODEL_DIR / STAMP_FILE).write_text(json.dumps({"hash": digest}))
    assert is_built(tmp_path, digest)
    assert not is_built(tmp_path, build_hash(BuildParams(dataset_seed=3)))
    (tmp_path / "datasets" / SHAREGPT_FILE).unlink()
    assert not is_built(tmp_path, digest)


def test_the_model_weights_are_finite(model: Any) -> None:
    assert all(torch.isfinite(p).all() for p in model.parameters())
