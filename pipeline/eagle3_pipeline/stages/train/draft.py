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
`python -m torch.distributed.run ... -m eagle3_pipeline.stages.train.draft --config run.yaml --metrics M
--info I`, on one node or on `training.nodes` of them (eagle3_pipeline.stages.train.nodes: on the CPU, one
process per node and gloo). Its progress (steps, loss, epochs) goes to the stage's reporter in the stage's
process, or with `--progress P` to the events file the stage relays (eagle3_pipeline.stages.train.events).
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

from eagle3_contract.api.spec import DraftMethod, Scheduler
from eagle3_contract.draft_methods import (
    DFLASH_BLOCK_SIZE,
    METHODS,
    PARALLEL_DEPTHS,
    MethodRow,
    method_row,
)
from eagle3_contract.log_format import configure_logging
from eagle3_contract.params import TrainParams
from eagle3_pipeline.adapters.eagle3_loss_cpu import fused_loss
from eagle3_pipeline.adapters.fused_loss_kernels import separate_autotune_configs
from eagle3_pipeline.adapters.speculators_cpu import (
    cpu_adapted,
    cpu_autocast,
    fork_loader_workers,
    setup_distributed,
)
from eagle3_pipeline.adapters.speculators_interrupt import stopping_at_step_end
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.host_cpu import available_cpus, native_bfloat16
from eagle3_pipeline.serving.kv_transfer import CPU_MOONCAKE_BUFFER_GIB, CPU_MOONCAKE_SEGMENT_GIB
from eagle3_pipeline.stages.train.events import EventsWriter, TrainSink
from eagle3_pipeline.stages.train.metrics import recording
from eagle3_pipeline.stages.train.nodes import Nodes, rendezvous_args
from eagle3_pipeline.stages.train.online_samples import adapt_loaders, wait_for_producers
from eagle3_pipeline.stages.train.resume import keep_complete_epochs

logger = logging.getLogger(__name__)

RUN_CONFIG_FILE = "run.yaml"
HIDDEN_PER_THREAD = 512
TRAINED_TYPES = tuple(row.speculators_type for row in METHODS.values())  # speculators' draft types
# speculators' data loaders set these (for their spawned workers) in the training process's environment.
_LOADER_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# On the CPU: flex attention has no CPU backward, the fused loss needs Triton, and spawned loader workers each
# re-import torch (seconds per worker on a small machine) to read a few small files.
CPU_SETTINGS: dict[str, Any] = {"draft_attn_impl": "sdpa", "loss_implementation": "eager", "num_workers": 0}
# Online, each loader worker has one request in flight: with none, the producer sees one sample at a time.
ONLINE_CPU_WORKERS = 4


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
    # online (extraction.mode: online): the producers' OpenAI API, and the Mooncake master for `mooncake`
    endpoint: str | None = None
    mooncake_master: str | None = None


def scheduler_settings(kind: Scheduler) -> dict[str, Any]:
    """speculators' scheduler for the spec's: linear and cosine as they are; constant keeps the warmup.

    speculators' "none" would drop the warmup too, so constant is a cosine schedule of zero cycles: after
    the linear warmup its factor 0.5 * (1 + cos(0)) is 1.
    """
    if kind == Scheduler.CONSTANT:
        return {"scheduler_type": "cosine", "scheduler_num_cosine_cycles": 0.0}
    return {"scheduler_type": kind.value}


def train_config(
    params: TrainParams, src: DraftSources, save_path: Path, *, cpu: bool, warm: Path | None = None
) -> Any:
    """speculators' TrainConfig for this run (a StageError names what speculators refused); `warm`: a whole
    draft checkpoint to start from (stages.train.warm_start), whose own config shapes the draft."""
    from pydantic import ValidationError
    from speculators.train.config import TrainConfig

    t, row = params.training, method_row(params.draft.method)
    cli: dict[str, Any] = {
        "speculator_type": row.speculators_type,
        "seed": params.seed,
        "verifier_name_or_path": src.verifier,
        "trust_remote_code": src.trust_remote_code,
        # --from-pretrained takes the decoder's shape from the checkpoint, and refuses shaping flags beside it
        **({"from_pretrained": str(warm)} if warm is not None else {"num_layers": params.draft.layers}),
        "target_layer_ids": list(src.aux_layers),
        "draft_vocab_size": src.vocab_size,
        "d2t_path": str(src.d2t),
        "t2d_path": str(src.t2d),
        "data_path": str(src.dataset),
        "hidden_states_backend": src.transfer,
        "total_seq_len": t.sequence_length,
        "train_data_ratio": src.train_ratio,
        # offline: never speculators' default "generate", which would ask a vLLM at localhost:8000
        **online_settings(src),
        **method_settings(row, params, cpu=cpu),
        "lr": t.learning_rate,
        "scheduler_warmup_ratio": t.warmup_ratio,
        "epochs": t.epochs,
        "save_path": str(save_path),
        "checkpoint_freq": 1.0,
        "log_freq": 1,
        **scheduler_settings(t.scheduler),
        **(cpu_settings(src) if cpu else {}),
    }
    try:
        return TrainConfig.from_sources(
            cli=cli,
            argv=["eagle3", "stage", "train"],
            backend_cli=backend_settings(src, cpu=cpu),
        )
    except (ValidationError, ValueError) as exc:
        raise StageError(f"speculators refused the training settings: {exc}") from None


def method_settings(row: MethodRow, params: TrainParams, *, cpu: bool) -> dict[str, Any]:
    """speculators' options of the draft method: EAGLE-3's training-time-test steps; P-EAGLE's depths
    (speculators' default, PARALLEL_DEPTHS); DFlash's block size (draft.blockSize, or speculators' default).
    P-EAGLE and DFlash, on the CPU, read their hidden states in float32: their `fc` takes them without a
    norm, so without a GPU's autocast the bfloat16 files would meet float32 weights."""
    if row.method == DraftMethod.EAGLE3:
        return {"ttt_steps": params.training.ttt_steps}
    float32 = {"hidden_states_dtype": "float32"} if cpu else {}
    if row.method == DraftMethod.DFLASH:
        block = params.draft.block_size if params.draft.block_size is not None else DFLASH_BLOCK_SIZE
        return {"block_size": block, **float32}
    return {"num_depths": PARALLEL_DEPTHS, **float32}


def online_settings(src: DraftSources) -> dict[str, Any]:
    """speculators' generation settings: ask the producers for every sample online, never offline."""
    if src.endpoint is None:
        return {"on_missing": "raise"}
    return {"on_missing": "generate", "vllm_endpoint": src.endpoint}


def cpu_settings(src: DraftSources) -> dict[str, Any]:
    """CPU_SETTINGS, with loader workers online: they are what keeps several requests at the producers."""
    return {**CPU_SETTINGS, "num_workers": ONLINE_CPU_WORKERS} if src.endpoint else CPU_SETTINGS


def backend_settings(src: DraftSources, *, cpu: bool = False) -> dict[str, Any]:
    """The hs-connectors backend's own settings: the files' directory, or the Mooncake master."""
    if src.transfer == "mooncake":
        if not src.mooncake_master:
            raise StageError(
                "extraction.transfer is mooncake, but no Mooncake master is given: set "
                "$EAGLE3_MOONCAKE_MASTER "
                "(host:port; the operator and `eagle3 run` set it for the train stage)"
            )
        if not cpu:
            return {"mooncake_master": src.mooncake_master}

        return {
            "mooncake_master": src.mooncake_master,
            "mooncake_global_segment_gib": CPU_MOONCAKE_SEGMENT_GIB,
            "mooncake_local_buffer_gib": CPU_MOONCAKE_BUFFER_GIB,
        }
    return {"hidden_states_path": str(src.hidden_states)}


def load_config(path: Path) -> Any:
    """A TrainConfig from a `run.yaml` that `train_config(...).dump_yaml()` wrote."""
    from speculators.train.config import TrainConfig

    return TrainConfig.from_sources(cli={}, config_path=str(path), argv=["--config", str(path)])


def cpu_threads(hidden_size: int, cpus: int) -> int:
    """Intra-op threads for training a draft of `hidden_size` on `cpus` CPUs: every one of them, but a single
    thread for a draft narrower than HIDDEN_PER_THREAD.

    A draft at a 100M-class verifier's shape (hidden 576) ran 1.78x faster on two threads than on one
    (`benchmarks/train_cpu.py --shape 100m --threads 2` against `--threads 1`, docs/benchmarks.md); the tiny
    draft (hidden 128) is measured on one thread only (`benchmarks/train_cpu.py`), its products too small to
    be worth splitting. The threshold is only known to lie between the two shapes.
    """
    return 1 if hidden_size < HIDDEN_PER_THREAD else max(1, cpus)


def pin_threads(hidden_size: int) -> int:
    """Set torch's intra-op threads for CPU training ($OMP_NUM_THREADS wins when set) from the CPUs this
    process may use (its affinity and its cgroup's quota: a pod's CPU limit); returns the count."""
    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(cpu_threads(hidden_size, available_cpus()))
    return int(torch.get_num_threads())


def cpu_compute(trainer: Any, hidden_size: int, native_bf16: bool) -> bool:
    """How a draft of `hidden_size` trains on this CPU: its threads (pin_threads), and for a draft past the
    tiny one on a CPU with native bfloat16, bfloat16 products under autocast as on a GPU (1.30x stock's
    float32 products at a 100M-class verifier's shape: docs/benchmarks.md). Returns whether the draft is
    past the tiny one, which also takes the loss computed once per forward (adapters.eagle3_loss_cpu). The
    tiny draft stays as speculators trains it, in float32: its products are too small to gain, and the
    demo's figures stay as they were."""
    threads = pin_threads(hidden_size)
    large = hidden_size >= HIDDEN_PER_THREAD
    autocast = native_bf16 and large
    if autocast:
        cpu_autocast(trainer)
    logger.info(
        "draft (hidden %d) on %d CPU thread(s), %s%s",
        hidden_size,
        threads,
        "bfloat16 products under autocast" if autocast else "float32 products",
        ", the loss's target statistics once per forward" if large else "",
    )
    return large


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
        # online: "" lets speculators take the model the producers serve from their endpoint ("verifier")
        verifier_name_or_path="" if args.on_missing == "generate" else args.verifier_name_or_path,
        request_timeout=args.request_timeout,
        max_retries=args.max_retries,
        generation_validation_retries=args.generation_validation_retries,
        max_consecutive_generation_failures=args.max_consecutive_generation_failures,
        hidden_size=model.config.transformer_layer_config.hidden_size,
        num_target_layers=len(args.target_layer_ids),
        num_workers=args.num_workers,
        prefetch_factor=args.prefetch_factor,
        # as `speculators train` does: EAGLE-3 and P-EAGLE shift the batch; DFlash reads it as it is
        preprocess=shift_batch if args.speculator_type in ("eagle3", "peagle") else None,
        train_data_ratio=args.train_data_ratio,
        seed=args.seed,
    )
    fork_loader_workers((train_loader, val_loader))
    if args.on_missing == "generate":  # online: wait for the producers, keep samples if asked
        wait_for_producers(args.vllm_endpoint)
        adapt_loaders((train_loader, val_loader), args.vllm_endpoint)
    train_kwargs, val_kwargs = model_class.get_trainer_kwargs(**vars(args))
    return Trainer(model, trainer_config(args, train_kwargs, val_kwargs), train_loader, val_loader)


def train(cfg: Any, metrics: Path, info: Path, progress: TrainSink | None = None) -> None:
    """Train (or resume) to the configured epochs: checkpoints in cfg's save path, a metrics line per epoch.

    `info` receives what the result needs from the process that held the model: trainable parameters, the
    device, the world size and the epoch this attempt started at; `progress` (rank 0's) the plan, every step
    and every epoch. Before the trainer looks at its save path,
    the process that is rank 0 keeps only the complete epochs (a torchrun restart skips the stage's own
    cleanup) while the others wait for it in the process group's first barrier.
    """
    import torch.distributed as dist
    from speculators.train import cli
    from speculators.train.distributed import (
        get_rank,
        get_world_size,
        is_distributed,
        maybe_destroy_distributed,
    )

    if cfg.speculator_type not in TRAINED_TYPES:
        known = ", ".join(TRAINED_TYPES)
        raise StageError(f"speculator_type {cfg.speculator_type}: this stage trains {known} drafts only")
    args = argparse.Namespace(**cfg.flatten())
    cli.set_seed(args.seed, args.deterministic_cuda)
    saved_env = {name: os.environ.get(name) for name in _LOADER_ENV}
    if int(os.environ.get("RANK", "0")) == 0:
        keep_complete_epochs(Path(args.save_path), metrics)
    setup_distributed()
    separate_autotune_configs()  # torch 2.11's Dynamo cannot trace the fused loss otherwise (see its module)

    def is_writer() -> bool:
        return bool(get_rank() == 0)

    try:
        if is_distributed():
            dist.barrier()
        recorded, native = recording(metrics, is_writer, progress, get_world_size()), native_bfloat16()
        with cpu_adapted(native) as on_cpu, recorded:
            trainer, fused = build_trainer(args), False
            if on_cpu:  # a torchrun worker's threads as the stage sets them for training in-process
                model = getattr(trainer.model, "module", trainer.model)  # inside DDP when distributed
                fused = cpu_compute(trainer, model.config.transformer_layer_config.hidden_size, native)
            if is_writer():
                write_info(info, trainer, on_cpu)
                if progress is not None:
                    progress.train_plan(
                        trainer.config.num_epochs, steps_per_epoch(trainer), trainer.global_step,
                        trainer.current_epoch,
                    )  # fmt: skip
            with fused_loss(fused), stopping_at_step_end():  # a SIGTERM stops training after its step
                trainer.run_training()
    finally:
        maybe_destroy_distributed()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def steps_per_epoch(trainer: Any) -> int | None:
    """Optimizer steps in an epoch (this rank's batches), None when the loader cannot tell."""
    try:
        return len(trainer.train_loader)
    except TypeError:
        return None


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
        trainer.current_epoch + 1,  # speculators' index is 0-based; people count epochs from 1
        trainer.config.num_epochs,
    )


def torchrun_argv(
    nproc: int,
    config: Path,
    metrics: Path,
    info: Path,
    python: str = sys.executable,
    nodes: Nodes | None = None,
    progress: Path | None = None,
) -> list[str]:
    """The command that trains on `nproc` GPUs of this node: torchrun running this module once per GPU.

    With `nodes`, this node's part of a multi-node run: c10d rendezvous at node 0, restarts after a failed
    worker, and the worker told its node rank (for its log lines). Run it with `train_nodes.TORCHRUN_ENV`.
    """
    if nodes is None:
        launcher = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc)]
        node_args: list[str] = []
    else:
        launcher, node_args = rendezvous_args(nodes, nproc), ["--node-rank", str(nodes.rank)]
    worker = ["-m", __name__, "--config", str(config), "--metrics", str(metrics), "--info", str(info)]
    if progress is not None:
        worker += ["--progress", str(progress)]
    return [python, "-m", "torch.distributed.run", *launcher, *worker, *node_args]


def main(argv: list[str] | None = None) -> int:
    """One torchrun worker: train from a `run.yaml` (every rank runs this; rank 0 writes the files)."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=main.__doc__)
    parser.add_argument("--config", required=True, type=Path, help="speculators' run.yaml")
    parser.add_argument("--metrics", required=True, type=Path, help="metrics.jsonl to append epochs to")
    parser.add_argument("--info", required=True, type=Path, help="where to write the model's figures")
    parser.add_argument("--node-rank", type=int, help="this node's rank in a multi-node run (for the log)")
    parser.add_argument("--progress", type=Path, help="events file for the stage's progress (rank 0 writes)")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    where = f"node {args.node_rank} rank {rank}" if args.node_rank is not None else f"rank {rank}"
    configure_logging(where=where)
    writer = EventsWriter(args.progress) if args.progress is not None else None
    try:
        train(load_config(args.config), args.metrics, args.info, writer)
    finally:
        if writer is not None:
            writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
