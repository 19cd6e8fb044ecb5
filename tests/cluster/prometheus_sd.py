"""The test Prometheus (tests/observability/prometheus.py) finding the serving pods through the cluster's own
service discovery, its DNS: `dns_sd_configs` on the serving Service's name, answered by the node's cluster
DNS, as a Prometheus inside the cluster would resolve it.

Why not `kubernetes_sd_configs`: Debian's Prometheus 2.42 (this machine's, scripts/install-prometheus.sh) is
built without Kubernetes discovery (Debian patches it out: `field kubernetes_sd_configs not found`), and no
other Prometheus build can be had here. Prometheus resolves with the host's /etc/resolv.conf, so it runs in a
private mount namespace (`unshare --mount`) where a resolv.conf naming the cluster DNS is bound over it: the
host's own file and mounts are untouched, and the namespace goes with the process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.observability.prometheus import SCRAPE_INTERVAL_S, PrometheusServer

JOB = "eagle3-serving"


def sd_config(service_dns_name: str, port: int) -> dict[str, Any]:
    """A scrape job whose targets are the A records of `service_dns_name` (the serving Service) at `port`."""
    every = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "scrape_configs": [
            {
                "job_name": JOB,
                "dns_sd_configs": [
                    {"names": [service_dns_name], "type": "A", "port": port, "refresh_interval": every}
                ],
                "relabel_configs": [
                    {"source_labels": ["__meta_dns_name"], "target_label": "service"},
                ],
            }
        ],
    }


class DiscoveringPrometheus(PrometheusServer):
    """PrometheusServer whose only scrape job is `sd_config`'s, resolving names with `nameserver`."""

    def __init__(self, bin_dir: Path, work: Path, config: dict[str, Any], nameserver: str) -> None:
        super().__init__(bin_dir, work, [], [])
        self.sd = config
        self.nameserver = nameserver

    def _write_config(self) -> None:
        self.config_file.write_text(yaml.safe_dump(self.sd, sort_keys=False))

    def command(self, argv: list[str]) -> list[str]:
        resolv = self.work / "resolv.conf"
        resolv.write_text(f"nameserver {self.nameserver}\noptions ndots:5\n")
        bind = f'mount --bind {resolv} /etc/resolv.conf && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, "sh", *argv]
