"""The pure planner and the executor that carries its plans out."""

from __future__ import annotations
