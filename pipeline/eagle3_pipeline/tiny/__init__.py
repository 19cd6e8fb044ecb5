"""The tiny verifier: a 4-layer Llama pretrained on CPU on a procedural chat corpus, and example datasets.

`eagle3 tiny` (`eagle3_pipeline.tiny.build`) builds it once per machine into the models root and reuses the
cached build; the tiny run (`examples/tiny-cpu.yaml`) and the pipeline tests train an EAGLE-3 draft on it.
"""

from __future__ import annotations

MODEL_DIR = "tiny-llama"
STAMP_FILE = ".eagle3-tiny-build"
CHAT_FILE = "tiny-chat.jsonl"
SHAREGPT_FILE = "tiny-chat-sharegpt.jsonl"
PROMPTS_FILE = "tiny-prompts.jsonl"
DATASET_FILES = (CHAT_FILE, SHAREGPT_FILE, PROMPTS_FILE)
