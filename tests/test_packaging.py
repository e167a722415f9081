"""A non-editable install carries what the code reads at run time: the wheel holds the kernels' CUDA
sources and assets/ (as deepinfer_assets), and engine/trayapp find them from the installed copy."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tracked_copy(dst: Path) -> Path:
    """The tracked files only (an in-tree build/ folder would leak stale files into the wheel)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60).stdout
    for f in filter(None, files.decode().split("\0")):
        if f.split("/")[0] in ("engine", "kernels", "trayapp", "assets") or f in ("pyproject.toml", "setup.py",
                                                                                "README.md", "LICENSE"):
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)
    return dst


def test_wheel_carries_assets_and_kernels(tmp_path):
    src = _tracked_copy(tmp_path / "src")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                        "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    whl = next((tmp_path / "dist").glob("deepinfer-*.whl"))
    names = set(zipfile.ZipFile(whl).namelist())
    for n in ("deepinfer_assets/qwen2_tokenizer.json.gz", "deepinfer_assets/qwen2_chat_template.jinja",
              "deepinfer_assets/templates/default.zh.toml", "deepinfer_assets/icons/tray-ready.png",
              "kernels/decode_attn.cu", "kernels/decode_common.cu", "engine/assets_path.py"):
        assert n in names, n
    assert not any(n.startswith(("tests/", "assets/")) for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    code = ("import engine.assets_path as a, trayapp.config as c\n"
            "p = a.asset('qwen2_tokenizer.json.gz'); t = c._TEMPLATES_DIR\n"
            "assert 'deepinfer_assets' in str(p) and (t / 'default.en.toml').exists(), (p, t)\n"
            "print('OK', a.bundled_chat_template()[:20])\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]
