"""Least-squares refit of the group scales and mins with the codes fixed (after GPTQ).

GPTQ fixes a group's (scale, min) from the min/max of the weights when the group is reached, then
chooses codes q. Given those codes, the best (scale, min) of every group is a linear least-squares
problem in the metric GPTQ minimizes, the calibration output error tr((W - Wq) H (W - Wq)^T):
for one row w [K] with codes q, Wq = B theta with theta = (s_1..s_G, m_1..m_G) [2G] and
B [K, 2G] (column g: q masked to group g; column G + g: ones on group g), so

    theta = (B^T H B)^-1 B^T H w          (one 2G x 2G system per row; groups couple through H)

Scales and mins are then rounded to fp16 (what the file stores) and a row keeps its old values
unless the rounded new ones give a lower error. The codes and the packed layout are unchanged.
Cost per row: K^2 (H times the G masked code vectors), the same order as one GPTQ pass.
"""
from __future__ import annotations

import torch

from kernels.pack import GROUP


def _excess(A: torch.Tensor, b: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per-row error (w - B theta)^T H (w - B theta) minus its constant w^T H w, = theta^T A theta - 2 theta.b
    (A = B^T H B [R, 2G, 2G], b = B^T H w [R, 2G]; float64 so the comparison of two close errors holds)."""
    t = torch.cat([s, m], 1).double()
    return torch.einsum("ri,rij,rj->r", t, A.double(), t) - 2 * (t * b.double()).sum(1)


@torch.no_grad()
def refit_params(w: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, H: torch.Tensor,
                 damp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float, q uint8 [N, K], scales/mins fp16 [N, K/128], H [K, K] -> refit (scales, mins) fp16."""
    N, K = w.shape
    G = K // GROUP
    dev = H.device
    H = H.to(torch.float64, copy=True)  # float64 throughout: A is as ill-conditioned as H
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    H.diagonal().add_(damp * torch.mean(torch.diag(H)))
    Hb = H.reshape(K, G, GROUP)
    HbT = Hb.permute(1, 0, 2).contiguous()  # [G, K, GROUP]
    H1 = Hb.sum(-1)  # [K, G]: H @ ones_g
    H1g = H1.reshape(G, GROUP, G)  # [g, j, h]: (H ones_h)[group g, j]
    mm = H1g.sum(1)  # [G, G]: ones_g^T H ones_h
    out_s, out_m = scales.clone(), mins.clone()
    step = max(8, (1 << 23) // (K * G))  # rows per chunk: the [R, K, G] float64 temporary stays ~64 MB
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        wc = w[r0:r1].to(dev, torch.float64)
        qc = q[r0:r1].to(dev, torch.float64)
        R = r1 - r0
        qg = qc.reshape(R, G, GROUP)
        HQ = torch.bmm(HbT, qg.permute(1, 2, 0)).reshape(G, G, GROUP, R)  # [h, g, j, r]: H (q masked to h)
        ss = (HQ * qg.permute(1, 2, 0).unsqueeze(0)).sum(2).permute(2, 1, 0)  # [r, g, h]: q_g^T H q_h
        sm = torch.einsum("rgj,gjh->rgh", qg, H1g)  # q_g^T H 1_h
        A = torch.cat([torch.cat([ss, sm], 2), torch.cat([sm.transpose(1, 2), mm.expand(R, G, G)], 2)], 1)
        hw = (wc @ H).reshape(R, G, GROUP)
        b = torch.cat([(qg * hw).sum(-1), hw.sum(-1)], 1)  # B^T H w [R, 2G]
        A0 = A.clone()
        A.diagonal(dim1=1, dim2=2).add_(1e-6 * A.diagonal(dim1=1, dim2=2).abs().mean(-1, keepdim=True) + 1e-12)
        theta, info = torch.linalg.solve_ex(A, b.unsqueeze(-1))
        theta = theta[..., 0]
        s_new, m_new = theta[:, :G].half(), theta[:, G:].half()
        s_old, m_old = scales[r0:r1].to(dev), mins[r0:r1].to(dev)
        ok = (info == 0) & torch.isfinite(theta).all(1) & torch.isfinite(s_new.float()).all(1) \
            & torch.isfinite(m_new.float()).all(1)
        ok &= _excess(A0, b, s_new, m_new) < _excess(A0, b, s_old, m_old)
        out_s[r0:r1] = torch.where(ok.unsqueeze(1), s_new, s_old).cpu()
        out_m[r0:r1] = torch.where(ok.unsqueeze(1), m_new, m_old).cpu()
    return out_s, out_m
