"""The operator's commands of `eagle3` (`operator`, `promote`): parsers here, the work imported when run, so
the command line starts without kopf or the Kubernetes client."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_contract.api.fields import HTTP_URL
from eagle3_contract.api.status import Eagle3RunStatus
from eagle3_contract.cli_types import port, positive_seconds, whole_seconds_or_off


def _operator(args: argparse.Namespace) -> int:
    from eagle3_contract.api.defaults import OperatorDefaults
    from eagle3_operator.operator_main import run_operator

    run_operator(
        namespaces=args.namespace,
        liveness=f"http://0.0.0.0:{args.health_port}/healthz",
        metrics_port=args.metrics_port,
        defaults=OperatorDefaults(
            pipeline_image=args.pipeline_image,
            pipeline_cpu_image=args.pipeline_cpu_image,
            vllm_image=args.vllm_image,
            image_pull_secrets=tuple(args.image_pull_secret),
            pod_monitor_labels=dict(args.pod_monitor_label),
            prometheus_url=args.prometheus_url,
            pod_security_minimum_level=args.pod_security_minimum_level,
        ),
        priority=args.priority,
        resync_seconds=args.resync_seconds,
        api_timeout_seconds=args.api_timeout_seconds,
        watch_seconds=args.watch_seconds,
    )
    return 0


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. release=kube-prometheus-stack)")
    return key, value


def _http_url(text: str) -> str:
    """The same rule as spec.serving.canary.prometheusUrl's (eagle3_contract.api.fields.HTTP_URL)."""
    if not re.fullmatch(HTTP_URL, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")
    return text


def _read_run(args: argparse.Namespace) -> dict[str, Any]:
    """The run to promote: from --from-file (`-` is stdin), else from the cluster through k8s.py."""
    import asyncio

    from eagle3_contract.api.manifest import ManifestError, manifest_documents, parse_documents
    from eagle3_operator.credentials import current_namespace
    from eagle3_operator.k8s import get_run
    from eagle3_operator.promote import PromotionError, select_run

    if args.from_file:  # the manifest reader every command uses (eagle3_contract.api.manifest)
        try:
            if args.from_file == "-":
                documents = parse_documents(sys.stdin.read(), "stdin")
            else:
                documents = manifest_documents(Path(args.from_file))
        except ManifestError as exc:
            raise PromotionError(f"{exc}; pass the output of `kubectl get e3r {args.run} -o yaml`") from None
        return dict(select_run(documents, args.run))
    namespace = args.namespace or current_namespace()
    try:
        return asyncio.run(get_run(namespace, args.run))
    except Exception as exc:  # no kubeconfig, no route, refused: say so, with the offline way out
        raise PromotionError(
            f"cannot read Eagle3Run {namespace}/{args.run} from the cluster ({type(exc).__name__}: {exc}); "
            f"check the context and -n, or pass `kubectl get e3r {args.run} -o yaml` with --from-file"
        ) from None


def cluster_status_reader(
    name: str, namespace: str, kubeconfig: str | None = None
) -> Callable[[], tuple[str, Eagle3RunStatus]]:
    """`eagle3 status RUN`: a function that reads the Eagle3Run's status through k8s.py, titled
    `Eagle3Run NAMESPACE/NAME`; RuntimeError with what to do when it cannot."""
    import asyncio

    from eagle3_operator.credentials import NoCredentials
    from eagle3_operator.k8s import ApiError, ApiUnreachable, get_run

    what = f"Eagle3Run {namespace}/{name}"

    def read() -> tuple[str, Eagle3RunStatus]:
        try:
            run = asyncio.run(get_run(namespace, name, kubeconfig))
        except NoCredentials as exc:
            raise RuntimeError(
                f"cannot read {what}: {exc}; set KUBECONFIG or pass --kubeconfig, or give a run manifest or "
                f"artifacts directory for a local run (there is no file or directory {name} here)"
            ) from None
        except ApiUnreachable as exc:
            raise RuntimeError(
                f"cannot read {what}: the API server does not answer ({exc.cause}); check the kubeconfig's "
                "context and the network (`kubectl get e3r` should answer)"
            ) from None
        except ApiError as exc:
            raise RuntimeError(f"cannot read {what}: {exc}") from None
        except Exception as exc:  # no route, a certificate: say so, with what to check
            raise RuntimeError(
                f"cannot read {what} from the cluster ({type(exc).__name__}: {exc}); check the kubeconfig's "
                "context (`kubectl get e3r` should list it) and -n"
            ) from None
        try:
            status = Eagle3RunStatus.model_validate(run.get("status") or {})
        except ValueError as exc:  # pydantic's ValidationError
            raise RuntimeError(
                f"{what}: its status cannot be read by this eagle3 ({exc}); use the eagle3 of the operator's "
                "version"
            ) from None
        return what, status

    return read


def operator_presence(namespace: str, kubeconfig: str | None = None) -> str:
    """Whether an operator runs for `namespace`, from the peering objects the operators keep alive in (a
    namespaced one's KopfPeering there, a cluster-wide one's ClusterKopfPeering); eagle3_operator.peering
    says it. An object that cannot be read makes it unknown, never an error."""
    import asyncio
    from datetime import UTC, datetime

    from eagle3_operator.k8s import ApiError, Kube
    from eagle3_operator.peering import PEERING_NAME, PeeringRead, presence

    async def read(kube: Kube, where: str | None) -> PeeringRead:
        label = f"KopfPeering {where}/{PEERING_NAME}" if where else f"ClusterKopfPeering {PEERING_NAME}"
        try:
            return PeeringRead(label, await kube.peering("get", where, PEERING_NAME))
        except ApiError as err:
            return PeeringRead(label, error=f"HTTP {err.status}" if err.status else "no answer")

    async def read_both() -> list[PeeringRead]:
        kube = await Kube.connect_checked(kubeconfig=kubeconfig)
        try:
            return [await read(kube, namespace), await read(kube, None)]
        finally:
            await kube.close()

    try:
        reads = asyncio.run(read_both())
    except Exception as exc:  # the run was read a moment ago: a passing failure, said as such
        return f"whether an operator is running is unknown ({type(exc).__name__}: {exc})"
    return presence(reads, datetime.now(UTC))


def _promote(args: argparse.Namespace) -> int:
    from eagle3_operator.promote import PromotionError, commit_message, promotion_text

    try:
        run = _read_run(args)
        text, candidate = promotion_text(run, args.format, args.values_key)
    except PromotionError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    if args.output:
        Path(args.output).write_text(text)
        sys.stderr.write(f"wrote {args.output}\n")
    else:
        sys.stdout.write(text)
    target = args.output or "<the file you saved it to>"
    sys.stderr.write(
        f"\n# Commit it for review, e.g.:\ngit add {target}\ngit commit -F- <<'EOF'\n"
        f"{commit_message(candidate)}EOF\n"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `operator` and `promote` on the `eagle3` command line."""
    op = sub.add_parser("operator", help="run the operator (kopf) against the current cluster")
    op.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable)"
    )
    op.add_argument("--health-port", type=port, default=8080, help="liveness endpoint port (/healthz)")
    op.add_argument("--metrics-port", type=port, default=9090, help="Prometheus metrics port (/metrics)")
    op.add_argument(
        "--pipeline-image",
        default=os.environ.get("EAGLE3_PIPELINE_IMAGE") or None,
        help="image of the stage Jobs of runs whose spec.images.pipeline is unset (default "
        "$EAGLE3_PIPELINE_IMAGE, else eagle3-operator/pipeline:0.1.0)",
    )
    op.add_argument(
        "--pipeline-cpu-image",
        default=os.environ.get("EAGLE3_PIPELINE_CPU_IMAGE") or None,
        help="image of the stage Jobs of runs with nodePool.device cpu whose spec.images.pipeline is unset "
        "(the pipeline's CPU variant; default $EAGLE3_PIPELINE_CPU_IMAGE, else --pipeline-image)",
    )
    op.add_argument(
        "--vllm-image",
        default=os.environ.get("EAGLE3_VLLM_IMAGE") or None,
        help="vLLM image of the serving Deployments of GPU runs whose spec.images.vllm is unset (e.g. a "
        "private registry's mirror; default $EAGLE3_VLLM_IMAGE, else vllm/vllm-openai:v0.32.0)",
    )
    op.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="pull secret of the pods of runs whose spec.pod.imagePullSecrets is empty (repeatable); it must "
        "exist in each run's namespace",
    )
    op.add_argument(
        "--pod-monitor-label",
        action="append",
        default=[],
        type=_label,
        metavar="KEY=VALUE",
        help="label of every run's PodMonitors (repeatable), e.g. release=kube-prometheus-stack: the label "
        "your Prometheus selects PodMonitors by",
    )
    op.add_argument(
        "--prometheus-url",
        type=_http_url,
        default=os.environ.get("EAGLE3_PROMETHEUS_URL") or None,
        metavar="URL",
        help="Prometheus that scrapes the runs' vLLM pods, e.g. "
        "http://prometheus-operated.monitoring.svc:9090: serving.canary reads both tracks' live figures "
        "there unless the run sets serving.canary.prometheusUrl (default $EAGLE3_PROMETHEUS_URL)",
    )
    op.add_argument(
        "--pod-security-minimum-level",
        choices=["restricted", "baseline", "privileged"],
        default="restricted",
        help="refuse a run whose spec.pod takes its pods below this Pod Security level (default restricted): "
        "the operator's service account creates the pods for whoever may create an Eagle3Run; a cluster "
        "admin lowers it for the whole operator (the chart's podSecurity.minimumLevel), never a run",
    )
    op.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority: of several operators the one with the highest is active, the others "
        "stand by (default: earlier-started operators rank higher, so a running one keeps the work)",
    )
    op.add_argument(
        "--resync-seconds",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="reconcile every run and re-list what the watches hold every S seconds (default 60): repairs "
        "what a missed event left behind",
    )
    op.add_argument(
        "--api-timeout-seconds",
        type=positive_seconds,
        default=30.0,
        metavar="S",
        help="give up on an API call that got no answer in S seconds and retry it (default 30): a silent "
        "connection (a partition, a dead load balancer) never holds a run",
    )
    op.add_argument(
        "--watch-seconds",
        type=whole_seconds_or_off,
        default=8,
        metavar="S",
        help="end each watch request after S seconds and resume it (default 8), so a watch that went silent "
        "(a partition) is given up within S + 2 seconds; 0: one request for as long as the server keeps it, "
        "and a silent one is dropped after kopf's 70 s",
    )
    op.set_defaults(func=_operator)
    _add_promote_command(sub)


def _add_promote_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    promote = sub.add_parser(
        "promote",
        help="write the git change that serves a run's evaluated draft (a pinned-draft manifest or values)",
        description="Read an Eagle3Run's status.checkpoint, or status.candidate with serving.promotion "
        "reviewed (refused unless its gate passed and it exported its current spec) and write the run's "
        "manifest with spec.serving.pinnedCheckpoint {path, sha256}, "
        "or a values snippet with the pin, for a reviewed commit; a suggested commit message goes to stderr.",
    )
    promote.add_argument("run", help="the Eagle3Run's name")
    promote.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    promote.add_argument(
        "--from-file",
        metavar="FILE",
        help="read the run from FILE (`kubectl get e3r RUN -o yaml` output; `-` is stdin), not the cluster",
    )
    promote.add_argument(
        "--format",
        choices=["manifest", "values"],
        default="manifest",
        help="manifest: the whole pinned-draft Eagle3Run (default); values: only the pin, for Helm values",
    )
    promote.add_argument(
        "--values-key",
        default="spec",
        metavar="DOTTED.KEY",
        help="where --format values nests the pin (default `spec`: spec.serving.pinnedCheckpoint)",
    )
    promote.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    promote.set_defaults(func=_promote)
