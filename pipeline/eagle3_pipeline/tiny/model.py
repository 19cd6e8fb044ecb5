"""The tiny verifier's checkpoint: tokenizer, Llama config, pretraining and the saved model directory."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle3_pipeline.tiny.corpus import assistant_content, sample
from eagle3_pipeline.tiny.pretrain import greedy_answer, pretrain
from eagle3_pipeline.tiny.tasks import held_out_turns
from eagle3_pipeline.tiny.tokenizer import (
    BOS,
    END_OF_TEXT,
    EOT,
    PAD,
    save_tokenizer,
    train_tokenizer,
    training_texts,
)

if TYPE_CHECKING:
    from eagle3_pipeline.tiny.build import BuildParams, ModelParams

log = logging.getLogger(__name__)


def llama_config(params: ModelParams, tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=params.hidden_size,
        intermediate_size=params.intermediate_size,
        num_hidden_layers=params.layers,
        num_attention_heads=params.heads,
        num_key_value_heads=params.kv_heads,
        max_position_embeddings=params.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": params.rope_theta},
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOT),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )


def generation_config(tokenizer: Any) -> Any:
    from transformers import GenerationConfig

    eos = [tokenizer.convert_tokens_to_ids(EOT), tokenizer.convert_tokens_to_ids(END_OF_TEXT)]
    return GenerationConfig.from_dict(
        {
            "bos_token_id": tokenizer.convert_tokens_to_ids(BOS),
            "eos_token_id": eos,
            "pad_token_id": tokenizer.convert_tokens_to_ids(PAD),
            "do_sample": False,
        }
    )


def report_answers(model: Any, tokenizer: Any, seed: int) -> float:
    """Log the greedy answers to a few held-out requests; returns the fraction answered exactly."""
    rng = random.Random(seed)
    turns = rng.sample(held_out_turns("count"), 8) + rng.sample(held_out_turns("add"), 8)
    correct = 0
    for index, turn in enumerate(turns):
        answer = greedy_answer(model, tokenizer, [{"role": "user", "content": turn.request}])
        correct += answer == assistant_content(turn)
        if index % 8 == 0:
            log.info("held-out %r -> %r (expected %r)", turn.request, answer, assistant_content(turn))
    request = next(m for m in sample(seed + 1000, 1)[0] if m["role"] == "user")
    log.info("sample %r -> %r", request["content"], greedy_answer(model, tokenizer, [request]))
    return correct / len(turns)


def build_tokenizer(directory: Path, params: BuildParams) -> None:
    """Train the tokenizer on the pretraining corpus and save it (with the chat template) into `directory`."""
    texts = training_texts(sample(params.pretrain.seed, params.tokenizer_conversations))
    tokenizer = train_tokenizer(texts, params.model.vocab_size)
    save_tokenizer(tokenizer, directory, params.model.max_position_embeddings)


def build_model_dir(directory: Path, params: BuildParams) -> dict[str, Any]:
    """Train the tokenizer, pretrain the model and save both into `directory`; returns figures to log."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_params = params.model
    build_tokenizer(directory, params)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    torch.manual_seed(params.pretrain.seed)
    auto: Any = AutoModelForCausalLM  # from_config is untyped
    model = auto.from_config(llama_config(model_params, tokenizer))
    model.generation_config = generation_config(tokenizer)
    loss = pretrain(model, tokenizer, params.pretrain)
    model = model.to(getattr(torch, model_params.dtype))
    accuracy = report_answers(model, tokenizer, params.pretrain.seed)
    log.info("held-out count/add requests answered exactly: %.0f%%", 100 * accuracy)
    model.save_pretrained(directory)
    for path in directory.iterdir():
        path.chmod(0o644)  # the weights are saved owner-only; a server running as another user reads them
    parameters = sum(p.numel() for p in model.parameters())
    return {"final_loss": round(loss, 4), "held_out_accuracy": accuracy, "parameters": parameters}
