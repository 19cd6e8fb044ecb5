"""Small fast tokenizers with the chat templates of common model families, for masking tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIALS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|im_start|>",
    "<|im_end|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<think>",
    "</think>",
    "<pad>",
]

LLAMA3 = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m.get('reasoning_content') %}<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The answer follows [/INST] directly: the "generation prompt" is the end of the user turn itself.
MISTRAL = (
    "<s>{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
)
# Qwen3-style: reasoning is rendered only in the last assistant turn, so the template is not prefix-stable.
QWEN3 = (
    "{% set last = namespace(i=-1) %}{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{% set last.i = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.index0 == last.i and m.get('reasoning_content') %}"
    "<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {"llama3": LLAMA3, "chatml": CHATML, "mistral": MISTRAL, "qwen3": QWEN3}

# Templates with tool support. Hermes/Qwen2.5-style: the tool schemas in the system turn, each call a
# <tool_call> block after the assistant's text, tool answers grouped into one user turn.
HERMES = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' or (m['role'] == 'assistant' and not m.get('tool_calls')) %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant{% if m['content'] %}{{ '\\n' + m['content'] }}"
    "{% endif %}{% for c in m['tool_calls'] %}{{ '\\n' }}<tool_call>\n"
    "{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Llama-3.1-style: a calling turn is its call as JSON alone (its text is dropped), answers in ipython turns.
LLAMA31 = (
    "<|begin_of_text|>{% for m in messages %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for c in m['tool_calls'] %}{\"name\": \"{{ c['function']['name'] }}\", \"parameters\": "
    "{{ c['function']['arguments'] | tojson }}}{% endfor %}CALL_END"
    "{% elif m['role'] == 'tool' %}"
    "<|start_header_id|>ipython<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
TOOL_TEMPLATES = {
    "hermes": HERMES,
    "llama31": LLAMA31.replace("CALL_END", "<|eot_id|>"),
    # Llama 3.1 with built-in tools closes a call with <|eom_id|>: the next <|eot_id|> ends the tool's answer
    "llama31_eom": LLAMA31.replace("CALL_END", "<|eom_id|>"),
}

CORPUS = [
    "hello world, how are you today? count from one to ten: one two three four five six seven eight nine ten",
    "the sky is blue and the grass is green. think step by step. answer: yes no maybe",
    "system user assistant reasoning content 0 1 2 3 4 5 6 7 8 9 + - = . , ! ?",
]


def make_tokenizer(template: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>")
    fast.chat_template = template
    return fast


def save_verifier(path: Path, template: str = LLAMA3, layers: int = 2, dtype: str = "float32") -> Path:
    """A tokenizer plus a small random Llama verifier (seeded, its weights in `dtype`, as real checkpoints
    ship bfloat16): enough for prepare, extract, vocab and train."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer(template)
    tok.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(path)
    return path
