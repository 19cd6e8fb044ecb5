"""Unit tests: make the shared helper modules of the test directories importable by basename from any of them.

Test directories have no `__init__.py`, so pytest puts each test file's own directory on `sys.path` and the
helpers (`api_support`, `builder_cases`, ...) are imported by basename; tests in one directory reuse the
helpers of another, and running one file alone must work too.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for helpers in ("api", "builders", "reconcile"):
    path = str(HERE / helpers)
    if path not in sys.path:
        sys.path.insert(0, path)
