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
    return lines


def training(report: dict[str, Any]) -> list[str]:
    t = report["training"]
    s = t["settings"]
    lines = [
        f"| training: {s['draft_attn_impl']}, {s['loss_implementation']} loss, {s['num_workers']} workers, "
        f"{s['total_seq_len']} tokens/step, ttt {s['ttt_steps']} | steps | steps/s | tokens/s "
        "| median step ms | peak GiB | loss first / last | first step s | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    stock = "stock: `speculators train --config run.yaml`" + (
        " in cpu_adapted()" if t["stockAdaptedToCpu"] else ""
    )
    for name, row in (("ours: `eagle3 stage train`", t["ours"]), (stock, t["stock"])):
        lines.append(
            f"| {name} | {row['steps']} | {row['steps_per_s']} | {row['tokens_per_s']:,.0f} "
            f"| {row['median_step_ms']} | {_num(row['peak_memory_gib'], '.2f')} "
            f"| {_num(row['first_loss'], '.3f')} / {_num(row['last_loss'], '.3f')} | {row['first_step_s']} "
            f"| {row['wall_s']} |"
        )
    r = t["ratio"]
    lines += [
        f"| ratio ours / stock | | {_num(r['stepsPerSecond'])} | {_num(r['tokensPerSecond'])} | | | "
        f"| {_num(r['firstStep'])} | {_num(r['wall'])} |",
        "",
        f"Rates leave out the first {t['warmupSteps']} steps (compilation) and all outside the training "
        "loop (loading, loader workers, validation, checkpoints), which the first-step and wall times "
        "include; the stock command's also include starting Python and importing torch. Phases (s): "
        + ", ".join(f"{k} {v}" for k, v in report["phases"].items())
        + ".",
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
