"""engine/desktop/install_plan.py and the installer scripts agree: wheel choice, paths, steps, PowerShell syntax."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.desktop import install_plan as ip
ROOT = Path(__file__).resolve().parents[1]
SH = ROOT / "installer/linux/install.sh"
SH_UN = ROOT / "installer/linux/uninstall.sh"
PS = ROOT / "installer/windows/install.ps1"
PS_UN = ROOT / "installer/windows/uninstall.ps1"

SMI_124 = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.14              Driver Version: 550.54.14      CUDA Version: 12.4     |
|   0  NVIDIA GeForce RTX 3050 ...    Off |   00000000:01:00.0 Off |                  N/A |"""


@pytest.mark.parametrize("drv,variant,cupy", [
    ((13, 1), "cu130", "cupy-cuda13x"), ((13, 0), "cu130", "cupy-cuda13x"), ((12, 9), "cu128", "cupy-cuda12x"),
    ((12, 8), "cu128", "cupy-cuda12x"), ((12, 6), "cu126", "cupy-cuda12x"), ((12, 4), "cu126", "cupy-cuda12x"),
    ((11, 8), "cpu", ""), (None, "cpu", ""),
])
def test_torch_choice_follows_driver_cuda(drv, variant, cupy):
    c = ip.choose_torch(drv)
    assert (c.variant, c.cupy, c.spec) == (variant, cupy, f"torch=={ip.TORCH_VERSION}")
    assert c.index_url == f"https://download.pytorch.org/whl/{variant}"
    if drv == (12, 4) or drv == (11, 8) or drv is None:
        assert c.note  # the user is told why
    assert ip.choose_torch(drv, cpu=True).variant == "cpu"


def test_parse_nvidia_smi():
    assert ip.parse_driver_cuda(SMI_124) == (12, 4)
    assert ip.parse_driver_cuda("NVIDIA-SMI has failed because it couldn't communicate with the driver") is None
    assert ip.parse_driver_cuda("") is None


def test_plan_script_reads_nvidia_smi_on_path(tmp_path):
    """What the installers run: `python install_plan.py torch`, with a fake nvidia-smi (the OS edge)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + SMI_124 + "\nEOF\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run([sys.executable, str(ROOT / "engine/desktop/install_plan.py"), "torch"], env=env,
                         capture_output=True, text=True, check=True).stdout
    kv = dict(line.split("=", 1) for line in out.splitlines())
    assert kv["variant"] == "cu126" and kv["cupy"] == "cupy-cuda12x" and kv["driver_cuda"] == "12.4"
    out = subprocess.run([sys.executable, str(ROOT / "engine/desktop/install_plan.py"), "torch", "--cpu"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "variant=cpu\n" in out and "cupy=\n" in out


def test_locations_per_os():
    win = {"LOCALAPPDATA": r"C:\Users\ann\AppData\Local", "APPDATA": r"C:\Users\ann\AppData\Roaming"}
    assert ip.install_prefix("windows", win) == r"C:\Users\ann\AppData\Local\DeepInfer"
    assert ip.venv_exe("windows", ip.install_prefix("windows", win)) == \
        r"C:\Users\ann\AppData\Local\DeepInfer\venv\Scripts\deepinfer.exe"
    assert ip.shortcut_path("windows", win).endswith(r"Roaming\Microsoft\Windows\Start Menu\Programs\DeepInfer.lnk")
    assert ip.autostart_path("windows", win).endswith(r"Start Menu\Programs\Startup\DeepInfer.lnk")
    assert ip.install_prefix("linux", {}, "/home/ann") == "/home/ann/.local/share/deepinfer"
    assert ip.install_prefix("linux", {"XDG_DATA_HOME": "/x"}, "/home/ann") == "/x/deepinfer"
    assert ip.shortcut_path("linux", {}, "/home/ann") == "/home/ann/.local/share/applications/deepinfer.desktop"
    assert ip.autostart_path("linux", {"XDG_CONFIG_HOME": "/c"}, "/h") == "/c/autostart/deepinfer.desktop"
    assert ip.autostart_path("macos", {}, "/Users/ann") == "/Users/ann/Library/LaunchAgents/com.deepinfer.tray.plist"
    assert ip.launcher_path("linux", {}, "/home/ann") == "/home/ann/.local/bin/deepinfer"


def test_model_command(tmp_path):
    hf = tmp_path / "Qwen2.5-3B-Instruct"
    hf.mkdir()
    md = str(tmp_path / "models")
    assert ip.model_command("") == ["pull", "qwen2.5-coder-0.5b"]
    assert ip.model_command("qwen2.5-coder-1.5b") == ["pull", "qwen2.5-coder-1.5b"]
    assert ip.model_command("none") == []
    assert ip.model_command("ollama:qwen2.5:3b", md) == [
        "export", "--source", "ollama:qwen2.5:3b", "--scheme", "w4", "--out", str(Path(md) / "qwen2.5-3b-w4")]
    assert ip.model_command(str(hf), md)[-1] == str(Path(md) / "qwen2.5-3b-instruct-w4")
    out = subprocess.run([sys.executable, "-m", "engine.desktop.install_plan", "model-cmd", "ollama:qwen2.5:3b",
                          "--models-dir", md], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.splitlines()[:3] == ["export", "--source", "ollama:qwen2.5:3b"]


def test_model_command_matches_export_cli():
    """The flags the installers pass exist in `deepinfer export`."""
    from engine.cli.main import build_parser

    argv = ip.model_command("ollama:qwen2.5:3b", "/m")
    args = build_parser(["export"]).parse_args(argv)
    assert (args.source, args.scheme, args.out) == ("ollama:qwen2.5:3b", "w4", str(Path("/m/qwen2.5-3b-w4")))


def _steps(text: str) -> list[str]:
    return re.findall(r"^\s*# step: (\w+)", text, flags=re.M)


def test_scripts_run_the_planned_steps_in_order():
    assert _steps(SH.read_text()) == ip.STEPS["linux"]
    assert _steps(SH_UN.read_text()) == ip.UNINSTALL_STEPS["linux"]
    assert _steps(PS.read_text(encoding="utf-8-sig")) == ip.STEPS["windows"]
    assert _steps(PS_UN.read_text(encoding="utf-8-sig")) == ip.UNINSTALL_STEPS["windows"]
    ps = PS.read_text(encoding="utf-8-sig")
    for needle in ("install_plan.py", "nvidia-smi", r"Start Menu\Programs", "autostart enable", "WScript.Shell",
                   "engine.desktop.install_plan model-cmd", '"--cpu"', "LOCALAPPDATA"):
        assert needle in ps, needle
    for path in (SH, SH_UN):
        subprocess.run(["bash", "-n", str(path)], check=True)


def _ps_errors(src: bytes) -> list[str]:
    ts = pytest.importorskip("tree_sitter")
    tsp = pytest.importorskip("tree_sitter_powershell")
    tree = ts.Parser(ts.Language(tsp.language())).parse(src)
    errs = []

    def walk(n):
        if n.type == "ERROR" or n.is_missing:
            errs.append(f"{n.type} at line {n.start_point[0] + 1}: {src[n.start_byte:n.end_byte][:60]!r}")
        for c in n.children:
            walk(c)
    walk(tree.root_node)
    return errs


@pytest.mark.parametrize("path", [PS, PS_UN], ids=["install.ps1", "uninstall.ps1"])
def test_powershell_scripts_are_utf8_bom_and_parse(path):
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf"), "PowerShell 5.1 needs UTF-8 with BOM (seed 5.16)"
    text = raw[3:].decode("utf-8")  # strict: valid UTF-8
    assert any(ord(c) > 127 for c in text)  # the non-ASCII text the BOM exists for
    # brackets balance outside strings/comments (cheap check that needs no parser)
    # one left-to-right pass: block comments, line comments, "strings" (` escapes), 'strings'
    clean = re.sub(r'<#.*?#>|#[^\n]*|"(?:`.|[^"`])*"|\'[^\']*\'', "", text, flags=re.S)
    for o, c in ("{}", "()", "[]"):
        assert clean.count(o) == clean.count(c), (path.name, o)
    assert _ps_errors(raw[3:]) == []
    broken = raw[3:].replace(b"if ($Purge) {", b"if ($Purge) ").replace(b"if ($Autostart) {", b"if ($Autostart) ")
    assert _ps_errors(broken), "the parser must catch a missing brace"
