"""The evaluate stage: its program (program.py, `run(ctx)`) and the helpers only it uses."""
