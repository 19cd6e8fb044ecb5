"""`gpu_pipeline.py`'s report (the JSON it writes) as Markdown: the setup, then extraction and training, then
online against offline hidden states."""

from __future__ import annotations

from typing import Any

STAGE = "stage: forwards, layer capture, copy to host, file writes"
FORWARD = "forward passes only (same batches)"


def markdown(report: dict[str, Any]) -> str:
    """The tables of the parts the report has (`--compare` picks them)."""
    parts = [setup(report)]
    if "extraction" in report:
        parts.append(extraction(report["extraction"]))
    if "training" in report:
        parts.append(training(report))
    if "online" in report:
        parts.append(online(report["online"]))
    return "\n\n".join("\n".join(lines) for lines in parts)


def setup(report: dict[str, Any]) -> list[str]:
    v, d = report["verifier"], report["device"]
    peak = f"{d['peakTflops']:g} TFLOP/s" if d["peakTflops"] else "unknown (pass --peak-tflops)"
    versions = ", ".join(f"{k} {val}" for k, val in report["versions"].items())
    data = report["data"]
    return [
        f"gpu_pipeline: `{v['size']}` verifier ({v['parameters'] / 1e9:.3g}B parameters, random weights) on "
        f"{d['name']} ({d['type']}); peak dense bf16 {peak}; {versions}.",
        f"Data: {data['train']} training + {data['validation']} validation rows of random tokens, lengths "
        f"{data['lengths'][0]}-{data['lengths'][1]} (mean {data['meanLength']}), {data['tokens']} tokens.",
    ]


def extraction(x: dict[str, Any]) -> list[str]:
    lines = [
        f"| extraction, transformers backend, budget {x['tokenBudget']} | tokens | tokens/s "
        "| roofline tokens/s | fraction of roofline |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, key in ((STAGE, "stage"), (FORWARD, "forward")):
        lines.append(
            f"| {label} | {x['tokens']} | {x[key + 'TokensPerSecond']:,.0f} "
            f"| {_num(x['rooflineTokensPerSecond'], ',.0f')} | {_num(x[key + 'RooflineFraction'], '.3f')} |"
        )
    if x.get("peakMemoryGiB") is not None:
        lines += ["", f"Peak GPU memory of the extract stage: {x['peakMemoryGiB']:.2f} GiB."]
    return lines


def training(report: dict[str, Any]) -> list[str]:
    t = report["training"]
    s = t["settings"]
    mode = "compiled" if t.get("compiled") else "not compiled"
    lines = [
        f"| training ({mode}): {s['draft_attn_impl']}, {s['loss_implementation']} loss, {s['num_workers']} "
        f"workers, {s['total_seq_len']} tokens/step, ttt {s['ttt_steps']} | steps | steps/s | tokens/s "
        "| median step ms | compile s | first step s | peak GiB | loss first / last | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    stock = "stock: `speculators train --config run.yaml`" + (
        " in cpu_adapted()" if t.get("stockAdaptedToCpu") else ""
    )
    for name, row in (("ours: `eagle3 stage train`", t.get("ours")), (stock, t.get("stock"))):
        if row is None:
            lines.append(f"| {name} | did not run | | | | | | | | |")
            continue
        stopped = {"steps": " (stopped after its steps)", "budget": " (stopped by its budget)"}
        lines.append(
            f"| {name}{stopped.get(row.get('stopped') or '', '')} | {row['steps']} "
            f"| {_num(row['steps_per_s'])} | {_num(row['tokens_per_s'], ',.0f')} "
            f"| {_num(row['median_step_ms'], '.1f')} | {_num(row.get('compile_s'), '.1f')} "
            f"| {_num(row['first_step_s'], '.1f')} | {_num(row['peak_memory_gib'], '.2f')} "
            f"| {_num(row['first_loss'], '.3f')} / {_num(row['last_loss'], '.3f')} | {row['wall_s']} |"
        )
    r = t.get("ratio") or {}
    phases = ", ".join(f"{k} {v}" for k, v in report["phases"].items())
    lines += [
        f"| ratio ours / stock | | {_num(r.get('stepsPerSecond'))} | {_num(r.get('tokensPerSecond'))} | | "
        f"| {_num(r.get('firstStep'))} | | | {_num(r.get('wall'))} |",
        "",
        f"Rates leave out the warm-up (at least {t['warmupSteps']} steps, longer while steps still "
        "compile) and all outside the training loop (loading, loader workers, validation, checkpoints). "
        "Compile seconds are what the compiling steps took beyond a steady step; the stock run finds the "
        "caches ours filled. The first-step and wall times include loading; the stock command's also "
        "include starting Python. Phases (s): " + phases + ".",
    ]
    return lines


def online(o: dict[str, Any]) -> list[str]:
    """Online against offline: one row per mode that ran, the producer's throughput, what was skipped."""
    lines = []
    if o["runs"]:
        lines += [
            "| hidden states (`eagle3 run`) | train tokens/s | ratio to offline | train s | stored on volume "
            "| peak staging | producer prompt tokens | acceptance length: estimate / vLLM |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, r in o["runs"].items():
            name = "offline, vLLM extraction" if label == "offline" else f"online, {label} transfer"
            if "error" in r:
                lines.append(f"| {name} | {r['error']} (log: {r['log']}) | | | | | | |")
                continue
            rel = (o.get("ratio") or {}).get(label, {}).get("trainTokensPerSecond")
            lines.append(
                f"| {name} | {r['trainTokensPerSecond']:,.0f} | {_num(1.0 if label == 'offline' else rel)} "
                f"| {_num(r.get('trainSeconds'), '.1f')} | {_bytes(r['storedBytes'])} "
                f"| {_bytes(r['peakStagingBytes'])} | {_num(r.get('producerPromptTokens'), ',.0f')} "
                f"| {_num(r.get('estimatedAcceptanceLength'))} / {_num(r.get('acceptanceLength'))} |"
            )
    if o.get("producer"):
        if lines:
            lines.append("")
        lines += [
            "| `eagle3 produce` alone, speculators' async client | rows | samples/s | tokens/s | MB/s |",
            "| --- | --- | --- | --- | --- |",
        ]
        for p in o["producer"]:
            lines.append(
                f"| concurrency {p['concurrency']} | {p['rows']} | {p['samplesPerSecond']} "
                f"| {p['tokensPerSecond']:,.0f} | {p['megabytesPerSecond']} |"
            )
    for label, r in (o.get("ratio") or {}).items():
        checks = [
            f"{key} {r[key]} ({'within' if r[key + 'Within5Percent'] else 'NOT within'} 5%)"
            for key in ("estimatedAcceptanceLength", "acceptanceLength")
            if key in r
        ]
        if checks:
            lines += ["", f"Online ({label}) / offline: " + "; ".join(checks) + "."]
    for part, why in o["skipped"].items():
        lines += ["", f"Online comparison, {part}: skipped: {why}."]
    while lines and not lines[0]:
        lines.pop(0)
    return lines or ["Online comparison: nothing ran."]


def _bytes(value: int | None) -> str:
    return (
        "n/a"
        if value is None
        else f"{value / 2**30:.2f} GiB"
        if value >= 2**28
        else f"{value / 2**20:.1f} MiB"
    )


def _num(value: float | None, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)
