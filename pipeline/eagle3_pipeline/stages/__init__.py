"""One module per stage program; each exposes `run(ctx: StageContext) -> dict` (the stage's JSON result)."""
