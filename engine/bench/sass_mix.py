"""Instruction mix of the decode GEMVs in SASS (no GPU needed: nvcc + cuobjdump, e.g. from the PyPI wheels
nvidia-cuda-nvcc / nvidia-cuda-cuobjdump), for a variant define against the default.

    python -m engine.bench.sass_mix --arch sm_90 --define GEMV_LOP3=0 --out docs/results/sass_mix_lop3.json

Per kernel: total SASS instructions and the count of each opcode, with the define and without. This is how the
doubled 4-bit unpack (an AND and an OR per code pair, docs/gpu.md) was found.
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

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
SOURCES = ("decode_common.cu", "decode_norm.cu", "decode_gemv.cu")
INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def mix(arch: str, defines: list[str], names: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        src, cubin = Path(d) / "g.cu", Path(d) / "g.cubin"
        src.write_text("\n".join((KERNELS / s).read_text() for s in SOURCES))
        subprocess.run(["nvcc", f"-arch={arch}", "-std=c++17", "-cubin", *[f"-D{x}" for x in defines], "-o",
                        str(cubin), str(src)], check=True)
        out = {}
        for n in names:
            sass = subprocess.run(["cuobjdump", "-sass", "-fun", n, str(cubin)], check=True, capture_output=True,
                                  text=True).stdout
            ops = collections.Counter(m.group(1) for m in map(INSTR.match, sass.splitlines()) if m)
            out[n] = {"total": sum(ops.values()), "ops": dict(ops.most_common())}
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--define", action="append", default=[], help="NAME=V for the variant (repeatable)")
    ap.add_argument("--kernels", default="gemv_w4_silu,gemv_w4_resid,gemv_w4_store,gemv_w4_logits,gemv_w3_silu")
    ap.add_argument("--out", default="sass_mix.json")
    a = ap.parse_args(argv)
    names = a.kernels.split(",")
    res = {"arch": a.arch, "variant_defines": a.define, "default": mix(a.arch, [], names),
           "variant": mix(a.arch, a.define, names)}
    for n in names:
        d, v = res["default"][n], res["variant"][n]
        print(f"{n:<16} default {d['total']:5d} (LOP3 {d['ops'].get('LOP3', 0):4d}, SHF {d['ops'].get('SHF', 0):4d})"
              f" | variant {v['total']:5d} (LOP3 {v['ops'].get('LOP3', 0):4d}, SHF {v['ops'].get('SHF', 0):4d})")
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
