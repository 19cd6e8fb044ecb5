"""The tiny verifier's tokenizer: byte-level BPE trained on the corpus, Llama-3 special tokens and template.

Like Llama 3, encoding text with special tokens on prepends `<|begin_of_text|>`, and the chat template writes
it too: tokenize a rendered conversation with `add_special_tokens=False` (as
`apply_chat_template(tokenize=True)` and vLLM's chat endpoint do). `<think>` and `</think>` are single,
non-special added tokens, so decoding with `skip_special_tokens=True` keeps them (as Qwen3's and
DeepSeek-R1's tokenizers do).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, END_OF_TEXT, EOT, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SPECIAL_TOKENS = (BOS, END_OF_TEXT, START_HEADER, END_HEADER, EOT, PAD)
ADDED_TOKENS = (THINK_OPEN, THINK_CLOSE)

CHAT_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' and message['reasoning_content'] is defined"
    " and message['reasoning_content'] %}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE over `texts`; the special tokens take ids 0-5, the think tags the last two."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        special_tokens=[AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Numbers up to 999 (each twice, the minimum frequency) fill the vocabulary past the corpus's own merges.
    numbers = (f" {n}" for n in range(1000) for _ in range(2))
    tokenizer.train_from_iterator(itertools.chain(texts, numbers), trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in ADDED_TOKENS])
    bos = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos)]
    )
    return tokenizer


def training_texts(conversations: Iterable[list[dict[str, str]]]) -> Iterator[str]:
    """The plain text the BPE merges are learned from: roles and contents, without the special tokens."""
    for messages in conversations:
        for message in messages:
            yield message["role"]
            if message.get("reasoning_content"):
                yield "\n" + message["reasoning_content"] + "\n"
            yield "\n\n" + message["content"]


def save_tokenizer(tokenizer: Tokenizer, directory: Path, max_length: int) -> None:
    """tokenizer.json and a tokenizer_config.json that `AutoTokenizer` and vLLM load offline."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"), pretty=True)
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in SPECIAL_TOKENS,
        }
        for token in SPECIAL_TOKENS + ADDED_TOKENS
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "added_tokens_decoder": added,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {"bos_token": BOS, "eos_token": EOT, "pad_token": PAD}
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
