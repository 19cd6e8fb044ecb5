"""The contract between the eagle3 operator and its stage programs.

It imports neither side (import-linter checks it in `make lint`): the Eagle3Run API (`api/`, THE schema the
CRD is generated from), the stage definitions with their typed parameters and results, the acceptance gate,
the retry policy, exit codes, mount paths, condition reasons and the one `vllm serve` command builder.
"""

from __future__ import annotations

__version__ = "0.1.0"
