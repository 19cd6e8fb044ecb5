"""Multi-node training: one train stage program per node, joined by torchrun's c10d rendezvous.

A train stage of `training.nodes` > 1 runs the same `eagle3 stage train ...` argv on every node, told apart by
the environment (eagle3_contract.online): `EAGLE3_NODE_RANK`, `EAGLE3_NODES`, `EAGLE3_RENDEZVOUS` (host:port
of node 0's c10d rendezvous). Every node starts torchrun with `--nnodes N --rdzv-backend c10d`, one process
per GPU (one per node on the CPU, gloo), all reading the same `run.yaml` on the shared artifacts volume.

Node 0 is the stage: it holds the output's lock, prepares the work directory (run.yaml, the complete epochs
of an earlier attempt), hosts the rendezvous, and commits the result. Every other node is a worker
(`run_worker`): it waits until node 0's rendezvous answers, joins it, and exits 0 when training ends. It never
takes the lock, never creates, moves or removes the output or work directory, and writes no result. The
training's own files (checkpoints, metrics.jsonl, trainer.json) are written into node 0's work directory by
global rank 0, wherever c10d put it: c10d ranks the nodes by host name and process id, not by node rank, so
it may be a process of another node, writing through the shared volume while node 0 holds the lock.
(Renumbering the workers to put rank 0 on node 0 would move the process that hosts their store away from
the address torchrun gives the others.)

A worker process that dies makes torchrun (`--max-restarts`) restart the workers of every node: they resume
after the last complete epoch (`train_resume.keep_complete_epochs` runs on rank 0 before each start). Each
round of workers needs a store of its own (`TORCHRUN_ENV`): torchrun's default shares the agent's store
across rounds, and the restarted workers read the dead round's addresses from it (gloo: "Connection
refused" until it gives up).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from eagle3_contract.online import ENV_NODE_RANK, ENV_NODES, ENV_RENDEZVOUS
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.process_group import stop_group

logger = logging.getLogger(__name__)

# torchrun restarts every node's workers this many times after one of them fails.
MAX_RESTARTS = 3
# How long a worker node waits for node 0's rendezvous to answer (node 0 checks its inputs first).
RENDEZVOUS_WAIT_S = 1800.0
LOCAL_HOST = "127.0.0.1"
# torchrun's environment: the workers of each rendezvous round get a fresh store (see the module's doc)
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# How long the local executor lets worker nodes finish after node 0 exited (their torchrun winds down).
WORKER_EXIT_GRACE_S = 60.0


@dataclass(frozen=True)
class Nodes:
    """This node's place in a multi-node training run."""

    count: int
    rank: int
    rendezvous: str  # host:port of node 0's c10d rendezvous
    run_id: str  # the rendezvous id: the train stage's hash, the same on every node

    @property
    def host(self) -> str:
        return self.rendezvous.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.rendezvous.rpartition(":")[2])


def node_rank(env: Mapping[str, str] = os.environ) -> int:
    """EAGLE3_NODE_RANK (0 where unset): a rank above 0 runs a stage program in worker mode."""
    value = env.get(ENV_NODE_RANK, "").strip() or "0"
    if not value.isdigit():
        raise StageError(f"{ENV_NODE_RANK}={value!r}: expected a node rank (0, 1, ...)")
    return int(value)


def nodes_of(count: int, run_id: str, env: Mapping[str, str] = os.environ) -> Nodes | None:
    """The multi-node settings of a train stage of `count` nodes (None for one node), from the environment."""
    rank = node_rank(env)
    if count == 1:
        if rank > 0:
            raise StageError(f"{ENV_NODE_RANK} is {rank}, but training.nodes is 1: there is no node {rank}")
        return None
    missing = [name for name in (ENV_NODE_RANK, ENV_NODES, ENV_RENDEZVOUS) if not env.get(name)]
    if missing:
        raise StageError(
            f"training.nodes is {count}: the train stage runs once per node with {', '.join(missing)} set "
            "(the operator and `eagle3 run` set them); set them to run a node by hand",
            keep_work=True,
        )
    if env[ENV_NODES] != str(count) or rank >= count:
        raise StageError(
            f"{ENV_NODES}={env[ENV_NODES]} and {ENV_NODE_RANK}={rank} do not fit training.nodes {count}",
            keep_work=True,
        )
    host, _, port = env[ENV_RENDEZVOUS].rpartition(":")
    if not host or not port.isdigit():
        raise StageError(f"{ENV_RENDEZVOUS}={env[ENV_RENDEZVOUS]!r}: expected host:port", keep_work=True)
    return Nodes(count=count, rank=rank, rendezvous=env[ENV_RENDEZVOUS], run_id=run_id)


def rendezvous_args(nodes: Nodes, nproc: int, max_restarts: int = MAX_RESTARTS) -> list[str]:
    """torchrun's options for node `nodes.rank` of `nodes.count`, `nproc` processes each.

    Node 0 hosts the c10d store (`is_host`): every node of the Indexed Job would otherwise decide by matching
    the endpoint against its own host names, and locally every node matches 127.0.0.1. `--node-rank` is
    informational for c10d (it ranks the nodes itself).
    """
    return [
        "--nnodes",
        str(nodes.count),
        "--node-rank",
        str(nodes.rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        nodes.rendezvous,
        "--rdzv-id",
        nodes.run_id,
        "--rdzv-conf",
        f"is_host={1 if nodes.rank == 0 else 0}",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
    ]


def rendezvous_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_rendezvous(
    nodes: Nodes, finished: Callable[[], bool], wait_s: float = RENDEZVOUS_WAIT_S
) -> bool:
    """Wait until node 0's rendezvous answers: True, or False when `finished()` (node 0 committed meanwhile:
    there is nothing left to join). StageError after `wait_s`."""
    deadline = time.monotonic() + wait_s
    logger.info("node %d of %d: waiting for node 0 at %s", nodes.rank, nodes.count, nodes.rendezvous)
    while not rendezvous_answers(nodes.host, nodes.port):
        if finished():
            return False
        if time.monotonic() > deadline:
            raise StageError(
                f"node {nodes.rank}: node 0's rendezvous {nodes.rendezvous} did not answer in {wait_s:.0f} s "
                "(did node 0 fail, or is its address wrong?)"
            )
        time.sleep(1.0)
    return True


def free_port(host: str = LOCAL_HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def local_nodes(command: list[str], env: dict[str, str], count: int) -> Iterator[dict[str, str]]:
    """Run nodes 1..count-1 of a multi-node stage on this machine while the block runs node 0.

    Each worker node is `command` with its rank in the environment, in a process group of its own; the
    block gets node 0's environment (the same rendezvous, 127.0.0.1 and a free port). When the block ends,
    workers have WORKER_EXIT_GRACE_S to finish, then their groups are stopped. With one node it yields `env`.
    """
    if count <= 1:
        yield env
        return
    shared = env | {ENV_NODES: str(count), ENV_RENDEZVOUS: f"{LOCAL_HOST}:{free_port()}"}
    workers = [
        subprocess.Popen(
            command,
            env=shared | {ENV_NODE_RANK: str(rank)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        for rank in range(1, count)
    ]
    try:
        yield shared | {ENV_NODE_RANK: "0"}
    except BaseException:  # node 0 did not run to its end (Ctrl-C, SIGTERM): neither may its workers
        for proc in workers:
            stop_group(proc, signal.SIGTERM, 30.0)
        raise
    else:
        deadline = time.monotonic() + WORKER_EXIT_GRACE_S
        for rank, proc in enumerate(workers, 1):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                logger.warning("worker node %d is still running after node 0 ended: stopping it", rank)
                stop_group(proc, signal.SIGTERM, 30.0)
            elif proc.returncode != 0:
                logger.warning("worker node %d exited with code %d", rank, proc.returncode)
