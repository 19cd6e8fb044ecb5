"""The report of one `benchmarks/gpu_session.sh` call: each step against its budget, every GPU test's outcome,
and the figures the call exists for, each either measured or said to be missing, with why.

    python benchmarks/gpu_session_report.py --out DIR [--limit 480]

Reads what the steps left in DIR: gpu_session.steps.tsv (the session's record of its steps), gpu_tier.xml
(pytest's JUnit report; without it, the outcome lines of gpu_tier.log) and gpu_pipeline.json (the benchmark,
rewritten after each of its phases). Writes gpu_session.json and gpu_session.md, and prints the Markdown.
The standard library only: it runs with whatever Python the device has, before or without the packages.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
# `pytest -v`: "tests/gpu/test_x.py::test_y PASSED [ 20%]"; `-rA`: "FAILED tests/gpu/test_x.py::test_y - why"
_VERBOSE = re.compile(r"^(tests/\S+?) (" + "|".join(OUTCOMES) + r")\b")
_SUMMARY = re.compile(r"^(" + "|".join(OUTCOMES) + r") (tests/\S+?)(?: - (.*))?$")


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The session's steps as recorded so far (budget, seconds and exit as numbers where given)."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    for row in rows:
        for key in ("budget", "seconds", "exit"):
            row[key] = int(row[key]) if row.get(key) else None
    return rows


def junit_outcomes(path: Path) -> list[dict[str, Any]]:
    """One entry per test case of a JUnit report: its node, outcome, seconds and, when not passed, why."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name, classname = case.get("name", ""), case.get("classname", "")
        outcome, message = "passed", None
        for tag, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                outcome, message = label, (found.get("message") or found.text or "").strip()[:500]
                break
        node = f"{classname}::{name}" if classname else name
        seconds = float(case.get("time", 0))
        tests.append({"test": node, "outcome": outcome, "seconds": seconds, "why": message})
    return tests


def log_outcomes(path: Path) -> list[dict[str, Any]]:
    """Outcomes from `pytest -v -rA` output (a run stopped before pytest wrote its JUnit report)."""
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text(errors="replace").splitlines():
        if match := _VERBOSE.match(line):
            node, outcome, why = match.group(1), match.group(2), None
        elif match := _SUMMARY.match(line):
            node, outcome, why = match.group(2), match.group(1), match.group(3)
        else:
            continue
        entry = found.setdefault(node, {"test": node, "seconds": None, "why": None})
        entry["outcome"] = outcome.lower()
        entry["why"] = why or entry["why"]
    return list(found.values())


def tier(out: Path, modules: list[str]) -> dict[str, Any]:
    """Every test's outcome, and each tier module with none (not reached: the tier stopped before it)."""
    xml, log = out / "gpu_tier.xml", out / "gpu_tier.log"
    if xml.exists():
        source, tests = "gpu_tier.xml", junit_outcomes(xml)
    elif log.exists():
        source, tests = "gpu_tier.log", log_outcomes(log)
    else:
        return {"source": None, "tests": [], "notReached": modules, "counts": {}}
    seen = {t["test"].split("::")[0].replace("/", ".").removesuffix(".py") for t in tests}
    not_reached = [m for m in modules if m.replace("/", ".").removesuffix(".py") not in seen]
    counts: dict[str, int] = {}
    for test in tests:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return {"source": source, "tests": tests, "notReached": not_reached, "counts": counts}


def missing(bench: dict[str, Any] | None, part: str) -> str:
    """Why the benchmark has no `part`: no report at all, a phase past its budget, or a phase's error."""
    if bench is None:
        return "missing: no gpu_pipeline.json (the bench step did not start the benchmark, or was skipped)"
    over, errors = bench.get("overBudget") or {}, bench.get("errors") or {}
    why = [f"phase {k} ran past its {v} s budget" for k, v in over.items()]
    why += [f"phase {k} failed: {v}" for k, v in errors.items()]
    return f"missing: no {part} in gpu_pipeline.json" + (f" ({'; '.join(why)})" if why else "")


def training(bench: dict[str, Any] | None) -> dict[str, Any]:
    t = (bench or {}).get("training")
    if not t or "ours" not in t:
        return {"missing": missing(bench, "training figures")}
    runs = {label: t.get(label) for label in ("ours", "stock")}
    keys = ("tokens_per_s", "steps_per_s", "measured_steps", "warmup_steps", "compile_s", "first_step_s")
    figures: dict[str, Any] = {
        label: {k: run.get(k) for k in (*keys, "peak_memory_gib", "stopped")} if run else None
        for label, run in runs.items()
    }
    for label, run in runs.items():
        if run is None:
            figures[label] = {"missing": missing(bench, f"{label} training run")}
        elif run.get("stopped") == "running":
            figures[label]["note"] = "cut short: the figures saved while it ran"
    figures["ratio"] = (t.get("ratio") or {}).get("tokensPerSecond")
    figures["compiled"] = t.get("compiled")
    return figures


def extraction(bench: dict[str, Any] | None) -> dict[str, Any]:
    x = (bench or {}).get("extraction")
    if not x:
        return {"missing": missing(bench, "extraction figures")}
    keys = ("stageTokensPerSecond", "forwardTokensPerSecond", "rooflineTokensPerSecond")
    return {k: x.get(k) for k in (*keys, "stageRooflineFraction", "forwardRooflineFraction", "peakMemoryGiB")}


def peak_memory(bench: dict[str, Any] | None) -> dict[str, Any]:
    t, x = (bench or {}).get("training") or {}, (bench or {}).get("extraction") or {}
    peaks = {
        "extract": x.get("peakMemoryGiB"),
        "ours": (t.get("ours") or {}).get("peak_memory_gib"),
        "stock": (t.get("stock") or {}).get("peak_memory_gib"),
    }
    measured = [v for v in peaks.values() if v is not None]
    if not measured and ((bench or {}).get("device") or {}).get("type") == "cpu":
        return {"missing": "missing: a run on the CPU (the smoke mode) has no GPU memory", **peaks}
    if not measured:
        return {"missing": missing(bench, "peak GPU memory"), **peaks}
    return {"maxGiB": max(measured), **peaks}


def build(out: Path, limit: int) -> dict[str, Any]:
    steps = read_steps(out / "gpu_session.steps.tsv")
    bench_file = out / "gpu_pipeline.json"
    bench = json.loads(bench_file.read_text()) if bench_file.exists() else None
    modules = sorted(f"tests/gpu/{p.name}" for p in (REPO / "tests" / "gpu").glob("test_*.py"))
    start = sum((s["budget"] or 0) for s in steps if s["step"] == "start")  # an allowance, not measured
    used = start + sum((s["seconds"] or 0) for s in steps)
    return {
        "limitSeconds": limit,
        "steps": steps,
        "usedSeconds": used,
        "tier": tier(out, modules),
        "training": training(bench),
        "extraction": extraction(bench),
        "peakMemory": peak_memory(bench),
        "device": (bench or {}).get("device"),
        "versions": (bench or {}).get("versions"),
    }


def _fmt(value: Any, spec: str = ",.1f") -> str:
    if value is None:
        return "missing"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def markdown(report: dict[str, Any]) -> str:
    lines = ["| step | budget s | seconds | status |", "| --- | --- | --- | --- |"]
    for s in report["steps"]:
        seconds = "" if s["step"] == "start" else _fmt(s["seconds"], "d")
        lines.append(f"| {s['step']} | {_fmt(s['budget'], 'd')} | {seconds} | {s['status']} |")
    used = f"Used {report['usedSeconds']} s of {report['limitSeconds']} (the start allowance in full)."
    lines += ["", used, ""]
    t = report["tier"]
    lines += ["| GPU test | outcome | seconds | why |", "| --- | --- | --- | --- |"]
    for test in t["tests"]:
        why = (test["why"] or "").replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {test['test']} | {test['outcome']} | {_fmt(test['seconds'], '.1f')} | {why} |")
    lines += [f"| {m} | not reached | | |" for m in t["notReached"]]
    lines += ["", training_lines(report["training"]), extraction_line(report["extraction"])]
    p = report["peakMemory"]
    peaks = ", ".join(f"{k} {_fmt(p[k], '.2f')}" for k in ("extract", "ours", "stock"))
    lines.append(f"Peak GPU memory (GiB): {p.get('missing') or _fmt(p.get('maxGiB'), '.2f')} ({peaks}).")
    return "\n".join(lines)


def training_lines(t: dict[str, Any]) -> str:
    if "missing" in t:
        return f"Training: {t['missing']}."
    parts = []
    for label in ("ours", "stock"):
        run = t[label]
        if "missing" in run:
            parts.append(f"{label}: {run['missing']}")
            continue
        parts.append(
            f"{label}: {_fmt(run['tokens_per_s'])} tokens/s over {run['measured_steps']} steps after a "
            f"{run['warmup_steps']}-step warm-up, compile {_fmt(run['compile_s'])} s, first step at "
            f"{_fmt(run['first_step_s'])} s" + (f" ({run['note']})" if "note" in run else "")
        )
    mode = "compiled" if t["compiled"] else "not compiled"
    return f"Training ({mode}): " + "; ".join(parts) + f"; ratio ours / stock {_fmt(t['ratio'], '.3f')}."


def extraction_line(x: dict[str, Any]) -> str:
    if "missing" in x:
        return f"Extraction: {x['missing']}."
    return (
        f"Extraction: the stage {_fmt(x['stageTokensPerSecond'])} tokens/s "
        f"({_fmt(x['stageRooflineFraction'], '.3f')} of the prefill roofline, "
        f"{_fmt(x['rooflineTokensPerSecond'])} tokens/s), forward passes alone "
        f"{_fmt(x['forwardTokensPerSecond'])} tokens/s ({_fmt(x['forwardRooflineFraction'], '.3f')})."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the session's $OUT")
    p.add_argument("--limit", type=int, default=480, help="the call's device seconds (default 480)")
    args = p.parse_args(argv)
    report = build(args.out, args.limit)
    text = markdown(report)
    (args.out / "gpu_session.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "gpu_session.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
