"""EAGLE-3 draft training with speculators: the objects `speculators train` builds, from one TrainConfig.

`train_config` turns the stage's params and the upstream outputs into speculators' own `TrainConfig` (its
schema fills in the eagle3 defaults: Llama draft layers, Muon + AdamW, KL loss against the verifier, ...).
The stage saves it as `run.yaml` beside the checkpoints, the file `speculators train --config run.yaml`
reads. `train` then does what `speculators.train.cli.main` does for eagle3, calling the same functions:
`set_seed`, `parse_vocab_mappings`, `build_draft_model`, the hidden-states backend's `from_train_args`,
`create_train_val_loaders` (ArrowDataset over the data stage's dataset, hidden states from extract's files,
`on_missing="raise"`), the model's trainer kwargs, `TrainerConfig`, `Trainer.run_training`. It leaves out
main's console and metric-backend setup (metrics go to `train_metrics.MetricsRecorder`) and its
`train_command.txt` (it would copy a `git diff` of any checkout around the virtual environment).

It runs in the stage's process (the CPU or one device), or once per GPU under torchrun (`torchrun_argv`):
`python -m torch.distributed.run ... -m eagle3_pipeline.train_draft --config run.yaml --metrics M --info I`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3_contract.api.spec import Scheduler
from eagle3_contract.params import TrainParams
from eagle3_pipeline.errors import StageError
from eagle3_pipeline.speculators_cpu import cpu_adapted
from eagle3_pipeline.train_metrics import recording

logger = logging.getLogger(__name__)

RUN_CONFIG_FILE = "run.yaml"
HIDDEN_PER_THREAD = 512
# speculators' data loaders set these (for their spawned workers) in the training process's environment.
_LOADER_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# On the CPU: flex attention has no CPU backward, the fused loss needs Triton, and spawned loader workers each
# re-import torch (seconds per worker on a small machine) to read a few small files.
CPU_SETTINGS: dict[str, Any] = {"draft_attn_impl": "sdpa", "loss_implementation": "eager", "num_workers": 0}


@dataclass(frozen=True)
class DraftSources:
    """What the draft is trained from: the verifier and the upstream stages' files."""

    verifier: str  # a local path or a Hub id
    trust_remote_code: bool
    dataset: Path  # the data stage's `data/` (save_to_disk)
    hidden_states: Path  # extract's output: hs_<i>.safetensors
    transfer: str  # the hs_connectors backend reading them: "file" or "fp8"
    aux_layers: list[int]  # the verifier layers the files hold (sorted), the draft's target layer ids
    hidden_size: int
    d2t: Path
    t2d: Path
    vocab_size: int
    train_ratio: float  # int(rows * train_ratio) is the number of training rows (they come first)


def scheduler_settings(kind: Scheduler) -> dict[str, Any]:
    """speculators' scheduler for the spec's: linear and cosine as they are; constant keeps the warmup.

    speculators' "none" would drop the warmup too, so constant is a cosine schedule of zero cycles: after
    the linear warmup its factor 0.5 * (1 + cos(0)) is 1.
    """
    if kind == Scheduler.CONSTANT:
        return {"scheduler_type": "cosine", "scheduler_num_cosine_cycles": 0.0}
    return {"scheduler_type": kind.value}


def train_config(params: TrainParams, src: DraftSources, save_path: Path, *, cpu: bool) -> Any:
    """speculators' TrainConfig for this run (a StageError names what speculators refused)."""
    from pydantic import ValidationError
    from speculators.train.config import TrainConfig

    t = params.training
    cli: dict[str, Any] = {
        "speculator_type": "eagle3",
        "seed": params.seed,
        "verifier_name_or_path": src.verifier,
        "trust_remote_code": src.trust_remote_code,
        "num_layers": params.draft.layers,
        "target_layer_ids": list(src.aux_layers),
        "draft_vocab_size": src.vocab_size,
        "d2t_path": str(src.d2t),
        "t2d_path": str(src.t2d),
        "data_path": str(src.dataset),
        "hidden_states_backend": src.transfer,
        "total_seq_len": t.sequence_length,
        "train_data_ratio": src.train_ratio,
        "on_missing": "raise",  # never speculators' default "generate", which asks a vLLM at localhost:8000
        "ttt_steps": t.ttt_steps,
        "lr": t.learning_rate,
        "scheduler_warmup_ratio": t.warmup_ratio,
        "epochs": t.epochs,
        "save_path": str(save_path),
        "checkpoint_freq": 1.0,
        "log_freq": 1,
        **scheduler_settings(t.scheduler),
        **(CPU_SETTINGS if cpu else {}),
    }
    try:
        return TrainConfig.from_sources(
            cli=cli,
            argv=["eagle3", "stage", "train"],
            backend_cli={"hidden_states_path": str(src.hidden_states)},
        )
    except (ValidationError, ValueError) as exc:
        raise StageError(f"speculators refused the training settings: {exc}") from None


def load_config(path: Path) -> Any:
    """A TrainConfig from a `run.yaml` that `train_config(...).dump_yaml()` wrote."""
    from speculators.train.config import TrainConfig

    return TrainConfig.from_sources(cli={}, config_path=str(path), argv=["--config", str(path)])


def cpu_threads(hidden_size: int, cpus: int) -> int:
    """Intra-op threads for training a draft of `hidden_size` on `cpus` CPUs: one per HIDDEN_PER_THREAD units.

    A small draft's matmuls are too small to split: a hidden-128 draft ran 4x faster on one thread than on
    two (0.28 against 1.11 s per step on a busy 2-core machine).
    """
    return max(1, min(cpus, hidden_size // HIDDEN_PER_THREAD))


def pin_threads(hidden_size: int) -> int:
    """Set torch's intra-op threads for CPU training ($OMP_NUM_THREADS wins when set); returns the count."""
    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(cpu_threads(hidden_size, len(os.sched_getaffinity(0))))
    return int(torch.get_num_threads())


def trainer_config(args: argparse.Namespace, train_kwargs: dict[str, Any], val_kwargs: dict[str, Any]) -> Any:
    """`TrainerConfig` as cli.main fills it: the fields named as in TrainConfig, plus four that are not."""
    from speculators.train.trainer import TrainerConfig

    special: dict[str, Any] = {
        "num_epochs": args.epochs,
        "resume_from_checkpoint": not args.no_resume_from_checkpoint,
        "train_call_kwargs": train_kwargs,
        "val_call_kwargs": val_kwargs,
        "hidden_states_dtype": getattr(torch, args.hidden_states_dtype),
    }
    same = {name: getattr(args, name) for name in TrainerConfig._fields if name not in special}
    return TrainerConfig(**same, **special)


def build_trainer(args: argparse.Namespace) -> Any:
    """The draft model, the data loaders and the Trainer, as `speculators train` builds them for eagle3."""
    from hs_connectors import HiddenStatesBackend
    from speculators.model import SpeculatorModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train import cli
    from speculators.train.dataloader import create_train_val_loaders
    from speculators.train.trainer import Trainer

    d2t, t2d, draft_vocab_size = cli.parse_vocab_mappings(args)
    model_class = (SpeculatorModel.registry or {})[args.speculator_type]
    model = cli.build_draft_model(args, model_class, t2d, d2t, draft_vocab_size)
    transfer = HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(args, args.data_path)
    train_loader, val_loader = create_train_val_loaders(
        data_path=args.data_path,
        total_seq_len=args.total_seq_len,
        hidden_states_dtype=getattr(torch, args.hidden_states_dtype),
        transfer=transfer,
        vllm_endpoint=args.vllm_endpoint,
        on_missing=args.on_missing,
        verifier_name_or_path=args.verifier_name_or_path,
        request_timeout=args.request_timeout,
        max_retries=args.max_retries,
        generation_validation_retries=args.generation_validation_retries,
        max_consecutive_generation_failures=args.max_consecutive_generation_failures,
        hidden_size=model.config.transformer_layer_config.hidden_size,
        num_target_layers=len(args.target_layer_ids),
        num_workers=args.num_workers,
        prefetch_factor=args.prefetch_factor,
        preprocess=shift_batch,
        train_data_ratio=args.train_data_ratio,
        seed=args.seed,
    )
    train_kwargs, val_kwargs = model_class.get_trainer_kwargs(**vars(args))
    return Trainer(model, trainer_config(args, train_kwargs, val_kwargs), train_loader, val_loader)


def train(cfg: Any, metrics: Path, info: Path) -> None:
    """Train (or resume) to the configured epochs: checkpoints in cfg's save path, a metrics line per epoch.

    `info` receives what the result needs from the process that held the model: trainable parameters, the
    device, the world size and the epoch this attempt started at.
    """
    from speculators.train import cli
    from speculators.train.distributed import get_rank, maybe_destroy_distributed, maybe_setup_distributed

    if cfg.speculator_type != "eagle3":
        raise StageError(f"speculator_type {cfg.speculator_type}: this stage trains eagle3 drafts only")
    args = argparse.Namespace(**cfg.flatten())
    cli.set_seed(args.seed, args.deterministic_cuda)
    saved_env = {name: os.environ.get(name) for name in _LOADER_ENV}
    maybe_setup_distributed()
    try:
        with cpu_adapted() as on_cpu, recording(metrics, is_writer=lambda: get_rank() == 0):
            trainer = build_trainer(args)
            if get_rank() == 0:
                write_info(info, trainer, on_cpu)
            trainer.run_training()
    finally:
        maybe_destroy_distributed()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def write_info(path: Path, trainer: Any, on_cpu: bool) -> None:
    from speculators.train.distributed import get_world_size

    params = list(trainer.model.parameters())
    info = {
        "parameters": sum(p.numel() for p in params if p.requires_grad),
        "totalParameters": sum(p.numel() for p in params),
        "device": "cpu" if on_cpu else str(next(iter(params)).device.type),
        "worldSize": get_world_size(),
        "threads": torch.get_num_threads(),
        "startEpoch": trainer.current_epoch,
    }
    path.write_text(json.dumps(info, indent=2) + "\n")
    logger.info(
        "draft: %d trainable parameters on %s (world size %d); starting at epoch %d of %d",
        info["parameters"],
        info["device"],
        info["worldSize"],
        trainer.current_epoch,
        trainer.config.num_epochs,
    )


def torchrun_argv(
    nproc: int, config: Path, metrics: Path, info: Path, python: str = sys.executable
) -> list[str]:
    """The command that trains on `nproc` GPUs of this node: torchrun running this module once per GPU."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "-m",
        __name__,
        "--config",
        str(config),
        "--metrics",
        str(metrics),
        "--info",
        str(info),
    ]


def main(argv: list[str] | None = None) -> int:
    """One torchrun worker: train from a `run.yaml` (every rank runs this; rank 0 writes the files)."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=main.__doc__)
    parser.add_argument("--config", required=True, type=Path, help="speculators' run.yaml")
    parser.add_argument("--metrics", required=True, type=Path, help="metrics.jsonl to append epochs to")
    parser.add_argument("--info", required=True, type=Path, help="where to write the model's figures")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s [rank {rank}] %(name)s: %(message)s")
    train(load_config(args.config), args.metrics, args.info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
