"""Every PromQL expression of a Grafana dashboard (JSON) and of a Prometheus rules file (YAML).

The dashboard's panel targets (`expr`, nested rows included), its annotation queries and its query variables
(`label_values(...)`), and every rule of the rules file (a plain `groups:` file or a PrometheusRule object),
with Grafana's template variables replaced as Grafana would before it sends a query to Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# $var, ${var}, ${var:format}, [[var]]
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.+),)?\s*(?P<label>\w+)\s*\)\s*$", re.DOTALL)
ALL = ".*"


@dataclass(frozen=True)
class Query:
    """One expression and where it comes from: a panel target, an annotation or a variable."""

    where: str  # e.g. `panel "Acceptance rate" (timeseries) target A`
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Rule:
    group: str
    name: str  # the alert's name, or the recording rule's
    kind: str  # "alert" or "record"
    expr: str
    for_: str = "0s"


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row holds its panels)."""

    def walk(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from walk(panel.get("panels") or [])

    yield from walk(list(dashboard.get("panels") or []))


def panel_queries(panel: Mapping[str, Any]) -> list[Query]:
    where = f'panel "{panel.get("title", "")}" ({panel.get("type", "")})'
    return [
        Query(f"{where} target {t.get('refId', i)}", str(t["expr"]), str(t.get("legendFormat") or ""))
        for i, t in enumerate(panel.get("targets") or [])
        if t.get("expr") and not t.get("hide")
    ]


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """The panels' and the annotations' queries, as written in the dashboard (template variables in)."""
    found = [q for panel in panels(dashboard) for q in panel_queries(panel)]
    for annotation in (dashboard.get("annotations") or {}).get("list") or []:
        if annotation.get("expr"):
            found.append(Query(f'annotation "{annotation.get("name", "")}"', str(annotation["expr"])))
    return found


def variable_names(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """The template variables, name to type (query, custom, datasource, interval, ...)."""
    variables = (dashboard.get("templating") or {}).get("list") or []
    return {str(v["name"]): str(v.get("type", "")) for v in variables}


def variable_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each query variable's `label_values(selector, label)` as (name, query) as written."""
    out = []
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        query = query.get("query") if isinstance(query, Mapping) else query
        if variable.get("type") == "query" and isinstance(query, str):
            out.append((str(variable["name"]), query))
    return out


def label_values_query(query: str) -> tuple[str | None, str]:
    """`label_values(selector, label)` as (selector or None, label); ValueError for another function."""
    match = LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values() query: {query}")
    selector = match.group("selector")
    return (selector.strip() if selector else None), match.group("label")


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana's variables (`$x`, `${x}`, `${x:fmt}`, `[[x]]`) with `values`; unknown ones stay."""

    def replace(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g is not None)
        return values.get(name, match.group(0))

    return VARIABLE.sub(replace, expr)


def unresolved(expr: str) -> list[str]:
    """The variables still in `expr` after substitution."""
    return [next(g for g in m.groups() if g is not None) for m in VARIABLE.finditer(expr)]


def builtin_values(rate_interval: str) -> dict[str, str]:
    """Grafana's built-in interval variables, all set to one window (what a short test range resolves to)."""
    return {
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "__range": rate_interval,
        "__range_s": str(_seconds(rate_interval)),
        "__range_ms": str(_seconds(rate_interval) * 1000),
        "__interval_ms": str(_seconds(rate_interval) * 1000),
    }


def _seconds(window: str) -> int:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)", window)
    if match is None:
        raise ValueError(f"not a Prometheus duration: {window}")
    return int(int(match.group(1)) * units[match.group(2)])


def rule_groups(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The groups of a rules file (`groups:`) or of a PrometheusRule (`spec.groups`)."""
    groups = document.get("groups")
    if groups is None:
        groups = (document.get("spec") or {}).get("groups")
    return list(groups or [])


def rules(path: Path) -> list[Rule]:
    """Every rule of every YAML document in `path`."""
    found = []
    for document in yaml.safe_load_all(path.read_text()):
        for group in rule_groups(document or {}):
            for rule in group.get("rules") or []:
                kind = "alert" if "alert" in rule else "record"
                name = str(rule.get("alert") or rule.get("record"))
                found.append(
                    Rule(str(group["name"]), name, kind, str(rule["expr"]), str(rule.get("for", "0s")))
                )
    return found
