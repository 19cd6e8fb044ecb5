"""The CPU connectors' patch guards, both directions, in vLLM's own environment, where vLLM imports them.

The stage copies the connectors and their guard (eagle3_contract.patch_guard as `eagle3_patch_guard`) alone
into a directory on the server's PYTHONPATH: one vLLM-environment process imports them from that directory as
vLLM does, then once per case with another version of the library, or another source at each place a guard
fingerprints, put in place before the import. The installed library passes; every other case is refused
before the class exists, naming what changed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eagle3_pipeline.serving.kv_transfer import (
    CPU_CONNECTOR_MODULE,
    CPU_MOONCAKE_MODULE,
    PATCH_GUARD_MODULE,
    cpu_connector_env,
)
from tests.pipeline.test_extract_vllm import vllm_python_or_skip

pytestmark = [pytest.mark.pipeline, pytest.mark.vllm]

# Run by vLLM's python with only the copied directory on its path: for each connector module, the installed
# library, then another version, then another source in each place its guard relies on.
SCRIPT = """
import importlib, importlib.metadata, json, sys

def changed(*args, **kwargs):  # another body than the library's
    return None

def attempt(module):
    for name in [m for m in sys.modules if m == module]:
        del sys.modules[name]
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

out = {}
for module in sys.argv[1:]:
    cases = {"installed": attempt(module)}
    guard = sys.modules[module].GUARD
    real = importlib.metadata.version
    importlib.metadata.version = lambda name: "0.0.1" if name == guard.distribution else real(name)
    cases["version"] = attempt(module)
    importlib.metadata.version = real
    for source in guard.sources:
        owner_name, _, qualname = source.name.partition(":")
        *parents, name = qualname.split(".")
        owner = importlib.import_module(owner_name)
        for part in parents:
            owner = getattr(owner, part)
        kept = owner.__dict__[name]
        setattr(owner, name, changed)
        cases[source.name] = attempt(module)
        setattr(owner, name, kept)
    out[module] = {"cases": cases, "guard_module": type(guard).__module__,
                   "sources": [s.name for s in guard.sources], "distribution": guard.distribution}
print(json.dumps(out))
"""


@pytest.mark.vllm
def test_the_cpu_connectors_are_guarded_where_vllm_imports_them(tmp_path: Path) -> None:
    python = vllm_python_or_skip()
    directory = tmp_path / "connectors"
    env = cpu_connector_env(directory, {})
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        f"{m}.py" for m in (CPU_CONNECTOR_MODULE, CPU_MOONCAKE_MODULE, PATCH_GUARD_MODULE)
    ), "the connectors and their guard, alone"
    script = tmp_path / "guards.py"  # a file, so the stand-in's source can be read
    script.write_text(SCRIPT)
    done = subprocess.run(
        [python, str(script), CPU_CONNECTOR_MODULE, CPU_MOONCAKE_MODULE],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env, "PYTHONNOUSERSITE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for module in (CPU_CONNECTOR_MODULE, CPU_MOONCAKE_MODULE):
        report = found[module]
        cases = report["cases"]
        assert report["guard_module"] == PATCH_GUARD_MODULE, "the copy beside it, not the project's package"
        assert cases.pop("installed") is None, f"{module} imports on the vLLM it was verified against"
        version = cases.pop("version")
        assert version is not None and version.startswith("LibraryChanged"), version
        assert "version: expected" in version and "found 0.0.1" in version and module in version
        assert set(cases) == set(report["sources"]) and cases, "one case per fingerprinted source"
        for source, refusal in cases.items():
            assert refusal is not None and refusal.startswith("LibraryChanged"), (source, refusal)
            assert f"{source}: its source changed" in refusal, refusal
            assert "nothing was patched" in refusal
