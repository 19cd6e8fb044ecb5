"""scripts/build-images.sh's cache key (`--print-key`), without building anything.

The script runs from a small copy of the repository (a temporary git repository holding the real scripts,
Dockerfiles, .dockerignore and .gitignore, and placeholder sources for what the Dockerfiles copy), with the
builder, the base and pip's configuration fixed by the environment, so that no image storage, Docker or the
machine's pip settings are consulted. The key must not move when nothing changed, must move when a copied
file, a build argument or the base changes, and must ignore what git ignores (caches, build outputs) and what
the Dockerfiles do not copy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/build-images.sh"
REAL_FILES = [
    SCRIPT,
    "scripts/build-base-image.sh",
    "scripts/machine-cache.sh",
    "images/operator/Dockerfile",
    "images/pipeline/Dockerfile.cpu",
    ".dockerignore",
    ".gitignore",
]
PLACEHOLDERS = [
    "pyproject.toml",
    "README.md",
    "contract/eagle3_contract/__init__.py",
    "operator/eagle3_operator/__init__.py",
    "pipeline/eagle3_pipeline/__init__.py",
    "cli/eagle3_cli/__init__.py",
    "scripts/build-vllm-cpu.sh",
    "docs/images.md",
]
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in REAL_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    for name in PLACEHOLDERS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def key(repo: Path, name: str = "operator", **env: str) -> str:
    environment = {
        **os.environ,
        "EAGLE3_IMAGES_BUILDER": "buildah",
        "EAGLE3_IMAGES_BASE": "stand-in",
        "EAGLE3_IMAGES_BASE_ID": "sha256:" + "1" * 64,
        "EAGLE3_IMAGES_CACHE": str(repo.parent / "cache"),
        "PIP_CONFIG_FILE": os.devnull,  # pip reads no configuration file: only the PIP_* environment below
        "PIP_FIND_LINKS": "",
        "PIP_EXTRA_INDEX_URL": "",
        **env,
    }
    done = subprocess.run(
        ["bash", str(repo / SCRIPT), "--print-key", name],
        capture_output=True, text=True, env=environment, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = done.stdout.strip()
    assert HEX64.match(found), done.stdout
    return found


def pip_available() -> bool:
    """The script reads pip's settings with `python3 -m pip config list`."""
    python3 = shutil.which("python3")
    if python3 is None:
        return False
    return subprocess.run([python3, "-m", "pip", "--version"], capture_output=True).returncode == 0


@pytest.mark.parametrize("name", ["operator", "pipeline-cpu"])
def test_the_key_is_stable_when_nothing_changes(repo: Path, name: str) -> None:
    first = key(repo, name)
    assert key(repo, name) == first
    (repo / "docs/images.md").write_text("not copied by any Dockerfile\n")
    (repo / "tests").mkdir()
    (repo / "tests/test_new.py").write_text("untracked, not copied\n")
    assert key(repo, name) == first


def test_the_images_have_different_keys(repo: Path) -> None:
    assert key(repo, "operator") != key(repo, "pipeline-cpu")


def test_a_copied_file_changes_the_key(repo: Path) -> None:
    before = key(repo)
    source = repo / "operator/eagle3_operator/__init__.py"
    source.write_text("changed = True\n")
    edited = key(repo)
    assert edited != before
    source.chmod(0o755)  # COPY keeps the mode
    assert key(repo) != edited
    source.write_text(f"# {source.relative_to(repo)}\n")
    source.chmod(0o644)
    assert key(repo) == before


def test_a_new_untracked_file_changes_the_key(repo: Path) -> None:
    before = key(repo)
    (repo / "contract/eagle3_contract/new.py").write_text("x = 1\n")  # not yet added to git: still copied
    assert key(repo) != before


def test_the_dockerfile_and_the_dockerignore_are_in_the_key(repo: Path) -> None:
    before = key(repo)
    with (repo / "images/operator/Dockerfile").open("a") as f:
        f.write("# a comment\n")
    after_dockerfile = key(repo)
    assert after_dockerfile != before
    with (repo / ".dockerignore").open("a") as f:
        f.write("**/*.log\n")
    assert key(repo) != after_dockerfile


def test_only_the_pipeline_image_copies_the_vllm_script(repo: Path) -> None:
    operator, pipeline = key(repo, "operator"), key(repo, "pipeline-cpu")
    (repo / "scripts/build-vllm-cpu.sh").write_text("# another recipe\n")
    assert key(repo, "operator") == operator
    assert key(repo, "pipeline-cpu") != pipeline


def test_files_ignored_by_git_do_not_change_the_key(repo: Path) -> None:
    before = key(repo), key(repo, "pipeline-cpu")
    for ignored in (
        "operator/eagle3_operator/__pycache__/handlers.cpython-311.pyc",
        "pipeline/build/lib/eagle3_pipeline/x.py",
        "cli/eagle3_cli.egg-info/PKG-INFO",
        "contract/.mypy_cache/x.json",
    ):
        path = repo / ignored
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("a build output\n")
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True)
    assert "??" not in status.stdout, "the .gitignore copied from the repository should ignore these"
    assert (key(repo), key(repo, "pipeline-cpu")) == before


def test_a_tracked_file_deleted_from_the_working_tree_changes_the_key(repo: Path) -> None:
    before = key(repo)
    (repo / "cli/eagle3_cli/__init__.py").unlink()  # still in git's index, no longer in the build context
    assert key(repo) != before


def test_the_base_and_its_build_arguments_are_in_the_key(repo: Path) -> None:
    stand_in = key(repo)
    assert key(repo, EAGLE3_IMAGES_BASE_ID="sha256:" + "2" * 64) != stand_in
    # the same base ID without the stand-in's PYTHON_IMAGE/PYTHON_VERSION arguments
    assert key(repo, EAGLE3_IMAGES_BASE="real") != stand_in
    assert key(repo, EAGLE3_IMAGES_BUILDER="docker") != stand_in


@pytest.mark.skipif(not pip_available(), reason="no pip for python3: the script passes no pip settings")
def test_pips_settings_are_build_arguments_of_the_cpu_image(repo: Path) -> None:
    wheels, other = repo.parent / "wheels", repo.parent / "other-wheels"
    index = repo.parent / "pypi" / "simple"
    for directory in (wheels, other, index):
        directory.mkdir(parents=True)
    base = key(repo, "pipeline-cpu")
    with_wheels = key(repo, "pipeline-cpu", PIP_FIND_LINKS=str(wheels))
    assert with_wheels != base
    assert key(repo, "pipeline-cpu", PIP_FIND_LINKS=str(other)) != with_wheels
    assert key(repo, "pipeline-cpu", PIP_EXTRA_INDEX_URL=index.as_uri()) != base
    # the operator's Dockerfile takes no pip settings
    assert key(repo, PIP_FIND_LINKS=str(wheels)) == key(repo)


def test_print_key_refuses_unknown_and_gpu_images(repo: Path) -> None:
    for name, says in (("nope", "unknown image"), ("pipeline", None)):
        done = subprocess.run(
            ["bash", str(repo / SCRIPT), *(["--print-key", name] if says else [name])],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode != 0 and done.stdout == ""
        assert (says or "GPU pipeline image") in done.stderr


def test_the_stand_in_base_is_the_one_the_dockerfiles_take() -> None:
    """build-base-image.sh's tag is what build-images.sh's PYTHON_IMAGE, PYTHON_VERSION make of the FROM."""
    stand_in_args = (REPO / SCRIPT).read_text().split("\nSTAND_IN_ARGS=(", 1)[1].split(")", 1)[0]
    args = dict(arg.split("=", 1) for arg in stand_in_args.split())
    base_ref = re.search(r"^REF=(\S+)$", (REPO / "scripts/build-base-image.sh").read_text(), re.MULTILINE)
    assert base_ref and base_ref[1] == f"{args['PYTHON_IMAGE']}:{args['PYTHON_VERSION']}-slim-bookworm"
    for dockerfile in ("images/operator/Dockerfile", "images/pipeline/Dockerfile.cpu"):
        text = (REPO / dockerfile).read_text()
        assert "\nARG PYTHON_IMAGE=python\n" in text, dockerfile
        froms = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
        assert froms and all(f == "${PYTHON_IMAGE}:${PYTHON_VERSION}-slim-bookworm" for f in froms), froms
