"""The one `vllm serve` command builder (eagle3_contract.vllm_command): order, overrides, and that the
Deployment serves the engine evaluate measures."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from eagle3_contract.api.spec import Eagle3RunSpec, Verifier
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.draft_methods import method_of_checkpoint
from eagle3_contract.vllm_command import (
    Endpoint,
    VllmEngine,
    draft_speculative_config,
    hidden_states_speculative_config,
    served_engine,
    vllm_serve_args,
)
from eagle3_operator.builders.serving import PORT, vllm_args

VERIFIER = Verifier.model_validate(
    {
        "model": "org/m",
        "revision": "abc",
        "trustRemoteCode": True,
        "tensorParallelSize": 8,
        "maxModelLen": 4096,
        "vllmArgs": ["--max-num-seqs", "16"],
    }
)


def tiny_spec(**sections: dict[str, object]) -> Eagle3RunSpec:
    """The tiny example's spec with whole sections replaced."""
    example = Path(__file__).parents[2] / "examples" / "tiny" / "eagle3run.yaml"
    return parse_spec(yaml.safe_load(example.read_text())["spec"] | sections)


def options(args: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(args, [*args[1:], ""], strict=True) if a.startswith("--")}


def test_every_engine_field_reaches_the_command_line() -> None:
    args = vllm_serve_args(VllmEngine.of(VERIFIER), Endpoint("0.0.0.0", 8000))
    assert args[0] == "org/m"
    got = options(args)
    assert got["--tensor-parallel-size"] == "8" and got["--revision"] == "abc"
    assert got["--max-model-len"] == "4096" and "--trust-remote-code" in args
    assert (got["--host"], got["--port"]) == ("0.0.0.0", "8000")
    assert "--seed" not in got and "--served-model-name" not in got and "--enforce-eager" not in args


def test_a_local_path_replaces_the_model_name_and_nothing_else() -> None:
    hub = vllm_serve_args(VllmEngine.of(VERIFIER), Endpoint("h", 1))
    local = vllm_serve_args(VllmEngine.of(VERIFIER, model="/models/org/m"), Endpoint("h", 1))
    assert local[0] == "/models/org/m" and local[1:] == hub[1:]


def test_the_specs_arguments_come_after_ours_and_extra_args_last() -> None:
    """vLLM keeps an option's last value: verifier.vllmArgs override a stage's options, extra args win."""
    args = vllm_serve_args(
        VllmEngine.of(VERIFIER),
        Endpoint("h", 1),
        speculative_config=draft_speculative_config("/d", 3),
        options=["--max-num-seqs", "4"],
        extra_args=["--max-num-seqs", "32"],
    )
    spec_config = args.index("--speculative-config")
    ours, spec_arg, extra = (i for i, a in enumerate(args) if a == "--max-num-seqs")
    assert spec_config < ours < spec_arg < extra and args[-1] == "32"


def test_speculative_configs() -> None:
    assert draft_speculative_config("/artifacts/export/h", 5) == {
        "method": "eagle3",
        "model": "/artifacts/export/h",
        "num_speculative_tokens": 5,
    }
    # P-EAGLE: vLLM 0.32 serves it as eagle3 with parallel drafting (its loader reads the checkpoint's type)
    assert draft_speculative_config("/d", 4, "peagle") == {
        "method": "eagle3",
        "model": "/d",
        "num_speculative_tokens": 4,
        "parallel_drafting": True,
    }
    layers = hidden_states_speculative_config((1, 2, 4))
    assert layers["method"] == "extract_hidden_states" and layers["num_speculative_tokens"] == 1
    assert layers["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]


def test_the_deployment_serves_the_engine_that_evaluate_measures() -> None:
    """Evaluate's server (local path, loopback, seed, eager on CPU) and the Deployment's differ only in
    where they listen and how a stage drives them: the engine and the draft config are the same."""
    spec = tiny_spec(
        verifier={"model": "org/m", "tensorParallelSize": 2, "maxModelLen": 2048, "vllmArgs": ["--x", "1"]},
        serving={"numSpeculativeTokens": 3},
        evaluation={"numSpeculativeTokens": 3},
    )
    draft = "/artifacts/export/abc"
    deployment = vllm_args(spec, "export/abc")
    evaluate = vllm_serve_args(
        VllmEngine.of(spec.verifier, model="/models/org/m"),
        Endpoint("127.0.0.1", 40123, served_model_name="verifier"),
        speculative_config=draft_speculative_config(draft, spec.evaluation.num_speculative_tokens),
        seed=spec.dataset.seed,
        enforce_eager=True,
    )
    assert served_engine(deployment) == served_engine(evaluate)
    assert json.loads(options(deployment)["--speculative-config"])["model"] == draft
    assert options(deployment)["--port"] == str(PORT)


def test_a_peagle_deployment_serves_what_evaluate_measures_of_a_peagle_checkpoint() -> None:
    """The Deployment takes the method from the spec, evaluate from the trained checkpoint's config: for a
    P-EAGLE run both are parallel drafting."""
    spec = tiny_spec(draft={"method": "peagle"}, serving={"numSpeculativeTokens": 4})
    config = json.loads(options(vllm_args(spec, "export/abc"))["--speculative-config"])
    checkpoint = {"speculators_model_type": "peagle"}
    assert config == draft_speculative_config("/artifacts/export/abc", 4, method_of_checkpoint(checkpoint))
    assert config["parallel_drafting"] is True
    assert method_of_checkpoint({"speculators_model_type": "mtp"}) is None  # not a method of this version


def test_a_dflash_deployment_serves_vllms_dflash_method_at_the_specs_k() -> None:
    spec = tiny_spec(draft={"method": "dflash", "blockSize": 4}, serving={"numSpeculativeTokens": 3})
    config = json.loads(options(vllm_args(spec, "export/abc"))["--speculative-config"])
    checkpoint = {"speculators_model_type": "dflash"}
    assert config == draft_speculative_config("/artifacts/export/abc", 3, method_of_checkpoint(checkpoint))
    assert config == {"method": "dflash", "model": "/artifacts/export/abc", "num_speculative_tokens": 3}
