"""Instruction mix of the decode GEMVs in SASS, no GPU needed: NVRTC -> PTX (kernels.nvrtc_check, the options the
engine uses), ptxas -> cubin, cuobjdump -sass (the PyPI wheels nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvcc and
nvidia-cuda-cuobjdump + nvidia-cuda-nvdisasm carry them). Compares source trees and/or defines:

    NVRTC_LIB=.../libnvrtc.so.12 PATH=<dir with ptxas, cuobjdump, nvdisasm>:$PATH \\
    python -m engine.bench.sass_mix --arch sm_90 --tree before=/tmp/before --tree after=. \\
        [--variant unpack1=GEMV_UNPACK2=0] --out docs/results/sass_mix_isa_sm90.json

Per kernel and case: total SASS instructions, the K loop's (the first backward branch's span: the register
pipeline's two groups), registers, and the loop's opcodes. This is how the doubled 4-bit unpack (an AND and an OR per
code pair) and the 64-bit address arithmetic of every load (docs/gpu.md) were found.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels.decode_kernels import SOURCES
from kernels.nvrtc_check import compile_ptx
from kernels.q8_kernels import SOURCES as Q8_SOURCES
from kernels.q8_plan import q8_kernel

LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)$")
REGS = re.compile(r"Compiling entry function '(\w+)'|Used (\d+) registers")


def parse(sass: str, kloop_after: int = 0) -> dict:
    """{'total', 'loop', 'loop_ops', 'loops'} of one kernel's SASS listing: 'loop' is the K loop, the span of the
    first backward branch after `kloop_after` others (the q8 kernels' first loop is the block's quantization of x,
    decode_q8dot.cu q8_quant_cta: kloop_after=1; the gemv_w4q8b_* kernels' second its loop over tokens: 2); 'loops' the span of every backward branch, in order."""
    ins = []
    for ln in sass.splitlines():
        m = LINE.match(ln)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    spans = []
    for addr, op, rest in ins:
        b = re.search(r"(0x[0-9a-f]+)", rest) if op == "BRA" else None
        if b and int(b.group(1), 16) < addr:  # a backward branch closes a loop
            lo = int(b.group(1), 16)
            spans.append([o for a, o, _ in ins if lo <= a <= addr])
    loop = spans[kloop_after] if len(spans) > kloop_after else []
    base = collections.Counter(o.split(".")[0] for o in loop)
    return {"total": len(ins), "loop": len(loop), "loop_ops": dict(base.most_common()),
            "loops": [len(sp) for sp in spans]}


def mix(tree: Path, arch: str, defines: list[str], names: list[str]) -> dict:
    """Every kernel of names from the main module, and those of the q8 probe's module (gemv_q8*, q8_*) from it."""
    q8 = [n for n in names if n.startswith(("gemv_q8", "q8_"))]
    out = {}
    if q8:
        out.update(_mix(tree, arch, defines, q8, Q8_SOURCES))
    rest = [n for n in names if n not in q8]
    if rest:  # the step's q8 GEMVs (gemv_w4q8_*) in the main module with GEMV_Q8=1 (decode_gemv.cu)
        extra = ["GEMV_Q8=1"] if any(q8_kernel(n) for n in rest) else []
        out.update(_mix(tree, arch, [*defines, *extra], rest, SOURCES))
    return out


def _mix(tree: Path, arch: str, defines: list[str], names: list[str], sources) -> dict:
    src = "\n".join((tree / "kernels" / s).read_text() for s in sources)
    ptx = compile_ptx(src, arch, defines)
    with tempfile.TemporaryDirectory() as d:
        p, cubin = Path(d) / "g.ptx", Path(d) / "g.cubin"
        p.write_text(ptx)
        r = subprocess.run(["ptxas", f"-arch={arch}", "-v", "-o", str(cubin), str(p)], check=True,
                           capture_output=True, text=True)
        regs, cur = {}, None
        for m in REGS.finditer(r.stderr):
            if m.group(1):
                cur = m.group(1)
            elif cur:
                regs[cur] = int(m.group(2))
        out = {}
        for n in names:
            sass = subprocess.run(["cuobjdump", "-sass", "-fun", n, str(cubin)], check=True, capture_output=True,
                                  text=True).stdout
            skip = {8: 2, 1: 1}.get(q8_kernel(n), 0)  # loops before the K loop (the quantization; its token loop)
            out[n] = {**parse(sass, skip), "registers": regs.get(n)}
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR, a checkout whose kernels/ to compile")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=DEF[+DEF] defines on the last tree (e.g. unpack1=GEMV_UNPACK2=0)")
    ap.add_argument("--kernels", default="gemv_w4_silu,gemv_w4_resid,gemv_w4_store,gemv_w4_logits,gemv_w3_silu,"
                                         "gemv_w3_resid,gemv_w4g32_silu")
    ap.add_argument("--out", default="", help="write the JSON here (default: print the table only)")
    a = ap.parse_args(argv)
    names = a.kernels.split(",")
    trees = [t.split("=", 1) for t in a.tree] or [["this", "."]]  # "." = this checkout (no machine path in the JSON)
    root = Path(__file__).resolve().parents[2]
    cases = [(n, root / d, []) for n, d in trees]
    for v in a.variant:
        n, defs = v.split("=", 1)
        cases.append((n, cases[-1][1], defs.split("+")))
    given = dict(trees)
    res = {"arch": a.arch, "cases": {n: {"tree": given.get(n, given[trees[-1][0]]), "defines": defs}
                                     for n, _, defs in cases},
           "kernels": {}}
    for n, d, defs in cases:
        for k, v in mix(d, a.arch, defs, names).items():
            res["kernels"].setdefault(k, {})[n] = v
    print("| kernel | " + " | ".join(f"{n}: total / loop (regs)" for n, _, _ in cases) + " |")
    for k in names:
        row = res["kernels"][k]
        print(f"| {k} | " + " | ".join(f"{row[n]['total']} / {row[n]['loop']} ({row[n]['registers']})"
                                       for n, _, _ in cases) + " |")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
