"""Where the operator and the command line find a cluster: a pod's service account, else a kubeconfig (the
files and the context `kubectl` here would use). No API call: eagle3_operator.k8s makes them."""

from __future__ import annotations

import os

import yaml
from kubernetes_asyncio import config

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class NoCredentials(Exception):
    """Neither a pod's service account nor a usable kubeconfig, in one line; `missing`: no kubeconfig file at
    all (each command adds what to do instead)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def in_a_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def kubeconfig_files(kubeconfig: str | None = None) -> list[str]:
    """The kubeconfig files a `kubectl` here would read: `kubeconfig` (its --kubeconfig), else $KUBECONFIG's,
    else ~/.kube/config."""
    listed = [p for p in (kubeconfig or os.environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    return listed or [os.path.expanduser("~/.kube/config")]


def kubeconfig_found(kubeconfig: str | None) -> bool:
    """Whether a kubeconfig file exists (kubernetes_asyncio warns on each look that finds none)."""
    return any(os.path.isfile(os.path.expanduser(f)) for f in kubeconfig_files(kubeconfig))


def current_namespace(kubeconfig: str | None = None) -> str:
    """The namespace a `kubectl` here would use: the pod's own in a cluster (unless `kubeconfig` is given),
    else the kubeconfig context's; "default" without either."""
    if kubeconfig is None and in_a_pod() and os.path.exists(SERVICE_ACCOUNT_NAMESPACE):
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    if not kubeconfig_found(kubeconfig):
        return "default"
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig or os.environ.get("KUBECONFIG"))
    except (OSError, ValueError, yaml.YAMLError, config.ConfigException):
        return "default"
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"
