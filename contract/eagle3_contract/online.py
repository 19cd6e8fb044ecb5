"""Online hidden states and multi-node training: what the operator (or the local executor) and the programs
it starts agree on, beyond a stage's parameters.

Online extraction runs `extraction.servers` hidden-state producers (`eagle3 produce`: vLLM with the
`extract_hidden_states` method and an hs-connectors KV connector) behind one endpoint, and with
`extraction.transfer: mooncake` a Mooncake master. The train stage finds them through the environment:
`ENV_HIDDEN_STATES_ENDPOINT` (the producers' OpenAI API, `http://host:port/v1`) and `ENV_MOONCAKE_MASTER`
(`host:port`). With the volume transfer, producers write each sample under `staging_dir(...)` on the artifacts
volume, where the trainer reads it, then deletes it.

A train stage of `training.nodes` > 1 is one program per node: each starts torchrun with
`ENV_NODE_RANK` (0 is the node that owns the output directory and writes the result), `ENV_NODES`, and
`ENV_RENDEZVOUS` (`host:port` of node 0's c10d rendezvous; in the cluster, pod 0 of the Indexed Job behind
its headless Service).
"""

from __future__ import annotations

ENV_HIDDEN_STATES_ENDPOINT = "EAGLE3_HIDDEN_STATES_ENDPOINT"
ENV_MOONCAKE_MASTER = "EAGLE3_MOONCAKE_MASTER"
ENV_NODE_RANK = "EAGLE3_NODE_RANK"
ENV_NODES = "EAGLE3_NODES"
ENV_RENDEZVOUS = "EAGLE3_RENDEZVOUS"

PRODUCER_PORT = 8000
MOONCAKE_MASTER_PORT = 50051
MOONCAKE_METRICS_PORT = 9003
RENDEZVOUS_PORT = 29500

# Volume transfer: where producers write the samples of the train stage with this hash (relative to the
# artifacts root). Outside the train stage's own directory: the stage program owns that one.
STAGING_ROOT = "hidden-states"


def staging_dir(train_hash: str) -> str:
    """The directory (relative to the artifacts root) producers write a train stage's samples to."""
    return f"{STAGING_ROOT}/{train_hash}"


def endpoint_url(host: str, port: int = PRODUCER_PORT) -> str:
    """The producers' OpenAI API as speculators' client takes it."""
    return f"http://{host}:{port}/v1"


def produce_argv(spec_path: str, artifacts_root: str, port: int = PRODUCER_PORT) -> list[str]:
    """The command line of one hidden-state producer: the same locally and in the producer Deployment."""
    return ["eagle3", "produce", "--spec", spec_path, "--artifacts", artifacts_root, "--port", str(port)]


def mooncake_master_argv(
    port: int = MOONCAKE_MASTER_PORT, metrics_port: int = MOONCAKE_METRICS_PORT
) -> list[str]:
    """Mooncake's own master (the `mooncake-transfer-engine` package's `mooncake_master`). Its gflags:
    `--rpc_port` (0.3.13 warns that `--port` is deprecated); the metrics port also answers `GET /health`."""
    return ["mooncake_master", f"--rpc_port={port}", f"--metrics_port={metrics_port}"]
