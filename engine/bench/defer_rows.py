"""Are the deferred rmsnorm's GEMV epilogues row-independent on a GPU? (#17: speculation parted from plain decoding
only with the deferred norm): for each layout the real 0.5B loads and each deferred epilogue (resid with the norm's x
and sums; store / silu scaled by the sums), row b of a B-row launch against a one-row launch, with rows >= B of x, h
and the sums holding garbage that differs per launch (a real step's leftovers). H200, rows >= B zero: 480 rows, 0
differ (docs/hotpath.md). It missed the cause found later (the store epilogue rounded mma column 0 unlike columns
1..3: visible only where y * rs + bias nearly cancels, rare with these random biases); the tests that catch that
set a cancelling bias (kernels/checks.py columns_alike, tests/test_spec_verify.py).

    python -m engine.bench.defer_rows
"""
from __future__ import annotations

import torch

from kernels.checks_gguf import rand_layout
from kernels.decode_kernels import DecodeKernels


def main() -> int:
    kn, dev = DecodeKernels.get("cuda"), torch.device("cuda")
    gen = torch.Generator().manual_seed(3)
    bad, n = [], 0
    forms = [(4, 128, ""), (8, 32, "sym"), (6, 32, "sym"), (6, 16, "kq"), (4, 32, "kq"), (8, 32, "")]
    for bits, group, form in forms:
        for epi, N, K in (("resid", 896, 896), ("resid", 896, 4864), ("store", 1152, 896), ("silu", 9728, 896),
                          ("logits", 151936, 896)):
            if form == "kq" and K % 256:
                K = 1024 if K == 896 else K
            w, _ = rand_layout(N, K, bits, group, gen, dev, bias=epi == "store", form=form)
            x = torch.randn(8, K, generator=gen).half().to(dev)
            h0 = torch.randn(8, N, generator=gen).to(dev)
            nw = (1 + 0.1 * torch.randn(N, generator=gen)).to(dev)
            ss0 = torch.randint(1 << 26, 1 << 30, (2, 8), generator=gen).to(dev)

            def run(rows, B, r0):
                # rows >= B hold another step's leftovers in a real step (a verify step's 8 rows, then one-token
                # steps): garbage here, different in every launch, so a kernel that lets them into rows < B shows
                g2 = torch.Generator().manual_seed(1000 * B + r0)
                xx = torch.randn(8, K, generator=g2).half().to(dev)
                xx[:B] = rows
                ss = torch.randint(1 << 26, 1 << 30, (2, 8), generator=g2).to(dev)
                ss[:, :B] = ss0[:, r0:r0 + B]
                if epi == "resid":
                    h = torch.randn(8, N, generator=g2).to(dev)
                    h[:B] = h0[r0:r0 + B]
                    xn = torch.zeros(8, N, dtype=torch.float16, device=dev)
                    kn.gemv(w, xx, B, "resid", h, norm=(nw, 1e-6, xn), ss=ss)
                    return [h[:B], xn[:B], ss[1, :B]]
                if epi == "logits":
                    out = torch.zeros(8, N, device=dev)
                    keys = torch.zeros(8, dtype=torch.int64, device=dev)
                    kn.gemv(w, xx, B, epi, out, keys, ss=ss, eps=1e-6)
                    return [out[:B], keys[:B]]
                out = torch.zeros(B, N // 2 if epi == "silu" else N, dtype=torch.float16, device=dev)
                kn.gemv(w, xx, B, epi, out, ss=ss, eps=1e-6)
                return [out]

            for B in (2, 3, 7, 8):
                many = run(x[:B], B, 0)
                for b in range(B):
                    one = run(x[b:b + 1], 1, b)
                    n += 1
                    for i, (m, o) in enumerate(zip(many, one)):
                        if not torch.equal(m[b], o[0]):
                            bad.append((bits, group, form, epi, N, K, B, b, ["h", "xn", "ss"][i] if epi == "resid"
                                        else ["out", "keys"][i], float((m[b].double() - o[0].double()).abs().max())))
    torch.cuda.synchronize()
    print(f"{n} rows compared, {len(bad)} differ")
    for r in bad[:25]:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
