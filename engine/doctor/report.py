"""`deepinfer doctor`: can DeepInfer run here, and what to fix if not.

Runs the checks in engine/doctor/checks.py, doctor_models.py and doctor_desktop.py and prints one
line per check, with a one-line fix under each problem. Exit code 1 when the app cannot run at
all (a `fail`: torch missing, no model and no way to get one, Python too old); warnings (no GPU,
port busy, no hotkey backend) exit 0. `--json` prints {"ok", "exit_code", "checks": [...]} for
the tray and tests. Nothing heavy is imported until its check runs.
"""
from __future__ import annotations

import json
import sys
import time

from engine.doctor import checks as dc
from engine.doctor import desktop as dd
from engine.doctor import models as dm
CHECKS = [
    dc.check_python, dc.check_torch, dc.check_cuda, dc.check_gpu, dc.check_cupy, dc.check_triton,
    dc.check_dirs, dm.check_models, dc.check_port,
    dd.check_hotkey, dd.check_clipboard, dd.check_tray,
]
MARK = {"ok": "ok  ", "info": "info", "warn": "WARN", "fail": "FAIL"}


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--port", type=int, default=18000, help="port the endpoint will use (default 18000)")
    p.add_argument("--host", default="127.0.0.1")


def run_checks(host: str = "127.0.0.1", port: int = 18000) -> list[dc.Check]:
    ctx: dict = {}
    out = []
    for fn in CHECKS:
        t0 = time.perf_counter()
        try:
            c = dc.check_port(ctx, host, port) if fn is dc.check_port else fn(ctx)
        except Exception as e:  # a broken check must not hide the others
            c = dc.Check(fn.__name__.removeprefix("check_"), "warn", f"check crashed: {type(e).__name__}: {e}",
                         "report this with the output of `deepinfer doctor --json`")
        c.data["seconds"] = round(time.perf_counter() - t0, 3)
        out.append(c)
    return out


def exit_code(checks: list[dc.Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0


def format_report(checks: list[dc.Check]) -> str:
    lines = ["DeepInfer doctor"]
    for c in checks:
        lines.append(f"  {MARK[c.status]}  {c.name:<9}  {c.summary}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"  {'':4}  {'':<9}  fix: {c.fix}")
    fails = [c.name for c in checks if c.status == "fail"]
    warns = [c.name for c in checks if c.status == "warn"]
    if fails:
        lines.append(f"result: DeepInfer cannot run here ({', '.join(fails)}); apply the fixes above")
    else:
        lines.append("result: ready" + (f" with {len(warns)} warning(s) ({', '.join(warns)})" if warns else ""))
    return "\n".join(lines)


def run(args) -> int:
    checks = run_checks(args.host, args.port)
    code = exit_code(checks)
    if args.json:
        print(json.dumps({"ok": code == 0, "exit_code": code,
                          "checks": [{"name": c.name, "status": c.status, "summary": c.summary, "fix": c.fix,
                                      "data": c.data} for c in checks]}, indent=2, default=str))
    else:
        print(format_report(checks))
    sys.stdout.flush()
    return code
