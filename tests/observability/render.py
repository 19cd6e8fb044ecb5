"""A Grafana dashboard's main panels, drawn from Prometheus `query_range` results into one PNG (matplotlib).

    panels = main_panels(dashboard)                          # the panels worth a picture, by title
    data = [panel_data(p, fetch) for p in panels]            # fetch(expr) -> query_range result
    render(data, Path("docs/dashboard.png"), "EAGLE-3 ...")

Each panel keeps its dashboard title, its unit (percentunit, s, tps, ...) and its targets' legend formats;
stat panels are drawn as time series too (a picture of a moment says less); table panels (instant queries
merged on their labels, as Grafana's merge and organize transformations show them) as a table of each label
set's last values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.observability.expressions import panel_queries, panels

# Keywords of the main panels' titles (lower case), in the order the grid shows them.
MAIN_PANELS: tuple[tuple[str, ...], ...] = (
    ("acceptance rate",),
    ("mean acceptance length",),
    ("acceptance by",),
    ("live / evaluated", "evaluated"),
    ("accepted tokens",),
    ("generation tokens",),
    ("time to first token",),
    ("inter-token latency",),
    ("runs by phase",),
    ("train and validation loss",),
    ("stage progress",),
    ("stage rate",),
    ("canary vs incumbent: mean acceptance length",),
    ("canary vs incumbent: output tokens/s",),
    ("speculation sweep",),
)
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
COLUMNS = 3
Fetch = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class Series:
    label: str
    times: list[float]
    values: list[float]


@dataclass(frozen=True)
class Table:
    """A table panel's rows: one per label set (`keys`' values), a column per target (`columns`)."""

    keys: list[str]
    columns: list[str]
    rows: dict[tuple[str, ...], dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class PanelData:
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    table: Table | None = None


def main_panels(
    dashboard: Mapping[str, Any], wanted: Sequence[tuple[str, ...]] = MAIN_PANELS
) -> list[dict[str, Any]]:
    """For each keyword group, the first panel with targets whose title holds one (time series first)."""
    candidates = [p for p in panels(dashboard) if p.get("targets")]
    candidates.sort(key=lambda p: p.get("type") != "timeseries")  # stable: dashboard order otherwise
    chosen: list[dict[str, Any]] = []
    for keywords in wanted:
        for keyword in keywords:
            found = next(
                (p for p in candidates if keyword in str(p.get("title", "")).lower() and p not in chosen),
                None,
            )
            if found is not None:
                chosen.append(found)
                break
    return chosen


def legend(fmt: str, metric: Mapping[str, str]) -> str:
    """Grafana's legend format: `{{label}}` replaced by the series' label value."""
    if not fmt or fmt == "__auto":
        inner = ", ".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__")
        return inner or "value"
    return LEGEND.sub(lambda m: metric.get(m.group(1), ""), fmt)


def table_of(panel: Mapping[str, Any]) -> Table | None:
    """A table panel's shape from its organize transformation: the label columns it shows (namespace aside)
    and each target's column name (`Value #<refId>` renamed); None for any other panel."""
    if panel.get("type") != "table":
        return None
    organize: Mapping[str, Any] = {}
    for transformation in panel.get("transformations") or []:
        if transformation.get("id") == "organize":
            organize = transformation.get("options") or {}
    renamed = organize.get("renameByName") or {}
    shown = [t for t in panel.get("targets") or [] if t.get("expr") and not t.get("hide")]  # panel_queries'
    columns = [str(renamed.get(f"Value #{t.get('refId')}", t.get("refId"))) for t in shown]
    order = organize.get("indexByName") or {}
    keys = [k for k in sorted(order, key=order.get) if k not in columns and k != "namespace"]
    return Table(keys, columns)


def _tabulate(table: Table, column: str, metric: Mapping[str, str], series: Series) -> None:
    if series.values:
        key = tuple(str(metric.get(k, "")) for k in table.keys)
        table.rows.setdefault(key, {})[column] = series.values[-1]


def panel_data(panel: Mapping[str, Any], fetch: Fetch) -> PanelData:
    """The panel's targets through `fetch`, one Series per result series (NaN and Inf samples dropped); a
    table panel's also as its Table's rows (each series' last value)."""
    unit = str(((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit") or "")
    out = PanelData(str(panel.get("title", "")), unit, table=table_of(panel))
    targets = panel_queries(panel)
    for column, query in enumerate(targets):
        for result in fetch(query.expr):
            points = [(float(t), float(v)) for t, v in result.get("values", [])]
            points = [(t, v) for t, v in points if math.isfinite(v)]
            label = legend(query.legend, result.get("metric", {}))
            if len(targets) > 1 and not query.legend:
                label = f"{query.where.rsplit(' ', 1)[-1]}: {label}"
            series = Series(label, [t for t, _ in points], [v for _, v in points])
            out.series.append(series)
            if out.table is not None:
                _tabulate(out.table, out.table.columns[column], result.get("metric", {}), series)
    return out


def _format_axis(ax: Any, unit: str) -> None:
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    if unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    elif unit == "s":
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda v, _: f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s")
        )
    elif unit == "tps":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}/s"))


def _draw_table(ax: Any, table: Table) -> None:
    ax.axis("off")
    if not table.rows:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="#8e8e8e")
        return
    cells = [
        [*key, *(f"{row[c]:.2f}" if c in row else "" for c in table.columns)]
        for key, row in sorted(table.rows.items(), key=lambda kv: [_sortable(k) for k in kv[0]])
    ]
    height = min(1.0, 0.1 * (len(cells) + 1))  # a tenth of the panel a row, the header included, at most all
    labels = [*table.keys, *table.columns]
    chars = [max(len(text) for text in column) + 2 for column in zip(labels, *cells, strict=True)]
    widths = [c / sum(chars) for c in chars]  # each column as wide as its longest text
    bbox = (0.0, 1.0 - height, 1.0, height)
    drawn = ax.table(cellText=cells, colLabels=labels, colWidths=widths, bbox=bbox)
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(9)
    for (row, _), cell in drawn.get_celld().items():
        cell.set_facecolor("#22252b" if row == 0 else "#181b1f")
        cell.set_edgecolor("#2c3235")
        cell.get_text().set_color("#d8d9da")


def _sortable(value: str) -> tuple[int, float, str]:
    """Numbers in numeric order (k 1 before k 10), then text."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _draw(ax: Any, panel: PanelData, span: tuple[float, float] | None) -> None:
    from matplotlib.dates import DateFormatter

    ax.set_title(panel.title, fontsize=11, loc="left", color="#d8d9da")
    if panel.table is not None:
        _draw_table(ax, panel.table)
        return
    drawn = 0
    for series in panel.series:
        if series.times:
            ax.plot(
                [datetime.fromtimestamp(t) for t in series.times], series.values, lw=1.6, label=series.label
            )
            drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="#8e8e8e")
    if span is not None:
        ax.set_xlim(datetime.fromtimestamp(span[0]), datetime.fromtimestamp(span[1]))
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]
    ax.tick_params(labelsize=8, colors="#a0a0a0")
    ax.grid(True, color="#2c3235", lw=0.6)
    ax.set_facecolor("#181b1f")
    for spine in ax.spines.values():
        spine.set_color("#2c3235")
    _format_axis(ax, panel.unit)
    if drawn:
        ax.legend(fontsize=7, loc="best", facecolor="#181b1f", edgecolor="#2c3235", labelcolor="#d8d9da")


def render(
    data: Sequence[PanelData],
    path: Path,
    title: str,
    subtitle: str = "",
    span: tuple[float, float] | None = None,
) -> Path:
    """A grid of the panels (COLUMNS wide), dark as Grafana's default theme, written to `path` as PNG; `span`
    (unix times) is every panel's time axis, as a dashboard's time range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, math.ceil(len(data) / COLUMNS))
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(6 * COLUMNS, 3.6 * rows), squeeze=False)
    fig.patch.set_facecolor("#111217")
    for ax, panel in zip(axes.flat, data, strict=False):
        _draw(ax, panel, span)
    for ax in list(axes.flat)[len(data) :]:
        ax.set_visible(False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=15, color="#d8d9da")
    if subtitle:
        fig.text(0.01, 1 - 0.5 / (3.6 * rows), subtitle, fontsize=9, color="#a0a0a0", va="top")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, facecolor=fig.get_facecolor())
    plt.close(fig)
    return path
