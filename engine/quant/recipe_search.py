"""Which calibrated-quantizer recipe (engine/quant/recipe.py) gives the lowest perplexity?

Loads the dense reference (the GGUF dequantized to float32) once, then for every (recipe, scheme)
runs exactly what the calibrated export does — the embedding quantized as the recipe says, every
decoder layer calibrated and quantized on the bundled calibration text (engine/quant/calibrate.py)
on the already-quantized model's hidden states, an untied head calibrated on the final-norm states —
but writes the dequantized weights into the in-memory model instead of a checkpoint, measures
perplexity of tests/data/ppl_text.txt (the text of eval_quality.py), and restores the weights.
The stored values are the checkpoint's (fp16 scales/mins dequantized in float32), so the number
equals the one `eval_quality` reports for the exported checkpoint; only export/verify are skipped.

    python -m engine.quant.recipe_search --model qwen2.5-coder-0.5b --variants baseline,refit1 \
        --schemes w4 --out docs/results/quant_recipes_0.5b.json

Results are merged into --out (several runs, one variant each, can share a file).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from engine.formats.load import load_spec
from engine.model.layout import BIASED, LINEARS, NORMS
from engine.quant.calibrate import Calibrator, calibration_ids
from engine.quant.eval_quality import PPL_TEXT, ROOT, _llm, perplexity
from engine.quant.quantize import dequantize_matrix, quantize_matrix
from engine.quant.recipe import BASELINE, Recipe
from engine.quant.scheme import embed_bits, linear_bits

VARIANTS = {
    "baseline": BASELINE,
    "act_order": BASELINE.but(act_order=True),
    "refit1": BASELINE.but(refit=1),
    "refit2": BASELINE.but(refit=2),
    "act_order+refit2": BASELINE.but(act_order=True, refit=2),
    "embed_clip": BASELINE.but(embed="clip"),
    "damp0.1": BASELINE.but(damp=0.1),
    "damp0.001": BASELINE.but(damp=0.001),
    "awq": BASELINE.but(awq=True),
}


def parse_variant(v: str) -> Recipe:
    """A VARIANTS name, or fields joined by '+': e.g. 'act_order+refit=2+embed=clip'."""
    if v in VARIANTS:
        return VARIANTS[v]
    kw = {}
    for part in v.split("+"):
        k, _, val = part.partition("=")
        typ = type(getattr(BASELINE, k))
        kw[k] = True if not val and typ is bool else (val.lower() in ("1", "true") if typ is bool else typ(val))
    return BASELINE.but(**kw)


@torch.no_grad()
def fake_quantize(model, spec, scheme: str, recipe: Recipe) -> dict:
    """Quantize + dequantize every quantized tensor of `model` in place, as the calibrated export does."""
    cfg = spec.config
    eb = embed_bits(scheme)
    e = model.embed_tokens.weight
    d = quantize_matrix(e.data, eb, clip=recipe.embed == "clip")
    dequantize_matrix(d["qweight"], d["scales"], d["mins"], eb, out=e.data)
    cal = Calibrator(cfg, calibration_ids(spec.tokenizer, vocab=cfg.vocab_size, texts=recipe.calib), lambda ids: e.data[ids].float(),
                     device="cpu", recipe=recipe)
    for i, L in enumerate(model.layers):
        mods = {"self_attn.qkv_proj": L.self_attn.qkv_proj, "self_attn.o_proj": L.self_attn.o_proj,
                "mlp.gate_up_proj": L.mlp.gate_up_proj, "mlp.down_proj": L.mlp.down_proj}
        dense = {m: mods[m].weight.data for m in LINEARS}
        dense.update({f"{m}.bias": mods[m].bias.data for m in BIASED})
        norms = {n: getattr(L, n).weight for n in NORMS}
        dense.update({n: p.data for n, p in norms.items()})
        bits = {m: linear_bits(scheme, m, i, cfg.num_layers) for m in LINEARS}
        out = cal.layer(dense, bits)
        for m, packed in out.items():
            if "qweight" in packed:
                dequantize_matrix(packed["qweight"], packed["scales"], packed["mins"], bits[m], out=mods[m].weight.data)
            if "bias" in packed:  # AWQ folds a scale into the v rows' bias
                mods[m].bias.data.copy_(packed["bias"])
        for n, p in norms.items():  # AWQ folds scales into the norm weights
            if n in out:
                p.data.copy_(out[n]["weight"])
        print(f"  layer {i + 1}/{cfg.num_layers}", file=sys.stderr, end="\r", flush=True)
    if model.lm_head is not None:
        h = model.lm_head.weight
        packed = cal.head(model.norm.weight.data, lambda r0, r1: h.data[r0:r1], cfg.vocab_size, eb)
        dequantize_matrix(packed["qweight"], packed["scales"], packed["mins"], eb, out=h.data)
    return {"calibration_tokens": cal.tokens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--variants", default="baseline", help="comma list of VARIANTS names or field+field=v")
    ap.add_argument("--schemes", default="w4")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    spec = load_spec(a.model)
    ids = spec.tokenizer.encode(PPL_TEXT.read_text(encoding="utf-8"))
    llm = _llm(spec, len(ids) + 8, 1)
    model = llm.runner.model
    orig = {n: p.data.clone() for n, p in model.named_parameters()}
    out = Path(a.out)
    res = json.loads(out.read_text()) if out.exists() else {
        "model": a.model, "source": Path(spec.source).name, "ppl_text": str(PPL_TEXT.relative_to(ROOT)),
        "ppl_tokens": len(ids), "method": "in-memory calibrated export (engine/quant/recipe_search.py), "
        "perplexity of the dequantized model, float32 CPU", "reference_perplexity": None, "runs": {}}
    if res["reference_perplexity"] is None:
        res["reference_perplexity"] = perplexity(llm, ids)
    for v in a.variants.split(","):
        recipe = parse_variant(v)
        for scheme in a.schemes.split(","):
            t0 = time.perf_counter()
            info = fake_quantize(model, spec, scheme, recipe)
            ppl = perplexity(llm, ids)
            res["runs"][f"{scheme}:{v}"] = {"scheme": scheme, "recipe": recipe.as_dict(), "perplexity": ppl,
                                            "seconds": round(time.perf_counter() - t0, 1),
                                            "threads": torch.get_num_threads(), **info}
            print(f"{scheme}:{v}: ppl {ppl:.4f} (ref {res['reference_perplexity']:.4f}, "
                  f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.data.copy_(orig[n])
            cur = json.loads(out.read_text()) if out.exists() else res  # merge with runs written meanwhile
            cur["runs"].update(res["runs"])
            out.write_text(json.dumps(cur, indent=1, ensure_ascii=False))
            res = cur
    return 0


if __name__ == "__main__":
    sys.exit(main())
