"""The `eagle3` command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle3_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_eagle3_crd_prints_the_committed_crd(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == (ROOT / "crds" / "eagle3runs.eagle3.dev.yaml").read_text()


def test_eagle3_crd_without_cel_drops_every_validation_rule(capsys):
    assert main(["crd", "--no-cel"]) == 0
    out = capsys.readouterr().out
    assert "x-kubernetes-validations" not in out
    assert yaml.safe_load(out)["spec"]["names"]["shortNames"] == ["e3r"]


def test_an_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["nonsense"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_the_operators_pipeline_image_flag_names_the_specs_default(monkeypatch):
    from eagle3_cli.main import parser
    from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE

    flag = next(
        a
        for a in parser()._subparsers._group_actions[0].choices["operator"]._actions
        if a.dest == "pipeline_image"
    )
    assert DEFAULT_PIPELINE_IMAGE in flag.help
    monkeypatch.setenv("EAGLE3_PIPELINE_IMAGE", "reg/p:1")
    assert parser().parse_args(["operator"]).pipeline_image == "reg/p:1"


def test_the_operators_resync_and_api_timeout_flags_take_positive_seconds(capsys):
    from eagle3_cli.main import parser

    args = parser().parse_args(["operator", "--resync-seconds", "5", "--api-timeout-seconds", "2.5"])
    assert (args.resync_seconds, args.api_timeout_seconds) == (5.0, 2.5)
    defaults = parser().parse_args(["operator"])
    assert (defaults.resync_seconds, defaults.api_timeout_seconds) == (60.0, 30.0)
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            parser().parse_args(["operator", "--api-timeout-seconds", bad])
        assert f"'{bad}' is not a positive number of seconds" in capsys.readouterr().err


HEAVY = (
    "torch",
    "transformers",
    "speculators",
    "datasets",
    "kopf",
    "kubernetes_asyncio",
    "prometheus_client",
)


def test_the_command_line_starts_without_either_sides_libraries():
    """The operator image has no torch and the pipeline image no kopf: the thin entry (and every command's
    parser) must import neither side's libraries until a command runs."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom eagle3_cli.main import parser\n"
        "parser().parse_args(['stage', 'prepare', '--spec', 'x', '--artifacts', 'a', '--output', 'o'])\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ctrl_c_is_one_line_and_exit_code_130(monkeypatch, capsys):
    """Ctrl-C used to print a KeyboardInterrupt traceback."""
    import eagle3_contract.api.crd as crd

    def interrupted(cel: bool) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(crd, "render_crd_yaml", interrupted)
    assert main(["crd"]) == 130
    assert capsys.readouterr().err == "eagle3 crd: interrupted\n"


def test_http_clients_log_no_line_per_request_unless_verbose(capsys):
    """A stage that sends thousands of requests logs progress lines, not one INFO line per request."""
    import logging

    from eagle3_cli.main import QUIET_LOGGERS

    main(["crd"])
    assert all(logging.getLogger(name).getEffectiveLevel() == logging.WARNING for name in QUIET_LOGGERS)
