"""`gpu_pipeline.py`'s report (the JSON it writes) as Markdown: the setup, then extraction and training."""

from __future__ import annotations

from typing import Any

STAGE = "stage: forwards, layer capture, copy to host, file writes"
FORWARD = "forward passes only (same batches)"


def markdown(report: dict[str, Any]) -> str:
    return "\n".join([*setup(report), "", *extraction(report["extraction"]), "", *training(report)])


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


def _num(value: float | None, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)
