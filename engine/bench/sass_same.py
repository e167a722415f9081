"""Is a kernel's machine code the same in two source trees? No GPU needed: each tree's decode sources through NVRTC
(the engine's options, kernels.nvrtc_check) and ptxas into one cubin per arch, then `cuobjdump -sass` per kernel,
compared instruction for instruction (addresses and comments stripped). Same SASS is the same speed, so a change that
leaves the default path's kernels identical needs no device time to show it costs nothing.

    NVRTC_LIB=.../libnvrtc.so.12 PATH=<dir with ptxas and cuobjdump>:$PATH \\
    python -m engine.bench.sass_same --before /tmp/before --after . --arch sm_86,sm_90 --out docs/results/x.json

--before / --after: folders holding kernels/*.cu (e.g. `git archive REV kernels | tar -x -C /tmp/before`).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernels.decode_kernels import SOURCES
from kernels.nvrtc_check import compile_ptx

INS = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def kernels_sass(tree: Path, arch: str, defines: list[str]) -> tuple[dict[str, list[str]], dict[str, float]]:
    """({kernel: [instruction text, ...]}, {"nvrtc_s", "ptxas_s"}: this machine's compile seconds, one thread) of a
    tree's decode module (the one a first start compiles) for arch."""
    src = "\n".join((tree / "kernels" / s).read_text() for s in SOURCES
                    if (tree / "kernels" / s).exists())  # an older tree may lack a newer file
    t0 = time.perf_counter()
    ptx = compile_ptx(src, arch, defines)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        p, cub = Path(d) / "k.ptx", Path(d) / "k.cubin"
        p.write_text(ptx)
        subprocess.run(["ptxas", f"-arch={arch}", "-o", str(cub), str(p)], check=True, capture_output=True)
        t2 = time.perf_counter()
        out = subprocess.run(["cuobjdump", "-sass", str(cub)], check=True, capture_output=True, text=True).stdout
    return parse_sass(out), {"nvrtc_s": round(t1 - t0, 2), "ptxas_s": round(t2 - t1, 2)}


def parse_sass(listing: str) -> dict[str, list[str]]:
    """`cuobjdump -sass` text -> {kernel: [instruction, ...]} without addresses, encodings and comments."""
    res: dict[str, list[str]] = {}
    cur = None
    for ln in listing.splitlines():
        m = re.match(r"\s+Function : (\w+)", ln)
        if m:
            cur = res.setdefault(m.group(1), [])
            continue
        m = INS.match(ln)
        if m and cur is not None:
            cur.append(re.sub(r"\s+", " ", m.group(1)))
    return res


def compare(before: Path, after: Path, arch: str, defines: list[str],
            before_defines: list[str] = ()) -> tuple[dict[str, dict], dict]:
    """({kernel: status}, the two trees' compile seconds); before_defines go to the before tree only (a define checked
    on the device against the tree that makes it the default)."""
    (a, ta), (b, tb) = kernels_sass(before, arch, defines + list(before_defines)), kernels_sass(after, arch, defines)
    rows = {}
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            rows[name] = {"status": "only after" if name in b else "only before"}
            continue
        rows[name] = {"status": "same" if a[name] == b[name] else "differs",
                      "instructions": [len(a[name]), len(b[name])]}
    return rows, {"before": ta, "after": tb}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=".")
    ap.add_argument("--arch", default="sm_86,sm_90")
    ap.add_argument("--define", action="append", default=[])
    ap.add_argument("--before-define", action="append", default=[], help="for the before tree only")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = {"before": a.before, "after": a.after, "defines": a.define, "before_defines": a.before_define,
           "archs": {}, "compile_seconds": {}}
    for arch in a.arch.split(","):
        rows, secs = compare(Path(a.before), Path(a.after), arch, a.define, a.before_define)
        res["archs"][arch], res["compile_seconds"][arch] = rows, secs
        print(f"{arch}: compile seconds (NVRTC, ptxas) before {secs['before']}, after {secs['after']}")
        by = {st: [k for k, r in rows.items() if r["status"] == st] for st in ("same", "differs", "only after",
                                                                            "only before")}
        print(f"{arch}: {len(by['same'])} kernels with the same SASS, {len(by['differs'])} differ, "
              f"{len(by['only after'])} new, {len(by['only before'])} gone")
        for k in by["differs"]:
            print(f"  differs: {k} ({rows[k]['instructions'][0]} -> {rows[k]['instructions'][1]} instructions)")
        for st in ("only after", "only before"):
            if by[st]:
                print(f"  {st}: {', '.join(by[st])}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
