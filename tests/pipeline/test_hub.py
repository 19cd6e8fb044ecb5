"""A Hub-id verifier at its revision, as the local snapshot directory speculators' trainer reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants

from eagle3_pipeline.data.hub import verifier_at_revision
from eagle3_pipeline.runtime.errors import StageError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline Hub cache holding org/tiny at one commit, named by the tag v1 (and main at another)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    repo = tmp_path / "hub" / "models--org--tiny"
    for commit, ref in ((COMMIT, "v1"), ("f" * 40, "main")):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text(f'{{"ref": "{ref}"}}')
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return repo


def test_a_local_directory_or_no_revision_is_used_as_written(tmp_path: Path) -> None:
    assert verifier_at_revision(str(tmp_path), "v1") == str(tmp_path)
    assert verifier_at_revision("org/tiny", None) == "org/tiny"


@pytest.mark.parametrize("revision", ["v1", COMMIT])
def test_a_hub_id_at_a_revision_is_that_revisions_snapshot(hub_cache: Path, revision: str) -> None:
    path = Path(verifier_at_revision("org/tiny", revision))
    assert path == (hub_cache / "snapshots" / COMMIT).resolve()
    assert (path / "config.json").read_text() == '{"ref": "v1"}', "not the default branch's files"


def test_a_revision_neither_cached_nor_downloadable_says_what_to_do(hub_cache: Path) -> None:
    with pytest.raises(StageError, match=r"org/tiny at verifier.revision v2: neither in the Hub cache"):
        verifier_at_revision("org/tiny", "v2")
