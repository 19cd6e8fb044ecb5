"""A real Prometheus server for the tier: scraping every second, evaluating the rules file, HTTP API helpers.

The binaries come from `scripts/install-prometheus.sh` (Debian's prometheus 2.42, unpacked into a cache).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from eagle3_pipeline.serving.vllm_server import free_port
from tests import tiers

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install-prometheus.sh"
ENV_BIN = "EAGLE3_PROMETHEUS_BIN"  # a directory holding `prometheus` and `promtool`, instead of the script's
SCRAPE_INTERVAL_S = 1
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0


def installed_bin_dir() -> Path | None:
    """$EAGLE3_PROMETHEUS_BIN, else the directory `install-prometheus.sh --check` names (no fetch)."""
    configured = os.environ.get(ENV_BIN)
    if configured:
        return Path(configured) if os.access(Path(configured) / "prometheus", os.X_OK) else None
    proc = subprocess.run(
        ["bash", str(INSTALL_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    return Path(lines[-1]) if proc.returncode == 0 and lines else None


def prometheus_or_skip() -> Path:
    found = installed_bin_dir()
    if found is None:
        tiers.missing(
            "Prometheus",
            "no Prometheus: run scripts/install-prometheus.sh (make test installs it) "
            "or set $EAGLE3_PROMETHEUS_BIN",
        )
    return found


@dataclass(frozen=True)
class Target:
    """A static scrape target with the labels the cluster's PodMonitor/ServiceMonitor would add."""

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)
    honor_labels: bool = False  # the series' own labels win over the target's (the operator's `namespace`)


def config(targets: list[Target], rule_files: list[Path]) -> dict[str, Any]:
    every = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": t.job,
                "honor_labels": t.honor_labels,
                "static_configs": [{"targets": [t.address], "labels": t.labels}],
            }
            for t in targets
        ],
    }


def every_second(rules: Path, out: Path) -> Path:
    """A copy of the rules file (or PrometheusRule) whose groups are evaluated every scrape interval: a
    group's own `interval` (1m, say) would keep its alerts from showing for up to that long."""
    documents = list(yaml.safe_load_all(rules.read_text()))
    for document in documents:
        groups = (document or {}).get("groups") or ((document or {}).get("spec") or {}).get("groups") or []
        for group in groups:
            group["interval"] = f"{SCRAPE_INTERVAL_S}s"
    out.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return out


class PrometheusServer:
    """`prometheus` on a free loopback port with a generated config; a context manager."""

    def __init__(self, bin_dir: Path, work: Path, targets: list[Target], rule_files: list[Path]) -> None:
        self.bin_dir = bin_dir
        self.work = work
        self.targets = targets
        self.rule_files = rule_files
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = work / "prometheus.log"
        self.client = httpx.Client(timeout=30.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.port = free_port()
        argv = [
            str(self.bin_dir / "prometheus"),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.work / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def command(self, argv: list[str]) -> list[str]:
        """The command line that starts `argv` (a subclass may wrap it)."""
        return argv

    @property
    def config_file(self) -> Path:
        return self.work / "prometheus.yml"

    def _write_config(self) -> None:
        self.config_file.write_text(yaml.safe_dump(config(self.targets, self.rule_files), sort_keys=False))

    def add_targets(self, targets: list[Target], timeout: float = 30.0, wait: bool = True) -> None:
        """Add scrape targets: rewrite the config, reload it (SIGHUP), wait until each target is up (unless
        not `wait`: a target that starts serving later, scraped from its first second)."""
        assert self.process is not None
        self.targets = [*self.targets, *targets]
        self._write_config()
        self.process.send_signal(signal.SIGHUP)
        if not wait:
            return
        urls = {f"http://{t.address}/metrics" for t in targets}

        def all_up() -> bool:
            health = self.targets_up()
            return all(health.get(url) == "up" for url in urls)

        wait_for(all_up, timeout, f"Prometheus scraping {sorted(urls)}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get(self.url + "/-/ready").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus was not ready in {READY_TIMEOUT_S:.0f} s: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def stop(self) -> None:
        """SIGTERM (Prometheus shuts down cleanly on it), SIGKILL after the grace period."""
        proc, self.process = self.process, None
        self.client.close()
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10.0)

    # --- the HTTP API -------------------------------------------------------------------------------------

    def api(self, path: str, **params: str | float) -> Any:
        response = self.client.get(f"{self.url}/api/v1/{path}", params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector (a scalar comes back as one series without labels)."""
        params: dict[str, str | float] = {"query": expr} | ({"time": at} if at is not None else {})
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups

    def targets_up(self) -> dict[str, str]:
        """Each active target's scrape URL and health ("up", "down", "unknown")."""
        active = self.api("targets")["activeTargets"]
        return {t["scrapeUrl"]: t["health"] for t in active}


class PromQLError(AssertionError):
    """Prometheus refused a query (a parse or execution error)."""


def wait_for(check: Any, timeout: float, what: str, poll: float = 0.25) -> Any:
    """Poll `check()` until it returns something truthy; AssertionError names `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:.0f} s: {what}")
        time.sleep(poll)
