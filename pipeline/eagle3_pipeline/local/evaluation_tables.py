"""The evaluate stage's tables at the end of `eagle3 run`: draft.candidates' bake-off and evaluation.sweep's
speculation length, each with the intervals its decisions were taken from (docs/serving.md, "How decisions
are taken")."""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.local.display import StageOutcome, figure_text


def evaluated(outcomes: list[StageOutcome]) -> Any:
    """The last evaluate result among `outcomes` (None: evaluate did not run)."""
    from eagle3_contract.results import EvaluateResult

    found = [o.result for o in outcomes if isinstance(o.result, EvaluateResult)]
    return found[-1] if found else None


def bake_off_table(outcomes: list[StageOutcome]) -> Any:
    """draft.candidates' bake-off, when evaluate ran one: per contender its output tokens/s (median of its
    rounds), acceptance length, speedup over the verifier alone with its interval and how many of its greedy
    answers are the verifier alone's, and the verdict; None otherwise."""
    from rich.table import Table
    from rich.text import Text

    result = evaluated(outcomes)
    choice = result.checkpoint_selection if result is not None else None
    if choice is None or choice.verdict is None:
        return None
    table = Table(title=Text("bake-off: output tokens/s, 8 requests in flight, paired rounds"))
    columns = ("candidate", "output tokens/s", "acceptance length", "speedup [95 % interval]", "same answers")
    for column in columns:
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for c in [*choice.checkpoints, *choice.rivals]:
        shipped = c.method is not None and any(
            t.method == c.method and t.checkpoint == choice.checkpoint for t in choice.checkpoints
        )
        name = f"{c.method} (ships)" if shipped and choice.verdict != "rivalNotBeaten" else str(c.method)
        speed = figure_text(c.output_tokens_per_second) if c.output_tokens_per_second else "-"
        length = f"{c.acceptance_length:.2f}" if c.acceptance_length is not None else "-"
        cmp = c.comparison
        interval = (
            f"{cmp.ratio:.2f}x [{cmp.low:.2f}, {cmp.high:.2f}]" + (" noisy" if cmp.noisy else "")
            if cmp
            else "-"
        )
        same = (
            f"{c.outputs_matching_alone}/{c.outputs_compared}"
            if c.outputs_compared is not None and c.outputs_matching_alone is not None
            else "-"
        )
        table.add_row(Text(name), speed, length, interval, same)
    table.caption = Text(choice.bake_off_text())
    return table


def sweep_table(outcomes: list[StageOutcome]) -> Any:
    """evaluation.sweep's table, when evaluate measured one: per k and concurrency, output tokens/s and mean
    acceptance length, the verifier alone, and the k the tuned schedule serves; None otherwise."""
    from rich.table import Table
    from rich.text import Text

    result = evaluated(outcomes)
    table_of = result.speculation if result is not None else None
    if table_of is None or not table_of.cells:
        return None
    concurrencies = sorted({c.concurrency for c in table_of.cells})
    table = Table(
        title=Text(
            "speculation length: output tokens/s (acceptance length, speedup [95 % interval of its rounds]) "
            "per concurrency"
        )
    )
    table.add_column("k")
    for c in concurrencies:
        table.add_column(f"concurrency {c}", justify="right")
    base = {b.concurrency: b.output_tokens_per_second for b in table_of.baselines}
    table.add_row("alone", *(figure_text(base.get(c)) if base.get(c) else "-" for c in concurrencies))
    for k in sorted({c.num_speculative_tokens for c in table_of.cells}):
        cells = {c.concurrency: c for c in table_of.cells if c.num_speculative_tokens == k}
        table.add_row(str(k), *(_cell_text(cells.get(c)) for c in concurrencies))
    table.add_row("tuned k", *(_served_k(table_of.schedule, c) for c in concurrencies))
    return table


def _served_k(schedule: Any, concurrency: int) -> str:
    """The k the tuned schedule serves at `concurrency`: that of the range holding it ("0": speculation off
    there; "-": no range holds it)."""
    for r in schedule:
        if r.min_batch_size <= concurrency <= r.max_batch_size:
            undecided = r.verdict == "notDistinguishable"
            return (
                f"{r.num_speculative_tokens} (not distinguishable)"
                if undecided
                else str(r.num_speculative_tokens)
            )
    return "-"


def _cell_text(cell: Any) -> str:
    if cell is None or not cell.output_tokens_per_second:
        return "-"
    length = f"{cell.acceptance_length:.2f}" if cell.acceptance_length is not None else "-"
    speedup = f"{cell.speedup:.2f}x" if cell.speedup is not None else "-"
    c = cell.comparison
    if c is not None:
        speedup += f" [{c.low:.2f}, {c.high:.2f}]" + (" noisy" if c.noisy else "")
    return f"{figure_text(cell.output_tokens_per_second)} ({length}, {speedup})"
