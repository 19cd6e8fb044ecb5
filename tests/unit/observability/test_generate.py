"""The committed dashboard JSON and rules file are what the code generates (`make observability`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from devtools import observability as generate
from devtools.generated import REPO_ROOT

from eagle3_operator.observability.alerts import build_rule_groups
from eagle3_operator.observability.dashboard import build_dashboard


def test_committed_files_are_generated() -> None:
    stale = generate.GENERATOR.stale()
    assert not stale, (
        f"{', '.join(stale)} differ(s) from what devtools.observability generates: "
        f"run `{generate.MAKE_TARGET}` and commit the result"
    )


def test_file_formats() -> None:
    dashboard = (REPO_ROOT / generate.DASHBOARD_PATH).read_text()
    assert dashboard.endswith("}\n") and json.loads(dashboard) == build_dashboard()
    assert dashboard == json.dumps(json.loads(dashboard), indent=2, sort_keys=True) + "\n"
    rules = (REPO_ROOT / generate.RULES_PATH).read_text()
    assert yaml.safe_load(rules) == build_rule_groups()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel in generate.GENERATOR.outputs:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, tmp_path / rel)
    return tmp_path


def test_check_names_the_stale_file_and_the_make_target(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert generate.GENERATOR.main(["--check", "--root", str(tree)]) == 0
    (tree / generate.RULES_PATH).write_text("groups: []\n")
    assert generate.GENERATOR.main(["--check", "--root", str(tree)]) == 1
    err = capsys.readouterr().err
    assert generate.RULES_PATH in err and "make observability" in err
    assert generate.DASHBOARD_PATH not in err


def test_write_restores_the_files(tree: Path) -> None:
    (tree / generate.DASHBOARD_PATH).unlink()
    assert generate.GENERATOR.main(["--root", str(tree)]) == 0
    assert generate.GENERATOR.stale(tree) == []
    assert generate.GENERATOR.write(tree) == []
