"""Draft checkpoints: train's speculators checkpoint, its d2t/t2d mapping, and the slim serving checkpoint.

speculators saves a draft as `config.json` (Eagle3SpeculatorConfig; `speculators_config.verifier.name_or_path`
is the verifier's path on the training machine), `config.py` (the config class, for `auto_map`) and
`model.safetensors`: the draft's layers, `fc`, norms, `lm_head` (the verifier's lm_head rows of the draft
vocabulary: speculators 0.9 keeps them frozen, but vLLM needs them, as the draft's logits are over the draft
vocabulary), `d2t`, `t2d` and a frozen copy of the verifier's whole `embed_tokens`. Each epoch directory adds
optimizer and scheduler state.

The serving checkpoint keeps config.json, config.py and model.safetensors without `embed_tokens` (unless
the config says it was trained, `embed_requires_grad`), every floating-point tensor in bf16, and the verifier
named as the spec names it. vLLM 0.32 loads it: its Eagle-3 loader (`llama_eagle3.py`, `load_weights`) skips a
missing `embed_tokens`, and the proposer then shares the verifier's embedding (`_maybe_share_embeddings`);
with `--speculative-config` it never reads `verifier.name_or_path` (only `vllm serve DRAFT_DIR` does, to find
the verifier). speculators' `from_pretrained` reads the verifier at `name_or_path` (its layer count, and
`embed_tokens` to fill the missing copy), so loading it there needs the verifier at that path; use
`load_serving_draft`, which names the verifier and fills the embeddings reliably.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_contract.api.spec import DraftMethod, ExportedDraft
from eagle3_contract.draft_methods import METHODS, method_of_checkpoint
from eagle3_pipeline.runtime.context import read_result
from eagle3_pipeline.runtime.errors import StageError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
CONFIG_CODE_FILE = "config.py"  # speculators' config class, named by config.json's auto_map
WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
SPECULATION_KEY = "speculation"  # the manifest's copy of evaluate's table (export writes it, verify reads it)
DEFAULT_CHECKPOINT = "checkpoints/checkpoint_best"
EMBEDDINGS = "embed_tokens.weight"
DRAFT_HEAD = "lm_head.weight"
MAPPING = ("d2t", "t2d")
VERIFIER_ONLY_PREFIX = "verifier_"  # verifier_lm_head, verifier_norm: training targets, never saved
HASH_CHUNK = 1 << 20
READABLE = 0o644


def missing_files(checkpoint: Path) -> list[str]:
    """The files a draft checkpoint directory must hold (its config and weights) that it lacks."""
    return [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (checkpoint / name).is_file()]


def best_checkpoint(train_output: Path) -> Path:
    """The directory of train's best checkpoint (the result's `checkpoint`, relative to its output)."""
    relative = read_result(train_output).get("checkpoint") or DEFAULT_CHECKPOINT
    path = (train_output / str(relative)).resolve()
    missing = missing_files(path)
    if missing:
        raise StageError(
            f"train's checkpoint {train_output / str(relative)} has no {', '.join(missing)}: "
            "the train stage's output is incomplete or of another version; re-run stage train"
        )
    return path


def read_config(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / CONFIG_FILE
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(f"{path}: cannot read the draft's config ({exc}); re-run stage train") from None
    verifier = config.get("speculators_config", {}).get("verifier")
    if method_of_checkpoint(config) is None or not isinstance(verifier, dict):
        known = ", ".join(row.speculators_type for row in METHODS.values())
        raise StageError(
            f"{path} is not the config of a speculators draft this version serves (speculators_model_type "
            f"{config.get('speculators_model_type')!r}: one of {known}; verifier {verifier!r}); re-run "
            "stage train"
        )
    return config


def unstated_fields(config: dict[str, Any]) -> list[str]:
    """The fields vLLM reads from a draft of this config's method (its row's `vllm_reads`) that the config
    does not state: vLLM would take its own defaults for them."""
    method = method_of_checkpoint(config)
    reads = METHODS[method].vllm_reads if method is not None else ()
    return [name for name in reads if name not in config]


def checkpoint_method(checkpoint: Path) -> DraftMethod:
    """The draft method of a checkpoint directory, from its config (speculators_model_type)."""
    method = method_of_checkpoint(read_config(checkpoint))
    assert method is not None  # read_config refuses the others
    return method


def mapping_problem(d2t: torch.Tensor | None, t2d: torch.Tensor | None, target_vocab: int) -> str | None:
    """Why a draft's d2t and t2d do not describe the same draft vocabulary, or None when they do.

    Draft token i is target token i + d2t[i]; t2d marks the target tokens of the draft vocabulary. The
    draft's lm_head rows are the verifier's rows where t2d is set, in target-id order, so d2t must map draft
    index i to the i-th such token. A stale or shuffled d2t breaks this: the draft's proposals land on the
    wrong tokens.
    """
    import torch

    if d2t is None or t2d is None:
        return "the checkpoint lacks d2t or t2d (a draft with its own vocabulary needs both)"
    if t2d.numel() != target_vocab:
        return f"t2d covers {t2d.numel()} target tokens, the verifier's vocabulary has {target_vocab}"
    targets = torch.arange(d2t.numel(), dtype=torch.long) + d2t.to(torch.long)
    expected = torch.nonzero(t2d.to(torch.bool)).flatten()
    if expected.numel() != d2t.numel():
        return f"t2d marks {expected.numel()} target tokens, d2t maps {d2t.numel()} draft tokens"
    wrong = torch.nonzero(targets != expected).flatten()
    if wrong.numel():
        i = int(wrong[0])
        return (
            f"d2t maps {wrong.numel()} of {d2t.numel()} draft tokens elsewhere than t2d says (e.g. draft "
            f"token {i} -> target {int(targets[i])}, t2d's {i}-th token is {int(expected[i])})"
        )
    return None


def unservable_mapping(d2t: torch.Tensor | None, target_vocab: int) -> str | None:
    """Why vLLM could not serve a draft with this d2t at all (targets outside the vocabulary, repeated)."""
    import torch

    if d2t is None:
        return None
    targets = torch.arange(d2t.numel(), dtype=torch.long) + d2t.to(torch.long)
    outside = int(((targets < 0) | (targets >= target_vocab)).sum())
    if outside:
        return f"d2t maps {outside} draft tokens outside the verifier's vocabulary of {target_vocab} tokens"
    if torch.unique(targets).numel() != targets.numel():
        return "d2t maps several draft tokens to the same target token"
    return None


def foreign_embeddings(checkpoint: Path, verifier_dir: str) -> str | None:
    """How the checkpoint's copy of the verifier's embeddings differs from the verifier's own, or None.

    Train copies them from the verifier it trained against (bf16); a difference means the draft was trained
    for another version of the verifier, and the serving checkpoint, which drops the copy, will see other
    embeddings than in training. Checked only for a verifier in a local directory (no download).
    """
    from safetensors import safe_open
    from speculators.utils.loading import load_model_layers

    with safe_open(str(checkpoint / WEIGHTS_FILE), framework="pt") as f:
        if EMBEDDINGS not in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            return None
        copy = f.get_tensor(EMBEDDINGS)
    if not Path(verifier_dir).is_dir():
        return None
    try:
        own = load_model_layers([EMBEDDINGS], verifier_dir)[EMBEDDINGS]
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("cannot compare the draft's embeddings with %s's: %s", verifier_dir, exc)
        return None
    if own.shape != copy.shape:
        return f"the draft's embeddings are {list(copy.shape)}, the verifier's {list(own.shape)}"
    rows = int((own.to(copy.dtype) != copy).any(dim=-1).sum())
    if rows:
        return f"{rows} of {own.shape[0]} rows of the draft's copy of embed_tokens differ from the verifier's"
    return None


def target_vocab_size(config: dict[str, Any]) -> int:
    return int(config["transformer_layer_config"]["vocab_size"])


@dataclass
class ServingWeights:
    """The tensors a serving checkpoint keeps, and what was left out."""

    tensors: dict[str, torch.Tensor]
    dropped: list[str] = field(default_factory=list)
    trainable_parameters: int = 0  # floating-point tensors but the draft head (and frozen embeddings)
    head_parameters: int = 0  # lm_head: the verifier's rows of the draft vocabulary
    mapping_bytes: int = 0  # d2t + t2d

    @property
    def expected_bytes(self) -> int:
        """bf16 weights plus the mapping: what the serving checkpoint's weights should take."""
        return 2 * (self.trainable_parameters + self.head_parameters) + self.mapping_bytes


def served(name: str, trained_embeddings: bool) -> bool:
    """Whether vLLM needs the tensor: not the verifier's (training targets, the embedding copy)."""
    return not name.startswith(VERIFIER_ONLY_PREFIX) and (name != EMBEDDINGS or trained_embeddings)


def serving_weights(checkpoint: Path, config: dict[str, Any]) -> ServingWeights:
    """Everything vLLM needs: the draft's weights in bf16, d2t, t2d; not the verifier's embedding copy
    (which is not even read: for a large verifier it is gigabytes)."""
    import torch
    from safetensors import safe_open

    trained_embeddings = bool(config.get("embed_requires_grad", False))
    out = ServingWeights(tensors={})
    with safe_open(str(checkpoint / WEIGHTS_FILE), framework="pt") as weights:
        names = sorted(weights.keys())
        out.dropped = [n for n in names if not served(n, trained_embeddings)]
        tensors = {n: weights.get_tensor(n) for n in names if served(n, trained_embeddings)}
    for name, tensor in tensors.items():
        if name in MAPPING:
            out.mapping_bytes += tensor.numel() * tensor.element_size()
        elif tensor.is_floating_point():
            tensor = tensor.to(torch.bfloat16)
            if name == DRAFT_HEAD:
                out.head_parameters += tensor.numel()
            else:
                out.trainable_parameters += tensor.numel()
        out.tensors[name] = tensor.contiguous()
    if DRAFT_HEAD not in out.tensors:
        raise StageError(
            f"the draft checkpoint has no {DRAFT_HEAD}: vLLM cannot compute the draft's logits without it"
        )
    return out


def portable_config(config: dict[str, Any], verifier: str) -> dict[str, Any]:
    """The config with the verifier named as the spec names it (not the training machine's path), bf16."""
    out = copy.deepcopy(config)
    out["speculators_config"]["verifier"]["name_or_path"] = verifier
    out["dtype"] = "bfloat16"
    out.pop("torch_dtype", None)
    return out


@dataclass(frozen=True)
class SlimCheckpoint:
    path: Path
    weights: ServingWeights
    source_files: list[str]  # files of the source checkpoint left out (optimizer, scheduler, ...)


def write_serving_checkpoint(source: Path, target: Path, verifier: str) -> SlimCheckpoint:
    """Write the slim serving checkpoint of `source` into the directory `target` (its files are replaced)."""
    from safetensors.torch import save_file

    config = read_config(source)
    unstated = unstated_fields(config)
    if unstated:
        raise StageError(
            f"{source / CONFIG_FILE} does not state {', '.join(unstated)}: vLLM would load the draft with "
            "its own defaults for them, not with what was trained (speculators #1065); re-run stage train "
            "with this version's speculators, or add the fields with the trained values"
        )
    weights = serving_weights(source, config)
    target.mkdir(parents=True, exist_ok=True)
    save_file(weights.tensors, str(target / WEIGHTS_FILE), metadata={"format": "pt"})
    # safetensors writes 0600: the serving pod may run as another user than the export Job
    (target / WEIGHTS_FILE).chmod(READABLE)
    (target / CONFIG_FILE).write_text(json.dumps(portable_config(config, verifier), indent=2) + "\n")
    copied = {CONFIG_FILE, WEIGHTS_FILE}
    if (source / CONFIG_CODE_FILE).is_file():
        shutil.copyfile(source / CONFIG_CODE_FILE, target / CONFIG_CODE_FILE)
        copied.add(CONFIG_CODE_FILE)
    left_out = sorted(p.name for p in source.iterdir() if p.name not in copied)
    logger.info("serving checkpoint %s: dropped tensors %s and files %s", target, weights.dropped, left_out)
    return SlimCheckpoint(target, weights, left_out)


def check_exported(directory: Path, field: str, draft: ExportedDraft, remedy: str) -> None:
    """An exported draft a spec names (`field`: e.g. training.warmStart) is at `directory` (its path mapped
    onto this machine) and, with a sha256, holds the weights of that digest; else a StageError naming the
    field, the path and what to do (`remedy`)."""
    missing = missing_files(directory)
    if missing:
        raise StageError(f"{field}.path {draft.path}: no {', '.join(missing)} at {directory}: {remedy}")
    if draft.sha256 is not None:
        found = sha256_of(directory / WEIGHTS_FILE)
        if found != draft.sha256:
            raise StageError(
                f"ChecksumMismatch: {field}.path {draft.path}: {WEIGHTS_FILE} has sha256 {found}, "
                f"{field}.sha256 says {draft.sha256}; the files at the path changed, or the digest is of "
                "another draft"
            )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """manifest.json: sha256 and size of every file, and the weights' sha256 at the top level."""
    files: dict[str, dict[str, Any]] = {
        p.name: {"sha256": sha256_of(p), "bytes": p.stat().st_size}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST_FILE
    }
    manifest = {
        "sha256": files[WEIGHTS_FILE]["sha256"],
        "bytes": sum(f["bytes"] for f in files.values()),
        "files": files,
        **extra,
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def load_serving_draft(checkpoint: Path, verifier: str) -> Any:
    """The serving checkpoint as a speculators model, its embeddings the verifier's at `verifier`.

    speculators 0.9 marks a missing `embed_tokens` with NaN and fills it from the verifier only if it still
    holds a NaN after `from_pretrained`; transformers 5 materialises missing weights with `torch.empty_like`
    (uninitialised memory, seen as 3e38 and 5e-17 in a test run), so the embeddings were sometimes left as
    garbage. Here they are always copied from the verifier, with speculators' own weight reader.
    """
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.utils.loading import load_model_layers

    config = Eagle3SpeculatorConfig.from_pretrained(str(checkpoint))
    config.speculators_config.verifier.name_or_path = verifier
    model: Any = SpeculatorModel.from_pretrained(str(checkpoint), config=config)
    if not read_config(checkpoint).get("embed_requires_grad"):  # trained embeddings are in the checkpoint
        weight = load_model_layers([EMBEDDINGS], verifier)[EMBEDDINGS]
        model.embed_tokens.load_state_dict({"weight": weight})
    return model
