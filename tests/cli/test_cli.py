"""The `eagle3` command line."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from eagle3_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() writes the log format into the environment (for its subprocesses): not into the test run's."""
    monkeypatch.delenv("EAGLE3_LOG_FORMAT", raising=False)
    monkeypatch.delenv("EAGLE3_VERBOSE", raising=False)


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
    main(["-v", "crd"])
    assert all(logging.getLogger(name).getEffectiveLevel() == logging.DEBUG for name in QUIET_LOGGERS)


def test_version_prints_the_installed_distributions_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"eagle3 {version('eagle3-operator')}\n"


def test_the_log_format_is_a_root_option_and_the_subprocesses_inherit_it(monkeypatch, capsys):
    import os

    monkeypatch.setenv("EAGLE3_LOG_FORMAT", "json")
    assert main(["crd"]) == 0
    assert os.environ["EAGLE3_LOG_FORMAT"] == "json"
    assert main(["--log-format", "TEXT", "crd"]) == 0
    assert os.environ["EAGLE3_LOG_FORMAT"] == "text" and os.environ["EAGLE3_VERBOSE"] == "0"
    monkeypatch.setenv("EAGLE3_LOG_FORMAT", "xml")
    capsys.readouterr()
    assert main(["crd"]) == 2
    assert capsys.readouterr().err == "eagle3: $EAGLE3_LOG_FORMAT is 'xml': give one of text, json\n"


# --- `eagle3 operator` refuses to start, in one line, what it cannot work with ----------------------------


def start_operator(kubeconfig: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(kubeconfig.parent if kubeconfig else Path("/nonexistent"))
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    argv = [sys.executable, "-m", "eagle3_cli", "operator", "--health-port", "0", "--metrics-port", "0"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def kubeconfig(path: Path, server: str, current: bool = True) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
    }
    if current:
        doc["current-context"] = "x"
    path.write_text(yaml.safe_dump(doc))
    return path


Answer = tuple[int, dict[str, object] | None]


@contextlib.contextmanager
def fake_api_server(
    answer: int, document: dict[str, object] | None = None, routes: dict[str, Answer] | None = None
) -> Iterator[str]:
    """An API server that answers a GET of a path in `routes` as it says, and every other GET with HTTP
    `answer` and `document` (default: a Status)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, found = (routes or {}).get(self.path.split("?")[0], (answer, document))
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
            body = json.dumps(status if found is None else found).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def refusal(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert " ERROR   eagle3_operator.operator_main: eagle3 operator: " in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "no kubeconfig: {dir}/missing.yaml does not exist; set KUBECONFIG"),
        ("no-home-config", "no kubeconfig: /nonexistent/.kube/config does not exist"),
        ("no-context", "names no current context; choose one with `kubectl config use-context NAME`"),
        ("unreachable", "does not answer ([Errno 111]"),
    ],
)
def test_an_unusable_kubeconfig_is_one_line_and_exit_1(tmp_path: Path, case: str, expected: str) -> None:
    from eagle3_pipeline.serving.vllm_server import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    path = {
        "missing": tmp_path / "missing.yaml",
        "no-home-config": None,
        "no-context": kubeconfig(tmp_path / "no-context.yaml", dead, current=False),
        "unreachable": kubeconfig(tmp_path / "k.yaml", dead),
    }[case]
    line = refusal(start_operator(path))
    assert expected.format(dir=tmp_path) in line, line


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (401, "refused the credentials (HTTP 401 Unauthorized)"),
        (403, "forbids listing eagle3runs.eagle3.dev (HTTP 403"),
        (404, "the Eagle3Run CRD is not installed"),
    ],
)
def test_credentials_refused_or_no_crd_is_one_line_and_exit_1(
    tmp_path: Path, answer: int, expected: str
) -> None:
    with fake_api_server(answer) as url:
        line = refusal(start_operator(kubeconfig(tmp_path / "k.yaml", url)))
    assert expected in line and url in line, line
    if answer == 404:
        assert (
            "GET /apis/eagle3.dev/v1alpha1/eagle3runs" in line and "eagle3 crd | kubectl apply -f -" in line
        )


def test_eagle3_status_of_a_run_in_the_cluster(tmp_path: Path) -> None:
    run = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "tiny", "namespace": "team-a"},
        "status": {
            "phase": "Running",
            "progress": "train 2/6 ep",
            "eta": "3m",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "Progressing",
                    "message": "training",
                    "lastTransitionTime": "2026-12-03T11:50:00Z",
                }
            ],
            "stages": {
                "prepare": {"phase": "Succeeded", "attempts": 1, "result": {"samples": 400}},
                "train": {
                    "phase": "Running",
                    "attempts": 1,
                    "progress": {"unit": "steps", "done": 5, "total": 9},
                },
            },
        },
    }
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"} | {"COLUMNS": "160"}
    with fake_api_server(200, run) as url:
        env["KUBECONFIG"] = str(kubeconfig(tmp_path / "k.yaml", url))
        argv = [sys.executable, "-m", "eagle3_cli", "status", "tiny", "-n", "team-a"]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    headline = "Eagle3Run team-a/tiny: Running, Ready False, train 2/6 ep, ETA 3m (Progressing: training)"
    assert lines[0].strip() == headline
    assert any("prepare" in line and "Succeeded" in line and "samples=400" in line for line in lines), (
        proc.stdout
    )
    assert any("train" in line and "Running" in line and "5/9 steps" in line for line in lines), proc.stdout
    served = {"kind": "APIResourceList", "resources": [{"name": "eagle3runs", "kind": "Eagle3Run"}]}
    for discovery, expected in (
        ((200, served), "not found: check the run's name and namespace (-n)"),
        ((404, None), "does not serve eagle3runs.eagle3.dev/v1alpha1: is the CRD installed"),
    ):
        with fake_api_server(404, routes={"/apis/eagle3.dev/v1alpha1": discovery}) as url:
            env["KUBECONFIG"] = str(kubeconfig(tmp_path / "k.yaml", url))
            argv = [sys.executable, "-m", "eagle3_cli", "status", "gone", "-n", "team-a"]
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("error: cannot read Eagle3Run team-a/gone: "), proc.stderr
        assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_eagle3_status_without_a_kubeconfig_says_so_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config

    def refused(target: str) -> str:
        argv = [sys.executable, "-m", "eagle3_cli", "status", target]
        proc = subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr  # no warnings either
        return proc.stderr

    assert refused("tiny").startswith(
        f"error: cannot read Eagle3Run default/tiny: no kubeconfig: {tmp_path}/.kube/config does not exist; "
        "set KUBECONFIG or pass --kubeconfig, or give a run manifest or artifacts directory for a local run"
    )
    runs = f"{tmp_path}/runs"  # a path: a local run, never a run's name
    assert refused(runs).startswith(f"error: {runs}: no such file or directory; give a run's manifest file")


PEERINGS = "/apis/kopf.dev/v1/namespaces/team-a/kopfpeerings/eagle3-operator"
CLUSTER_PEERING = "/apis/kopf.dev/v1/clusterkopfpeerings/eagle3-operator"


def keep_alive(seconds_ago: float) -> dict[str, object]:
    """A peering object with one operator's keep-alive (as kopf writes it), `seconds_ago` old when the test
    runs (`{"keepAlive": seconds}` in a route below)."""
    seen = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return {"status": {"pod-x/7": {"priority": 0, "lifetime": 30, "lastseen": seen.isoformat()}}}


@pytest.mark.parametrize(
    ("peerings", "expected"),
    [
        ({CLUSTER_PEERING: (200, {"keepAlive": 3})}, r"operator pod-x/7 alive \(last seen \d s ago\)"),
        (
            {PEERINGS: (200, {"keepAlive": 300}), CLUSTER_PEERING: (200, {})},
            re.escape(
                "no operator is running (peering 'eagle3-operator' has no live peer; pod-x/7 was last seen 5 "
                "min ago): install the chart or run `eagle3 operator`"
            ),
        ),
        (
            {PEERINGS: (403, None), CLUSTER_PEERING: (403, None)},
            re.escape(
                "whether an operator is running is unknown (KopfPeering team-a/eagle3-operator: HTTP 403; "
                "ClusterKopfPeering eagle3-operator: HTTP 403)"
            ),
        ),
    ],
)
def test_a_run_with_no_stage_observed_says_whether_an_operator_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    peerings: dict[str, Answer],
    expected: str,
) -> None:
    """`expected`: a pattern (the seconds since a keep-alive are the test's own)."""
    answers = {
        path: (code, keep_alive(float(str(body["keepAlive"]))) if body and "keepAlive" in body else body)
        for path, (code, body) in peerings.items()
    }
    run: dict[str, object] = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "r"},
    }
    routes = {"/apis/eagle3.dev/v1alpha1/namespaces/team-a/eagle3runs/r": (200, run), **answers}
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with fake_api_server(404, routes=routes) as url:
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k.yaml", url)))
        assert main(["status", "r", "-n", "team-a"]) == 0
        headline, said = capsys.readouterr().out.splitlines()  # and no table
        assert headline == "Eagle3Run team-a/r: Pending, Ready Unknown"
        assert re.fullmatch(f"no stage observed yet; {expected}", said), said
        assert main(["status", "r", "-n", "team-a", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["name"], document["namespace"]) == ("r", "team-a")
    assert document["status"] == {"phase": "Pending", "conditions": [], "stages": {}}  # the model's defaults


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "run", "--interval", "-1"],
        ["status", "run", "--interval", "nan"],
        ["stage", "prepare", "--spec", "s", "--artifacts", "a", "--output", "o", "--token-budget=-5"],
        ["stage", "prepare", "--spec", "s", "--artifacts", "a", "--output", "o", "--token-budget", "0"],
        ["operator", "--metrics-port", "70000"],
        ["operator", "--health-port", "-1"],
        ["operator", "--prometheus-url", "http://"],
        ["operator", "--prometheus-url", "http://prom etheus:9090"],
    ],
)
def test_a_value_out_of_range_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28, item 15: negative intervals, budgets and ports were taken as given."""
    from eagle3_cli.main import parser

    with pytest.raises(SystemExit) as exited:
        parser().parse_args(argv)
    assert exited.value.code == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("eagle3")][-1:]
    assert "error: argument " in line and repr(argv[-1].split("=")[-1]) in line, line


def test_the_operators_metrics_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """It was a 28-line traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            sys.executable,
            "-m",
            "eagle3_cli",
            "operator",
            "--health-port",
            "0",
            "--metrics-port",
            str(port),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        done = subprocess.run(
            argv, env=env | {"HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1, done.stderr
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and f"cannot serve metrics on port {port}" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_the_help_says_what_the_tool_does_lists_every_command_and_shows_defaults(capsys) -> None:
    """Issue 29: `eagle3 --help` began "A thin entry…" (the code's view, not the user's), and no option's
    default was shown unless its help spelled it out."""
    from eagle3_cli.main import parser

    root = parser()
    text = root.format_help()
    assert text.split("\n\n")[1].startswith("Train and serve EAGLE-3 speculative-decoding drafts.")
    assert "thin entry" not in text
    for command in ("crd", "operator", "promote", "stage", "produce", "run", "plan", "tiny", "status"):
        assert f"    {command} " in text, command
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    operator = sub.choices["operator"].format_help()
    flat = " ".join(operator.split())
    assert "liveness endpoint port (/healthz) (default: 8080)" in flat, "an unspelled default is shown"
    assert "(default: [])" not in flat and "(default: None)" not in flat


def test_run_until_an_unknown_stage_is_a_usage_error(capsys) -> None:
    """Issue 29: `eagle3 run M --until bogus` was accepted and ran every stage."""
    from eagle3_cli.main import main

    with pytest.raises(SystemExit) as stopped:
        main(["run", "examples/tiny/eagle3run.yaml", "--until", "bogus"])
    assert stopped.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_off_a_terminal_no_progress_bars_are_drawn(monkeypatch) -> None:
    """Issue 29: off a terminal, tqdm's and the Hugging Face libraries' bars leaked into logs as `\\r`-joined
    updates; the variables that turn them off are set for eagle3 and the stage processes it starts."""
    from eagle3_cli import main as cli_main

    for name in cli_main.QUIET_PROGRESS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user's own choice stays
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    cli_main.quiet_progress_off_a_terminal()
    assert os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
    monkeypatch.delenv("TQDM_DISABLE")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    cli_main.quiet_progress_off_a_terminal()
    assert "TQDM_DISABLE" not in os.environ, "a terminal keeps its bars"
