"""One package per stage; its `program` module exposes `run(ctx: StageContext) -> dict | StageResult` (the
stage's JSON result), and the helpers beside it serve that stage only."""
