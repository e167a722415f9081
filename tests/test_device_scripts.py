"""The device scripts (engine/bench/device_*.sh) are what a scarce device call runs: each one parses, and every module,
test file and kernel define it names exists here, so a typo costs no device minutes."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "engine" / "bench").glob("device_*.sh"))
KERNELS = "\n".join(p.read_text() for p in (ROOT / "kernels").glob("*.cu"))


def _module_exists(mod: str) -> bool:
    p = ROOT / mod.replace(".", "/")
    return p.with_suffix(".py").exists() or (p / "__main__.py").exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_device_script_names_only_what_exists(script):
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    mods = [m for m in re.findall(r"python3? -m ([\w.]+)", text) if m not in ("pip", "pytest")]
    assert all(_module_exists(m) for m in mods), [m for m in mods if not _module_exists(m)]
    tests = set(re.findall(r"(tests/test_\w+\.py)", text))
    assert all((ROOT / t).exists() for t in tests), [t for t in tests if not (ROOT / t).exists()]
    defines = set(re.findall(r"-D([A-Z][A-Z0-9_]+)=", text))
    missing = [d for d in defines if not re.search(rf"#\s*(ifndef|if|ifdef|define)\s+{d}\b", KERNELS)]
    assert not missing, missing


def test_the_next_device_calls_are_among_them():
    for name in ("device_bal7b.sh", "device_trace16k.sh"):
        assert ROOT / "engine" / "bench" / name in SCRIPTS
        assert ". engine/bench/device_env.sh" in (ROOT / "engine" / "bench" / name).read_text()
