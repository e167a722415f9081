"""The decode kernels' divisions without the IEEE slow path (decode_common.cu silu_d / norm_div / att_rcp / att_div),
checked bit for bit against the plain `a / b` they replace, over every input where the input is one fp32 value:

| check | inputs | must match |
|---|---|---|
| silu | every finite fp32 g | silu_f(g) == g / (1 + __expf(-g)) (fp32 bits, or both < 2^-100 with one sign), and fp16(silu x up) for 8 ups |
| rstd | every x in {0} + [2^-20, 2^44) x D = 64, 128, .., 8192 | x / D (the deferred norm's mean square) |
| ratio | random a, b in [2^-24, 2^12) (2^34 pairs; --quick 2^30) | a / b (a consumer's rstd_hi / (rstd_lo / 16)) |
| rcp | every fp32 d | 1 / d where |d| is in [2^-126, 2^126) |
| attn | every finite o x 16 dens >= 1 | fp16(o / den) everywhere, o / den unless both are below 2^-100 |

Device: `python -m kernels.div_check --out $OUT/div_check.json` (a few seconds on an H200; `--quick`: the real hidden
sizes, 4 dens, 2^30 pairs: what tests/test_gpu_div.py runs). Prints a table, exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPS = (1.0, -1.0, 65504.0, -65504.0, 0.3337, 2.0 ** -24, -3.0517578125e-05, 1000.5)
DENS = (1.0, 1.0000001, 1.5, 2.0, 3.0, 7.25, 64.0, 100.3, 1000.7, 4095.9, 32767.5, 65536.0,
        1.2345678, 17.01, 333.33, 12345.678)
QUICK_DS = (896, 1536, 2048, 3584, 5120)   # Qwen2.5 0.5B / 1.5B / 3B / 7B / 14B hidden sizes


def run(quick: bool = False, log=print) -> dict:
    import cupy as cp

    src = (HERE / "decode_common.cu").read_text() + "\n" + (HERE / "div_check.cu").read_text()
    arch = f"sm_{cp.cuda.Device().compute_capability}"  # CuPy's "86", "90", "100"
    mod = cp.RawModule(code=src, options=(f"-arch={arch}", "-std=c++17", "-DDECODE_DIV_FAST=7"))
    names = ("silu", "rstd", "ratio", "rcp", "attn")
    cnt = cp.zeros(4 * len(names), dtype=cp.uint64)
    first = cp.full(len(names), 2 ** 64 - 1, dtype=cp.uint64)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    u64 = cp.uint64
    chunk = 1 << 30  # indices per launch (a launch stays well under a watchdog's seconds on small cards)

    def walk(fn, n, ys, args, k):
        for i0 in range(0, n, chunk):
            fn((4 * sms, ys), (256,), (u64(i0), u64(min(chunk, n - i0)), *args, cnt, first, cp.int32(k)))

    t0 = time.time()
    ups = cp.asarray(UPS, dtype=cp.float32)
    walk(mod.get_function("chk_silu"), 1 << 32, 1, (ups, cp.int32(len(UPS))), 0)
    n_x = 1 + (0x55800000 - 0x35800000)  # 0, then every pattern in [2^-20, 2^44)
    ds = QUICK_DS if quick else tuple(range(64, 8193, 64))
    walk(mod.get_function("chk_rstd"), n_x, len(ds), (cp.asarray(ds, dtype=cp.float32),), 1)
    walk(mod.get_function("chk_ratio"), 1 << (30 if quick else 34), 1, (), 2)
    walk(mod.get_function("chk_rcp"), 1 << 32, 1, (), 3)
    dens = DENS[:4] if quick else DENS
    walk(mod.get_function("chk_attn"), 1 << 32, len(dens), (cp.asarray(dens, dtype=cp.float32),), 4)
    cp.cuda.Device().synchronize()
    secs = time.time() - t0
    c, f = cnt.get().reshape(-1, 4), first.get()
    rows = {}
    for k, name in enumerate(names):
        rows[name] = {"inputs": int(c[k, 0]), "fp32_mismatch": int(c[k, 1]), "fp16_mismatch": int(c[k, 2]),
                      "allowed_differences": int(c[k, 3]),
                      "first_mismatch_index": None if f[k] == 2 ** 64 - 1 else int(f[k])}
    log("| check | inputs | fp32 mismatches | fp16 mismatches | allowed differences |")
    log("|---|---|---|---|---|")
    for name, r in rows.items():
        log(f"| {name} | {r['inputs']:,} | {r['fp32_mismatch']} | {r['fp16_mismatch']} | {r['allowed_differences']:,} |")
    ok = all(r["fp32_mismatch"] == 0 and r["fp16_mismatch"] == 0 for r in rows.values())
    log(f"{'all equal' if ok else 'MISMATCH'} in {secs:.1f} s")
    return {"ok": ok, "seconds": secs, "quick": quick, "checks": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args(argv)
    import cupy as cp
    res = run(a.quick)
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "commit": a.commit,
           "command": "python -m kernels.div_check" + (" --quick" if a.quick else ""),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **res}
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
