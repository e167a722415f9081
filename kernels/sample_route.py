"""The route kernels/decode_sample.cu takes to a row's token, step by step in torch (integers in Python / int64), so
that CI checks the kernels' logic (the prefix chosen from the thresholds' sums, the gathered keys' scans, the
histogram's bin ranges for flat rows and the scans across the bins left out, the row-wide threshold search where
neither fits) against the reference's semantics without a GPU. Constants and names
follow the .cu file; tests/test_sample_kernel.py checks it draws the reference's token on every route, and
engine/bench/sample_routes.py counts the routes a real model's rows take."""
from __future__ import annotations

import torch

from kernels.sample_reference import draw_target, masses, top_p_need

D = [1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 14.0, 20.0]  # SMP_D
NT = len(D)
NB = 2048  # SMP_NB


def keys_of(x: torch.Tensor) -> list[int]:
    """K_i = okey(x_i + 0) << 32 | (0xFFFFFFFF - i), as Python ints."""
    u = (x + 0.0).view(torch.int32).long() & 0xFFFFFFFF
    neg = (u & 0x80000000) != 0
    ok = torch.where(neg, (~u) & 0xFFFFFFFF, u | 0x80000000)
    ids = torch.arange(x.numel())
    return [(int(a) << 32) | (0xFFFFFFFF - int(i)) for a, i in zip(ok.tolist(), ids.tolist())]


def _scan(band: list[int], mass_of: dict, base: int, bmass: int, need: int, by_count: bool, jumps=None):
    """smp_scan_band over sorted keys: (key, place, mass through it) of the first element reaching need; jumps
    {place: (count, mass)}: elements left out before the key at that place."""
    c, mm = base, bmass
    last = None
    for i, K in enumerate(band):
        if jumps and i in jumps:
            c += jumps[i][0]
            mm += jumps[i][1]
            if (c if by_count else mm) >= need:
                raise AssertionError("a crossing among the elements left out")
        c += 1
        mm += mass_of[K]
        if (c if by_count else mm) >= need:
            return K, base + i, mm
        last = (K, base + i, mm)
    return last


def _narrow(stats, th, need: int, by_count: bool, lo, lo_c: int, hi, top: bool, hi_c: int, hi_m: int):
    """smp_narrow, one pass of the row-wide searches: stats[t] = (count, mass) at or above threshold th[t] (with the
    hi_c / hi_m above the bracket; th[0] the largest) -> the new (lo, lo_c, hi, top, hi_c, hi_m): the first threshold
    reaching need is the new lower end, the one before it (or the old upper end) the new upper end."""
    qc, qm, prev, prev_top = hi_c, hi_m, hi, top
    for t, (ct, mt) in enumerate(stats):
        if (ct if by_count else mt) >= need:
            return th[t], ct, prev, prev_top, qc, qm
        qc, qm, prev, prev_top = ct, mt, th[t], False
    return lo, lo_c, prev, prev_top, qc, qm


def _marks(hc: list[int], hm: list[int], Z: int, kk: int, tp: bool, p: float, u: float, cap: int):
    """smp_marks: the bin ranges that can hold a crossing, as [(lo, hi, start, offc, offm)], and whether the k-th
    is binned; ([], _) where a crossing lies past the bins or the ranges hold more than cap keys."""
    cP, mP = [0], [0]  # before bin b
    for c, m in zip(hc, hm):
        cP.append(cP[-1] + c)
        mP.append(mP[-1] + m)
    Ct, Mt = cP[-1], mP[-1]

    def find(need, by_count):
        pre = cP if by_count else mP
        return next(b for b in range(NB) if pre[b] < need <= pre[b + 1])

    ranges, kb = [], False
    zlo = zhi = Z
    if kk:
        if Ct >= kk:
            bk = find(kk, True)
            ranges.append((bk, bk))
            zlo, zhi, kb = mP[bk], mP[bk + 1], True
        elif Mt != Z:
            return [], False
    klo, khi = zlo, zhi
    if tp:
        nlo, nhi = top_p_need(p, zlo), top_p_need(p, zhi)
        if nhi > Mt:
            return [], kb
        lo, hi = find(nlo, False), find(nhi, False)
        ranges.append((lo, hi))
        klo, khi = mP[lo], mP[hi + 1]
    dl, dh = draw_target(u, klo) + 1, draw_target(u, khi) + 1
    if dh > Mt:
        return [], kb
    ranges.append((find(dl, False), find(dh, False)))
    merged = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    out, gc, gm = [], 0, 0
    for lo, hi in merged:
        out.append((lo, hi, gc, cP[lo] - gc, mP[lo] - gm))
        gc += cP[hi + 1] - cP[lo]
        gm += mP[hi + 1] - mP[lo]
    return (out if gc <= cap else []), kb


def pick(x: torch.Tensor, T: float, k: int, p: float, u: float, cap: int = 4096, nb: int = NB) -> tuple[int, str]:
    """-> (the drawn id, the route: 'masked', 'fast', 'hist' (the histogram's bin ranges), 'slow' (the row-wide
    search in d) or 'slow, keys' (its key-space finish)); nb=0 leaves the histogram out (the search's routes)."""
    V = x.numel()
    inv = torch.full((1,), 1.0 / T, dtype=torch.float32)
    v = x * inv
    d = v - v.max()
    M = masses(v).tolist()
    K = keys_of(x)
    mass_of = dict(zip(K, M))
    kk = k if 0 < k < V else 0
    tp = p < 1.0
    Z = sum(M)
    if Z == 0:
        return 0xFFFFFFFF - (max(K) & 0xFFFFFFFF), "masked"
    cnt = [int((d >= -Dj).sum()) for Dj in D]
    ms = [sum(m for m, dd in zip(M, d.tolist()) if dd >= -Dj) for Dj in D]
    need = top_p_need(p, Z) if tp else draw_target(u, Z) + 1
    j = -1
    for jj in range(NT):  # smp_choose
        if cnt[jj] > cap:
            break
        if (cnt[jj] >= kk or ms[jj] == Z) if kk else ms[jj] >= need:
            j = jj
            break
    if j >= 0:  # gathered, sorted, scanned
        band = sorted((Ki for Ki, dd in zip(K, d.tolist()) if dd >= -D[j]), reverse=True)
        Zk = Z
        if kk and len(band) >= kk:
            Zk = _scan(band, mass_of, 0, 0, kk, True)[2]
        kept = _scan(band, mass_of, 0, 0, top_p_need(p, Zk), False)[2] if tp else Zk
        Kp = _scan(band, mass_of, 0, 0, draw_target(u, kept) + 1, False)[0]
        return 0xFFFFFFFF - (Kp & 0xFFFFFFFF), "fast"
    if nb:  # smp_hist / smp_marks / smp_compact / smp_pick's gathered ranges
        jh = next((jj for jj in range(NT) if ((cnt[jj] >= kk or ms[jj] == Z) if kk else ms[jj] >= need)), -1)
        live = d[~torch.isnan(d)]
        dlo = max(torch.tensor(-D[jh] if jh >= 0 else -31.0), live.min()).reshape(1)  # float32, as fmaxf
        sc = torch.tensor([float(NB)]) / -dlo if float(dlo) < 0 else torch.zeros(1)
        inb = d >= dlo
        b = torch.clamp((-d[inb]) * sc, max=NB - 1).long().tolist()
        hc, hm = [0] * NB, [0] * NB
        ids = torch.nonzero(inb).flatten().tolist()
        for bi, i in zip(b, ids):
            hc[bi] += 1
            hm[bi] += M[i]
        rg, kb = _marks(hc, hm, Z, kk, tp, p, u, cap)
        if rg:
            band = sorted((K[i] for bi, i in zip(b, ids) if any(lo <= bi <= hi for lo, hi, *_ in rg)), reverse=True)
            jumps, pc, pm = {}, 0, 0
            for lo, hi, start, offc, offm in rg:
                jumps[start] = (offc - pc, offm - pm)
                pc, pm = offc, offm
            Zk = _scan(band, mass_of, 0, 0, kk, True, jumps)[2] if kk and kb else Z
            kept = _scan(band, mass_of, 0, 0, top_p_need(p, Zk), False, jumps)[2] if tp else Zk
            Kp = _scan(band, mass_of, 0, 0, draw_target(u, kept) + 1, False, jumps)[0]
            return 0xFFFFFFFF - (Kp & 0xFFFFFFFF), "hist"
    kmax = max(K)
    kmax = (kmax >> 32 << 32) | 0xFFFFFFFF

    used_keys = []

    def find(need: int, by_count: bool):  # smp_find
        used_keys.append(1)
        lo, hi, top = 0, kmax, True
        hi_c = hi_m = 0
        lo_c = V
        for _ in range(64):
            if lo_c - hi_c <= cap:
                band = sorted((Ki for Ki in K if Ki >= lo and (top or Ki < hi)), reverse=True)
                return _scan(band, mass_of, hi_c, hi_m, need, by_count)
            span = kmax - lo if top else hi - lo
            th = [lo + (span // (NT + 1)) * (NT - jj) for jj in range(NT)]
            inb = [Ki for Ki in K if Ki >= lo and (top or Ki < hi)]
            stats = [(hi_c + sum(1 for Ki in inb if Ki >= th[jj]), hi_m + sum(mass_of[Ki] for Ki in inb if Ki >= th[jj]))
                     for jj in range(NT)]
            lo, lo_c, hi, top, hi_c, hi_m = _narrow(stats, th, need, by_count, lo, lo_c, hi, top, hi_c, hi_m)
        raise AssertionError("no convergence")

    dl = d.tolist()

    def find_d(need: int, by_count: bool):  # smp_find_d: the d-space search from the stats' bracket
        j = 0
        while j < NT and (cnt[j] if by_count else ms[j]) < need:
            j += 1
        if j == NT and by_count:
            return find(need, True)
        top = j == 0
        dhi = 0.0 if top else -D[j - 1]
        dlo = -D[j] if j < NT else -31.0
        hi_c, hi_m = (0, 0) if top else (cnt[j - 1], ms[j - 1])
        lo_c = cnt[j] if j < NT else V + 1
        for _ in range(48):
            inb = [i for i, dd in enumerate(dl) if dd >= dlo and (top or dd < dhi)]
            if lo_c - hi_c <= cap:
                return _scan(sorted((K[i] for i in inb), reverse=True), mass_of, hi_c, hi_m, need, by_count)
            th = [float(torch.tensor(dlo) + (torch.tensor(dhi) - torch.tensor(dlo)) * (NT - t) / (NT + 1))
                  for t in range(NT)]
            old_band = lo_c - hi_c
            lo_c = hi_c + len(inb)
            stats = [(hi_c + sum(1 for i in inb if dl[i] >= th[t]), hi_m + sum(M[i] for i in inb if dl[i] >= th[t]))
                     for t in range(NT)]
            dlo, lo_c, dhi, top, hi_c, hi_m = _narrow(stats, th, need, by_count, dlo, lo_c, dhi, top, hi_c, hi_m)
            if lo_c - hi_c >= old_band and lo_c - hi_c > cap:
                break
        return find(need, by_count)

    Zk = find_d(kk, True)[2] if kk else Z
    kept = find_d(top_p_need(p, Zk), False)[2] if tp else Zk
    Kp = find_d(draw_target(u, kept) + 1, False)[0]
    return 0xFFFFFFFF - (Kp & 0xFFFFFFFF), "slow, keys" if used_keys else "slow"
