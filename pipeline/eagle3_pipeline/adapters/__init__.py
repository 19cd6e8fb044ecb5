"""Fenced workarounds around libraries (speculators and vLLM on the CPU, a fused-loss kernel fix); each
keeps its version pin and when it can be removed. Nothing here imports the rest of the pipeline."""
