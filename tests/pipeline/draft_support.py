"""Eagle-3 drafts for tests, made with speculators' own classes (no train stage), and the stage outputs
evaluate and export read.

`make_draft(verifier, out)` builds an `Eagle3DraftModel` for the verifier (one Llama layer, a draft vocabulary
of the most frequent answer tokens, d2t/t2d) and saves it as train's checkpoints are saved: config.json,
config.py, model.safetensors in bf16 with a copy of the verifier's `embed_tokens`. With `fit_steps` > 0 it is
also a working draft, quickly: the decoder layer's output projections are zeroed, so the draft's logits are
`lm_head(norm(fc(aux)))`, a linear probe of the verifier's hidden states at position t; `fc` and `lm_head`
are fitted (full-batch Adam) to predict token t+2, what an Eagle-3 draft predicts first. That takes seconds
and gives a measurable acceptance at position 0 (later positions repeat the same guess).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3_pipeline.data.prepared import assign_splits
from eagle3_pipeline.tiny.build import locked

AUX_LAYERS = [1, 2, 3]
TRAIN_RESULT_CHECKPOINT = "checkpoints/checkpoint_best"


def conversations(dataset: Path, validation_fraction: float = 0.1, seed: int = 0) -> list[dict[str, Any]]:
    """The dataset's rows with ids and a split, as the data stage writes them (train rows first)."""
    rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    return assign_splits([{"id": str(i), **row} for i, row in enumerate(rows)], validation_fraction, seed)


def write_data_stage(art: Path, rows: list[dict[str, Any]], name: str = "prepare/h") -> str:
    out = art / name
    out.mkdir(parents=True)
    (out / "conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "result.json").write_text("{}\n")
    return name


def write_train_stage(art: Path, draft: Path, name: str = "train/h", extra_files: bool = True) -> str:
    """A train output holding `draft` as speculators' checkpoint_best (a link to epoch 0), with the optimizer
    and scheduler files an epoch directory has."""
    out = art / name
    epoch = out / "checkpoints" / "0"
    shutil.copytree(draft, epoch)
    (out / TRAIN_RESULT_CHECKPOINT).symlink_to("0")
    if extra_files:
        (epoch / "optimizer_state_dict.pt").write_bytes(b"\0" * 4096)
        (epoch / "scheduler_state_dict.pt").write_bytes(b"\0" * 64)
    (out / "result.json").write_text(json.dumps({"checkpoint": TRAIN_RESULT_CHECKPOINT}) + "\n")
    return name


@dataclass(frozen=True)
class Probe:
    """Training pairs for the draft: aux hidden states at t [N, 3H] and the draft index of token t+2 [N]."""

    features: torch.Tensor
    targets: torch.Tensor
    draft_ids: torch.Tensor  # target ids of the draft vocabulary, ascending


def probe_data(verifier: Path, rows: list[dict[str, Any]], vocab_size: int) -> Probe:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(verifier)
    model: Any = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.float32)
    model.eval()
    features, next_next = [], []
    with torch.no_grad():
        for row in rows:
            ids = tokenizer.apply_chat_template(row["messages"], tokenize=True)["input_ids"]
            out = model(torch.tensor([ids]), output_hidden_states=True)
            aux = torch.cat([out.hidden_states[i][0] for i in AUX_LAYERS], dim=-1)
            features.append(aux[: len(ids) - 2])
            next_next.append(torch.tensor(ids[2:]))
    tokens = torch.cat(next_next)
    frequent = [t for t, _ in Counter(tokens.tolist()).most_common(vocab_size)]
    draft_ids = torch.tensor(sorted(frequent), dtype=torch.long)
    index = torch.full((int(tokens.max()) + 1,), -1, dtype=torch.long)
    index[draft_ids] = torch.arange(len(draft_ids))
    keep = index[tokens] >= 0
    return Probe(torch.cat(features)[keep], index[tokens][keep], draft_ids)


def fit_probe(probe: Probe, hidden: int, steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """fc [H, 3H] and lm_head [V, H] so that lm_head(rmsnorm(fc(aux))) predicts the draft index."""
    generator = torch.Generator().manual_seed(seed)
    width = probe.features.shape[1]
    fc = (torch.randn(hidden, width, generator=generator) / width**0.5).requires_grad_()
    head = (torch.randn(len(probe.draft_ids), hidden, generator=generator) / hidden**0.5).requires_grad_()
    optimizer = torch.optim.Adam([fc, head], lr=0.02)
    for _ in range(steps):
        optimizer.zero_grad()
        h = probe.features @ fc.T
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        loss = torch.nn.functional.cross_entropy(h @ head.T, probe.targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return fc.detach(), head.detach()


def make_draft(
    verifier: Path, out: Path, rows: list[dict[str, Any]], vocab_size: int = 256, fit_steps: int = 0
) -> Path:
    """A speculators Eagle-3 draft for `verifier` in `out` (random, or a fitted probe with `fit_steps`)."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoConfig

    torch.manual_seed(0)
    probe = probe_data(verifier, rows, vocab_size)
    config = AutoConfig.from_pretrained(verifier)
    config.num_hidden_layers = 1
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[probe.draft_ids] = True
    d2t = probe.draft_ids - torch.arange(len(probe.draft_ids))
    model: Any = Eagle3DraftModel.from_training_args(
        config, t2d=t2d, d2t=d2t, verifier_name_or_path=str(verifier), draft_vocab_size=len(probe.draft_ids),
        norm_before_residual=False, ttt_steps=3, target_layer_ids=AUX_LAYERS, draft_attn_impl="sdpa",
    )  # fmt: skip
    if fit_steps:
        fc, head = fit_probe(probe, config.hidden_size, fit_steps)
        with torch.no_grad():
            model.fc.weight.copy_(fc)
            model.lm_head.weight.copy_(head)
            model.norm.weight.fill_(1.0)
            layer = model.layers[0]
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def shuffle_mapping(draft: Path, out: Path, seed: int = 0) -> Path:
    """A copy of `draft` whose d2t maps the draft tokens to a permutation of its target tokens: every target
    stays in the vocabulary (vLLM serves it), but the lm_head rows no longer belong to their tokens."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(draft, out)
    tensors = load_file(str(out / "model.safetensors"))
    d2t = tensors["d2t"]
    targets = torch.arange(len(d2t)) + d2t
    permuted = targets[torch.randperm(len(d2t), generator=torch.Generator().manual_seed(seed))]
    tensors["d2t"] = permuted - torch.arange(len(d2t))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


DATASET = "datasets/tiny-chat.jsonl"
VERIFIER = "tiny-llama"
FIT_ROWS, FIT_STEPS = 150, 100  # about 25 s on 2 cores; acceptance length about 1.75 with k = 3
RANDOM_ROWS = 20


def session_root(base: Path) -> Path:
    """The temp root every worker of the session shares: an xdist worker's base is `<root>/popen-<worker>`."""
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_draft(models: Path, base: Path, fitted: bool = True) -> Path:
    """A draft for the tiny verifier, made once per test session under `base` (the session's temp root).

    Under xdist the workers share it: the first to ask fits it (about 25 s of CPU) under a lock, and a second
    asking meanwhile waits for it rather than fitting its own. It appears by rename, whole or not at all.
    """
    root = session_root(base)
    out = root / ("draft-fitted" if fitted else "draft-random")
    with locked(root):
        if not (out / "model.safetensors").is_file():
            train = [r for r in conversations(models / DATASET) if r["split"] == "train"]
            rows = train[:FIT_ROWS] if fitted else train[:RANDOM_ROWS]
            partial = root / f".{out.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            make_draft(models / VERIFIER, partial, rows, fit_steps=FIT_STEPS if fitted else 0)
            partial.rename(out)
    return out


def evaluate_spec(**evaluation: Any) -> dict[str, Any]:
    """A spec for the tiny verifier as the cluster names it (/models/...), with `evaluation`."""
    return {
        "verifier": {"model": f"/models/{VERIFIER}", "maxModelLen": 1024},
        "dataset": {"source": f"/models/{DATASET}", "maxSequenceLength": 512},
        "extraction": {"backend": "transformers", "layers": AUX_LAYERS, "tokenBudget": 4096},
        "draft": {"vocabSize": 256},
        "evaluation": evaluation,
    }


def write_vocab_stage(art: Path, draft: Path, name: str = "vocab/h") -> str:
    """A vocab output holding the draft's own d2t/t2d, as the vocab stage names them."""
    import numpy as np
    from safetensors.torch import load_file

    tensors = load_file(str(draft / "model.safetensors"))
    n = len(tensors["d2t"])
    out = art / name
    out.mkdir(parents=True)
    np.save(out / f"d2t-{n}.npy", tensors["d2t"].numpy())
    np.save(out / f"t2d-{n}.npy", tensors["t2d"].numpy())
    result = {"draftVocabSize": n, "d2t": f"d2t-{n}.npy", "t2d": f"t2d-{n}.npy"}
    (out / "result.json").write_text(json.dumps(result) + "\n")
    return name
