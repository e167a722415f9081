"""What each GGUF packing (EngineConfig.gguf_pack) costs in bytes, by the memory plan's own arithmetic (no GPU, no
model file): per Qwen2.5 shape with llama.cpp's Q4_K_M types (engine/quant/random_gguf.py q4_k_m_types; and, under
"other_types", files of one type: Q4_0 and Q8_0, uniform_types), the bytes a decode step reads (the linears and the
head; a tied head is the embedding) and the resident weights; and, for the
3B on a 4 GB card (20 SMs, one slot, fit_context as the tray runs it), the context and plan that fit a given free
VRAM (memory_plan.plan_fitting_context).

    python -m engine.bench.gguf_pack_bytes --out docs/results/gguf_pack_bytes.json
"""
from __future__ import annotations

import argparse
import sys

from engine.bench.envinfo import emit_json, environment
from engine.config import GGUF_PACKS, QWEN25_SHAPES, EngineConfig, ModelConfig
from engine.formats.gguf_layout import gguf_weight_types
from engine.quant.random_gguf import q4_k_m_types, uniform_types
from engine.runtime import memory_plan as mp

GIB = 1 << 30


def shape_bytes(shape: str, ftype: str = "q4_k_m") -> dict:
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    types = gguf_weight_types(q4_k_m_types(cfg) if ftype == "q4_k_m" else uniform_types(cfg, ftype.upper()))
    out = {}
    for mode in GGUF_PACKS:
        p = mp.source_weight_parts(cfg, types, mode=mode)
        out[mode] = {"read_per_token_bytes": p["linears"] + (p["lm_head"] or p["embedding"]),
                     "resident_bytes": sum(p.values())}
    return out


def small_card(free_gib: float, sms: int = 20) -> dict:
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    types = gguf_weight_types(q4_k_m_types(cfg))
    out = {}
    for mode in GGUF_PACKS:
        w, e = mp.source_weight_bytes(cfg, types, mode=mode)
        ec = EngineConfig(model="3b", max_context=32768, max_batch=1, fit_context=True)
        _, plan, ctx = mp.plan_fitting_context(cfg, ec, w, e, 32768, (int(free_gib * GIB), 4 * GIB), sms)
        out[mode] = {"weights_gib": round(w / GIB, 3), "max_context": ctx,
                     "prefill_graphs": plan.graph_buckets != (), "plan": repr(plan)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0.5b,3b,7b,14b")
    ap.add_argument("--free-gib", default="3.3,3.6", help="free VRAM of the 4 GB card to plan the 3B for")
    ap.add_argument("--other-types", default="q4_0,q8_0", help="files of one type to count as well")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = {"shapes": {s: shape_bytes(s) for s in a.shapes.split(",")},
           "card_4gb_3b": {f: small_card(float(f)) for f in a.free_gib.split(",")},
           "other_types": {t: {s: shape_bytes(s, t) for s in a.shapes.split(",")}
                           for t in a.other_types.split(",") if t}}
    rows = [("q4_k_m", s, m) for s, m in res["shapes"].items()]
    rows += [(t, s, m) for t, shapes in res["other_types"].items() for s, m in shapes.items()]
    for t, s, modes in rows:
        print(f"{t:<6} {s:<4}", "  ".join(f"{m}: read {v['read_per_token_bytes'] / 1e9:.3f} GB, resident "
                           f"{v['resident_bytes'] / 1e9:.3f} GB" for m, v in modes.items()))
    for f, modes in res["card_4gb_3b"].items():
        print(f"3B, {f} GiB free:", "  ".join(f"{m}: {v['max_context']} tokens"
                                              f"{'' if v['prefill_graphs'] else ' (lean plan)'}"
                                              for m, v in modes.items()))
    res["environment"] = environment()
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
