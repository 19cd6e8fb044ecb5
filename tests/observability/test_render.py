"""render.py without a Prometheus: the committed dashboard's panels fed canned `query_range` answers.

The tier (test_prometheus_tier.py) draws docs/dashboard.png from a real Prometheus; these check, in
milliseconds, what it relies on: the main panels are found by title, a table panel becomes rows of its label
sets with a column per target (as Grafana's merge and organize transformations show it), and the PNG is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.observability.render import MAIN_PANELS, main_panels, panel_data, render

SWEEP = "Speculation sweep: k x concurrency"


def cell(k: str, concurrency: str, values: list[str]) -> dict[str, Any]:
    metric = {"namespace": "ml", "run": "good", "k": k, "concurrency": concurrency}
    return {"metric": metric, "values": [[1000.0 + i, v] for i, v in enumerate(values)]}


def sweep_answers(expr: str) -> list[dict[str, Any]]:
    """Each sweep figure's series (the last value is the one a table shows); one cell lacks its length."""
    if "speedup" in expr:
        return [cell("3", "1", ["1.1", "1.3"]), cell("0", "1", ["1"]), cell("10", "1", ["0.9"])]
    if "acceptance_length" in expr:
        return [cell("3", "1", ["NaN", "2.5"]), cell("0", "1", ["1"])]
    return [cell("3", "1", ["50", "52"]), cell("0", "1", ["40"]), cell("10", "1", ["36"])]


def test_the_main_panels_include_the_canary_and_the_sweep(dashboard: dict[str, Any]) -> None:
    titles = [str(p["title"]).lower() for p in main_panels(dashboard)]
    assert len(titles) == len(MAIN_PANELS), titles
    assert any(t.startswith("canary vs incumbent: mean acceptance length") for t in titles)
    assert any(t.startswith("canary vs incumbent: output tokens/s") for t in titles)
    assert SWEEP.lower() in titles


def test_a_table_panel_is_its_label_sets_by_its_columns(dashboard: dict[str, Any], tmp_path: Path) -> None:
    [sweep] = [p for p in main_panels(dashboard) if p["title"] == SWEEP]
    data = panel_data(sweep, sweep_answers)
    table = data.table
    assert table is not None
    assert table.keys == ["run", "concurrency", "k"]
    assert table.columns == ["output tokens/s", "acceptance length", "speedup"]
    assert table.rows == {
        ("good", "1", "3"): {"output tokens/s": 52.0, "acceptance length": 2.5, "speedup": 1.3},
        ("good", "1", "0"): {"output tokens/s": 40.0, "acceptance length": 1.0, "speedup": 1.0},
        ("good", "1", "10"): {"output tokens/s": 36.0, "speedup": 0.9},
    }
    out = render([data], tmp_path / "sweep.png", "sweep")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_time_series_panel_has_no_table(dashboard: dict[str, Any]) -> None:
    [length] = [p for p in main_panels(dashboard) if "canary vs incumbent: mean" in p["title"].lower()]
    data = panel_data(length, lambda expr: [cell("3", "1", ["2.0", "2.1"])])
    assert data.table is None and data.series and data.series[0].values == [2.0, 2.1]
