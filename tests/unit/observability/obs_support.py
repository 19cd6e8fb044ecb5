"""Shared by the observability unit tests: every query of the dashboard and the alerts, parsed.

The metric names of the contract are written out here on purpose (not imported from `queries`), so a typo in
`queries` cannot pass by agreeing with itself.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import promql_parser

from eagle3_operator.observability.alerts import build_rule_groups
from eagle3_operator.observability.dashboard import build_dashboard

VLLM_METRICS = frozenset(
    {
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:request_time_per_output_token_seconds_sum",
        "vllm:request_success_total",
    }
)
# The operator's series and the labels each has (besides those of a histogram bucket: le).
OPERATOR_LABELS: dict[str, frozenset[str]] = {
    "eagle3_operator_reconciles_total": frozenset({"result"}),
    "eagle3_operator_reconcile_duration_seconds_bucket": frozenset(),
    "eagle3_operator_runs": frozenset({"namespace", "phase"}),
    "eagle3_operator_stage_duration_seconds_bucket": frozenset({"namespace", "stage"}),
    "eagle3_operator_stage_attempts_total": frozenset({"namespace", "run", "stage"}),
    "eagle3_operator_stage_failures_total": frozenset({"namespace", "run", "stage", "reason"}),
    "eagle3_run_stage_last_failure_timestamp_seconds": frozenset({"namespace", "run", "stage", "reason"}),
    "eagle3_run_stage_started_timestamp_seconds": frozenset({"namespace", "run", "stage"}),
    "eagle3_run_stage_expected_seconds": frozenset({"namespace", "run", "stage"}),
    "eagle3_run_phase": frozenset({"namespace", "run", "phase"}),
    "eagle3_run_acceptance_length": frozenset({"namespace", "run", "model", "sampling"}),
    "eagle3_run_acceptance_rate": frozenset({"namespace", "run", "model", "sampling"}),
    "eagle3_run_acceptance_by_position": frozenset({"namespace", "run", "model", "sampling", "position"}),
    "eagle3_run_speedup": frozenset({"namespace", "run", "model"}),
    "eagle3_run_validation_loss": frozenset({"namespace", "run"}),
    "eagle3_run_hidden_state_bytes": frozenset({"namespace", "run"}),
    "eagle3_run_tokens_processed": frozenset({"namespace", "run", "stage"}),
    "eagle3_run_pod_blocked": frozenset({"namespace", "run", "stage", "reason"}),
    "eagle3_serving_draft_info": frozenset({"namespace", "run", "model", "checkpoint", "sha256"}),
    "eagle3_serving_draft_rollout_timestamp_seconds": frozenset({"namespace", "run", "sha256"}),
    "eagle3_run_canary_phase": frozenset({"namespace", "run", "phase"}),
    "eagle3_run_canary_acceptance_length": frozenset({"namespace", "run", "track"}),
    "eagle3_run_canary_output_tokens_per_second": frozenset({"namespace", "run", "track"}),
    "eagle3_run_canary_requests": frozenset({"namespace", "run", "track"}),
    "eagle3_run_canary_decision_seconds": frozenset({"namespace", "run"}),
    "eagle3_run_canary_ratio": frozenset({"namespace", "run", "figure", "bound"}),
    "eagle3_run_sweep_acceptance_length": frozenset({"namespace", "run", "model", "k", "concurrency"}),
    "eagle3_run_sweep_output_tokens_per_second": frozenset({"namespace", "run", "model", "k", "concurrency"}),
    "eagle3_run_sweep_speedup": frozenset({"namespace", "run", "model", "k", "concurrency"}),
    "eagle3_run_speculation_length": frozenset(
        {"namespace", "run", "model", "min_batch_size", "max_batch_size"}
    ),
    "eagle3_run_choice_acceptance_length": frozenset({"namespace", "run", "model", "draft", "chosen"}),
    "eagle3_run_choice_output_tokens_per_second": frozenset({"namespace", "run", "model", "draft", "chosen"}),
    "eagle3_run_category_acceptance_length": frozenset({"namespace", "run", "model", "category"}),
    "eagle3_run_category_acceptance_rate": frozenset({"namespace", "run", "model", "category"}),
    "eagle3_run_category_speedup": frozenset({"namespace", "run", "model", "category"}),
}
# `track`: the canary's PodMonitor label (stable: the incumbent's pods, canary: the canary Deployment's)
VLLM_LABELS = frozenset({"namespace", "run", "model_name", "engine", "track"})
# The stage pods' series (eagle3_contract.stage_metrics): the labels their PodMonitor gives every one, plus
# each metric's own. `up` is Prometheus's, per target.
STAGE_TARGET_LABELS = frozenset({"namespace", "run", "stage", "pod"})
STAGE_LABELS: dict[str, frozenset[str]] = {
    name: STAGE_TARGET_LABELS | extra
    for name, extra in {
        "eagle3_stage_units_done": frozenset({"unit"}),
        "eagle3_stage_units": frozenset({"unit"}),
        "eagle3_stage_units_per_second": frozenset({"unit"}),
        "eagle3_stage_eta_seconds": frozenset(),
        "eagle3_stage_start_time_seconds": frozenset(),
        "eagle3_stage_tokens_total": frozenset(),
        "eagle3_stage_failures_total": frozenset({"reason"}),
        "eagle3_stage_token_budget": frozenset(),
        "eagle3_train_epochs_done": frozenset(),
        "eagle3_train_epochs": frozenset(),
        "eagle3_train_step": frozenset(),
        "eagle3_train_loss": frozenset(),
        "eagle3_train_val_loss": frozenset(),
        "eagle3_train_val_loss_rises": frozenset(),
        "eagle3_train_val_accuracy": frozenset({"position"}),
        "eagle3_train_estimated_acceptance_length": frozenset(),
        "eagle3_train_tokens_per_second": frozenset(),
        "up": frozenset(),
    }.items()
}
# serving.capture's counters on the vLLM pods' /metrics (eagle3_contract.capture): the pods' PodMonitor
# labels, no model_name (the package is not vLLM's)
CAPTURE_LABELS: dict[str, frozenset[str]] = {
    "eagle3_capture_records_total": frozenset({"namespace", "run", "track", "outcome"}),
    "eagle3_capture_bytes_total": frozenset({"namespace", "run", "track"}),
}
SERIES_LABELS = OPERATOR_LABELS | STAGE_LABELS | CAPTURE_LABELS  # every non-vLLM series, and its labels
CONTRACT_METRICS = VLLM_METRICS | frozenset(SERIES_LABELS)

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
RATE_INTERVAL = "5m"  # what $__rate_interval becomes in the parsed copies
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+), (?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    where: str
    expr: str  # as written (template variables in)

    @property
    def concrete(self) -> str:
        return self.expr.replace("$__rate_interval", RATE_INTERVAL)


@functools.cache
def dashboard() -> dict[str, Any]:
    return build_dashboard()


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def panel_queries() -> list[Query]:
    return [
        Query(f"panel {p['title']!r} target {t['refId']}", t["expr"]) for p in panels() for t in p["targets"]
    ]


def annotation_queries() -> list[Query]:
    return [Query(f"annotation {a['name']!r}", a["expr"]) for a in dashboard()["annotations"]["list"]]


def variable_queries() -> list[Query]:
    """The series selector of each query variable's `label_values(selector, label)`."""
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["query"])
            assert match, (
                f"variable {variable['name']}: not label_values(selector, label): {variable['query']}"
            )
            found.append(Query(f"variable {variable['name']!r}", match.group("selector")))
    return found


def alert_queries() -> list[Query]:
    return [
        Query(f"alert {r['alert']}", r["expr"]) for g in build_rule_groups()["groups"] for r in g["rules"]
    ]


def all_queries() -> list[Query]:
    return panel_queries() + annotation_queries() + variable_queries() + alert_queries()


def parse(query: Query) -> promql_parser.Expr:
    expr: promql_parser.Expr = promql_parser.parse(query.concrete)
    return expr


def nodes(expr: promql_parser.Expr) -> list[promql_parser.Expr]:
    found: list[promql_parser.Expr] = []
    promql_parser.walk(expr, found.append)
    return found


def selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    return [n for n in nodes(expr) if isinstance(n, promql_parser.VectorSelector)]


def metric_names(expr: promql_parser.Expr) -> set[str]:
    """The metric names an expression reads: selector names and `__name__` matchers' alternatives."""
    names = set()
    for selector in selectors(expr):
        if selector.name:
            names.add(selector.name)
        for matcher in selector.matchers.matchers:
            if matcher.name == "__name__":
                names.update(matcher.value.split("|"))
    return names


def matchers(selector: promql_parser.VectorSelector) -> dict[str, str]:
    """`label -> op value` of a selector, e.g. {"run": '=~$run'}."""
    ops = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}
    return {m.name: ops[str(m.op).split(".")[-1]] + m.value for m in selector.matchers.matchers}


def divisions(expr: promql_parser.Expr) -> list[tuple[set[str], set[str]]]:
    """(metrics of the numerator, metrics of the denominator) of every `/` in the expression."""
    return [
        (metric_names(n.lhs), metric_names(n.rhs))
        for n in nodes(expr)
        if isinstance(n, promql_parser.BinaryExpr) and str(n.op) == "/"
    ]
