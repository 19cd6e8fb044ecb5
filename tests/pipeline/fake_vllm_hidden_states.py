"""A stand-in for `vllm serve` with `extract_hidden_states`, for the extract stage's vLLM backend on CPU.

Run as `python fake_vllm_hidden_states.py serve MODEL [vllm options]`. It reads the options the stage passes
(port, served model name, --speculative-config layer ids, --kv-transfer-config storage path and connector,
--dtype), computes the hidden states with transformers independently of the stage's own code
(`output_hidden_states` for ids below n, a hook on the last decoder layer for n), and answers
`/v1/completions` the way vLLM does: `prompt_token_ids` on the choice and `kv_transfer_params` naming the
file its "connector" wrote (plus the `.lock` file vLLM's connector creates). It serves /health and /v1/models.

Test knobs (environment): FAKE_VLLM_OOM=1 exits at start with a CUDA out-of-memory line;
FAKE_VLLM_POISON=<token id> answers a prompt containing it with wrong prompt_token_ids;
FAKE_VLLM_REQUESTS=<file> appends each request's token count to that file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("model")
    p.add_argument("--served-model-name", default="model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculative-config", required=True)
    p.add_argument("--kv-transfer-config", required=True)
    p.add_argument("--dtype", default="auto")
    args, _ = p.parse_known_args(argv)
    return args


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch  # imported here: the out-of-memory knob answers at once
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        spec = json.loads(args.speculative_config)
        assert spec["method"] == "extract_hidden_states", spec
        self.layer_ids: list[int] = spec["draft_model_config"]["hf_config"][
            "eagle_aux_hidden_state_layer_ids"
        ]
        kv = json.loads(args.kv_transfer_config)
        self.storage = Path(kv["kv_connector_extra_config"]["shared_storage_path"])
        self.fp8 = kv["kv_connector"] == "FP8HiddenStatesConnector"
        self.dtype = torch.float32 if args.dtype == "auto" else getattr(torch, args.dtype)
        self.counter = itertools.count()
        self.lock = threading.Lock()

    def hidden_states(self, ids: list[int]) -> torch.Tensor:
        import torch

        caught: dict[str, torch.Tensor] = {}
        last = self.model.model.layers[-1]
        handle = last.register_forward_hook(lambda m, a, out: caught.update(last=out))
        try:
            with torch.no_grad():
                out = self.model(torch.tensor([ids]), output_hidden_states=True)
        finally:
            handle.remove()
        n = len(self.model.model.layers)
        states = [caught["last"][0] if i == n else out.hidden_states[i][0] for i in self.layer_ids]
        return torch.stack(states, dim=1)

    def complete(self, ids: list[int]) -> dict[str, Any]:
        import torch
        from safetensors.torch import save_file

        with self.lock:
            number = next(self.counter)
            hidden = self.hidden_states(ids)
        path = self.storage / f"cmpl-{number}.safetensors"
        tensors = {"hidden_states": hidden.to(self.dtype), "token_ids": torch.tensor(ids, dtype=torch.int64)}
        if self.fp8:
            from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

            tensors["hidden_states"], tensors[SCALES_KEY] = quantize_tensor_to_fp8(hidden)
        Path(str(path) + ".lock").touch()  # vLLM's connector pre-creates it; the client waits on it
        save_file(tensors, str(path))
        poison = os.environ.get("FAKE_VLLM_POISON")
        prompt = ids[::-1] if poison is not None and int(poison) in ids else ids
        return {
            "id": f"cmpl-{number}",
            "object": "text_completion",
            "created": 0,
            "model": "verifier",
            "choices": [
                {
                    "index": 0,
                    "text": "x",
                    "finish_reason": "length",
                    "logprobs": None,
                    "prompt_token_ids": prompt,
                }
            ],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1},
            "kv_transfer_params": {"hidden_states_path": str(path)},
        }


def handler(engine: Engine, served: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def reply(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply({})
            elif self.path == "/v1/models":
                self.reply(
                    {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "fake"}]}
                )
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/completions":
                self.send_error(404)
                return
            ids = body["prompt"]
            log = os.environ.get("FAKE_VLLM_REQUESTS")
            if log:
                with open(log, "a") as f:
                    f.write(f"{len(ids)}\n")
            self.reply(engine.complete(ids))

    return Handler


def main(argv: list[str]) -> int:
    args = parse(argv)
    if os.environ.get("FAKE_VLLM_OOM"):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
        return 1
    engine = Engine(args)
    server = ThreadingHTTPServer((args.host, args.port), handler(engine, args.served_model_name))
    print(f"fake vLLM serving {args.model} on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
