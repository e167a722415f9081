"""Before a GGUF loads in a packing other than the bytes (EngineConfig.gguf_pack "6bit" / "kquant"): the kernels
that read its layouts, run on this GPU against their PyTorch references on a small random weight of each layout the
model needs. A layout whose decode GEMV, embedding gather or prefill linear disagrees falls back to "bytes" for the
whole model, with a warning (GPURunner; /health says which packing runs and why): the same weights, more bytes,
never a wrong answer from a kernel no one ran on this architecture (the W6 / KQ / SYM readers were built without
a GPU; an RTX 3050 is sm_86).

    packing_for(mode, layouts, kn, device, prefill) -> (mode that runs, reason or "")
"""
from __future__ import annotations

import logging

import torch

from engine.formats.gguf_layout import REPACK, layout_form

log = logging.getLogger("deepinfer.engine")
TOL = 2e-2  # relative error; fp16 outputs against float32 references sit near 1e-3
_PLAIN = set(REPACK.values())  # the bytes packing's layouts: measured on a GPU, never checked here
_cache: dict[tuple, float] = {}  # (device, layout) -> error, once per process


def new_layouts(layouts: dict) -> list[tuple]:
    """The layouts of a linear_layouts() table that the bytes packing does not use: (bits, group, form) with form
    "", "kq" or "sym" (QWeight.form)."""
    out = set()
    for lay in layouts.values():
        if lay is None:
            continue
        key = (lay[0], lay[1], layout_form(lay))
        if key[2] or key[:2] not in _PLAIN:
            out.add(key)
    return sorted(out)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float().cpu(), ref.float().cpu()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-12))


def layout_error(bits: int, group: int, form: str, kn, device, prefill) -> float:
    """The worst relative error of the decode GEMV (store, 3 tokens), the embedding gather (3 rows) and the prefill
    linear (16 tokens) on a random 64 x 512 weight of the layout, against the references. prefill(x, w) -> y."""
    from kernels.checks_gguf import rand_layout  # random codes, scales, mins (or KQ / SYM forms) + float32 weights
    from kernels.decode_kernels import MAX_TOKENS

    g = torch.Generator().manual_seed(1000 * bits + group + len(form))
    w, wf = rand_layout(64, 512, bits, group, g, device, bias=True, form=form)
    wf = wf.float().cpu()
    x = torch.zeros(MAX_TOKENS, 512, dtype=torch.float16)
    x[:3] = torch.randn(3, 512, generator=g).half()
    y = torch.zeros(3, 64, dtype=torch.float16, device=device)
    kn.gemv(w, x.to(device), 3, "store", y)
    errs = [_rel(y, x[:3].float() @ wf.T + w.bias.float().cpu())]
    tokens = torch.tensor([5, 63, 0] + [0] * (MAX_TOKENS - 3), dtype=torch.int32, device=device)
    h = torch.zeros(MAX_TOKENS, 512, device=device)
    keys = torch.zeros(MAX_TOKENS, dtype=torch.int64, device=device)
    kn.embed(tokens, w, 3, h, keys)
    errs.append(_rel(h[:3], wf[[5, 63, 0]]))
    xp = (torch.randn(16, 512, generator=g) * 0.5).half()
    errs.append(_rel(prefill(xp.to(device), w), xp.float() @ wf.T + w.bias.float().cpu()))
    return max(errs)


def packing_for(mode: str, layouts: dict, kn, device, prefill) -> tuple[str, str]:
    """(the packing to load, why it is not `mode`): `mode` when every new layout it needs passes layout_error,
    else "bytes" and the failures. layouts: engine/formats/gguf_layout.py linear_layouts(cfg, types, mode)."""
    if mode == "bytes":
        return mode, ""
    bad = []
    for key in new_layouts(layouts):
        ck = (str(device), key)
        if ck not in _cache:
            try:
                _cache[ck] = layout_error(*key, kn, device, prefill)
            except Exception as e:  # noqa: BLE001 - a kernel that cannot run is a failed check, not a failed load
                log.warning("GGUF packing %s: the %s kernels failed to run: %s", mode, _name(key), e)
                _cache[ck] = float("inf")
        if not _cache[ck] <= TOL:
            bad.append(f"{_name(key)} error {_cache[ck]:.3g}")
    if not bad:
        return mode, ""
    why = f"--gguf-pack {mode}: the kernels disagree with their references on this GPU ({'; '.join(bad)})"
    log.warning("%s; loading the byte layouts instead (same weights, more memory)", why)
    return "bytes", why


def _name(key: tuple) -> str:
    from kernels.decode_kernels import FORM_TAG
    bits, group, form = key
    return f"w{bits}{FORM_TAG[form]}{group}"
