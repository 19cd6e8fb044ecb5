"""`python -m eagle3_cli`: the `eagle3` command (what the local executor and the tests start)."""

from __future__ import annotations

from eagle3_cli.main import main

raise SystemExit(main())
