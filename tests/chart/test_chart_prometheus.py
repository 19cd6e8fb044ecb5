"""The chart's prometheusUrl: rendered as the operator's --prometheus-url, read by `eagle3`'s own parser, and
filled into a run's serving.canary.prometheusUrl by the operator's defaults (the run's own wins)."""

from __future__ import annotations

from pathlib import Path

from eagle3_cli.main import parser as cli_parser
from eagle3_contract.api.defaults import OperatorDefaults, with_operator_defaults
from tests.chart.helm import operator_container, template, template_error

URL = "http://prometheus-operated.monitoring.svc:9090"


def prometheus_flag(helm: Path, *sets: str) -> str | None:
    args = cli_parser().parse_args(operator_container(template(helm, sets=sets))["args"])
    url: str | None = args.prometheus_url
    return url


def test_prometheus_url_becomes_the_operators_flag_and_a_runs_canary_default(helm: Path) -> None:
    assert prometheus_flag(helm) is None
    url = prometheus_flag(helm, f"prometheusUrl={URL}")
    assert url == URL
    defaults = OperatorDefaults(prometheus_url=url)
    spec = {"serving": {"canary": {"duration": "10m"}}}
    assert with_operator_defaults(spec, defaults)["serving"]["canary"]["prometheusUrl"] == URL
    own = {"serving": {"canary": {"prometheusUrl": "http://mine:9090"}}}
    assert with_operator_defaults(own, defaults) == own
    plain = {"serving": {"replicas": 1}}  # no canary: nothing to fill
    assert with_operator_defaults(plain, defaults) == plain


def test_a_prometheus_url_without_a_scheme_is_refused(helm: Path) -> None:
    assert "prometheusUrl" in template_error(helm, ["prometheusUrl=prometheus:9090"])
