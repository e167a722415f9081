"""The attention checks of kernels/checks.py (attention_checks) with every row printed in full: each extra (the
merge launch's and grid merge's bits against the default launch's, the cache, the counters) and, for a failing row,
where each launch's output differs from the first plain launch's, per token row (device; a diagnostic for when
test_decode_kernels_match_references fails on a build: it found the ring kernels' wrong rows, docs/gpu.md).

    DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1 python -m engine.bench.attn_bits
"""
from __future__ import annotations

import torch

from kernels import checks
from kernels.decode_kernels import DecodeKernels


def main() -> int:
    kn, dev = DecodeKernels.get(), torch.device("cuda")
    gen = torch.Generator().manual_seed(1234)
    rows: list[dict] = []
    check = checks.recorder(rows, lambda *a: None)  # the checks' own verdict (ok) per row
    orig = kn.attention
    outs = []

    def spy(*a, **k):  # each launch's keyword arguments and output, so differing rows can be named
        orig(*a, **k)
        outs.append((k, a[12].clone(), a[4].tolist(), a[7]))

    kn.attention = spy

    def rec(name, shape, err, extra=None):
        check(name, shape, err, extra)
        ok = rows[-1]["ok"]
        print(f"{'ok ' if ok else 'BAD'} {name} {shape} rel_err {err:.2e} {extra}")
        if not ok:
            base = next(o for o in outs if not o[0])
            for kw, out, pos, B in outs:
                d = (out[:B].float() - base[1][:B].float()).abs()
                rows = [(b, pos[b] + 1, int((d[b] > 0).sum()), float(d[b].max())) for b in range(B)]
                print(f"    {kw or 'plain'}: (row, L, differing values, max diff) {rows}")
        outs.clear()

    checks.attention_checks(kn, rec, gen, dev)
    bad = sum(not r["ok"] for r in rows)
    print(f"{bad} bad rows")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
