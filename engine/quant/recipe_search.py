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
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from engine.formats.load import load_spec
from engine.model.layout import BIASED, FIELDS, LINEARS, NORMS, LayerWeights
from engine.quant import tune
from engine.quant.calibrate import Calibrator, default_device, digest, recipe_segments
from engine.quant.eval_quality import PPL_TEXT, ROOT, _llm, perplexity
from engine.quant.quantize import dequantize_matrix, quantize_matrix, row_chunk
from engine.quant.recipe import BASELINE, Recipe
from engine.quant.scheme import embed_bits, linear_bits
from kernels import pack

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


def parse_layout(v: str | None):
    """'8g32' -> (8, 32); '16' -> (16, None) (left as is: the fp32 reference); None -> None (the scheme's)."""
    if v is None:
        return None
    b, _, g = v.partition("g")
    return int(b), int(g) if g else None


@torch.no_grad()
def _rtn_rows(w: torch.Tensor, layout: tuple[int, int | None]):
    """Round-to-nearest of w [N, K] in place at (bits, group), in row chunks; bits 16 leaves it as is."""
    bits, group = layout
    if bits == 16:
        return
    for r in range(0, w.shape[0], 8192):
        w[r:r + 8192] = pack.dequantize(*pack.quantize(w[r:r + 8192], bits, group or pack.GROUP))


@torch.no_grad()
def fake_quantize(model, spec, scheme: str, recipe: Recipe, quantizer: str = "gptq", head=None, embed=None,
                  trace: list | None = None, codes: dict | None = None, device: str = "cpu") -> dict:
    """Quantize + dequantize every quantized tensor of `model` in place, as the calibrated export does.
    quantizer "rtn": every linear round-to-nearest (no calibration). head / embed: (bits, group) of the
    lm_head / embedding instead of the scheme's (round-to-nearest unless it is the scheme's own, which the
    recipe quantizes). trace: a list to receive per-layer digests (Calibrator.trace). codes: a dict to receive
    every packed tensor as {module path: (packed dict, bits)} (what tune_in_memory starts from)."""
    codes = {} if codes is None else codes
    cfg = spec.config
    eb = embed_bits(scheme)
    e = model.embed_tokens.weight
    dense_e = e.data.clone() if recipe.asym and quantizer != "rtn" else None  # the dense path's embedding
    if embed is not None:
        _rtn_rows(e.data, embed)
    else:
        d = quantize_matrix(e.data, eb, clip=recipe.embed == "clip")
        dequantize_matrix(d["qweight"], d["scales"], d["mins"], eb, out=e.data)
        codes["embed_tokens"] = (d, eb)
    if quantizer == "rtn":
        for i, L in enumerate(model.layers):
            for m in LINEARS:
                mod = L.get_submodule(m)
                b = linear_bits(scheme, m, i, cfg.num_layers)
                d = quantize_matrix(mod.weight.data, b, clip=False)
                dequantize_matrix(d["qweight"], d["scales"], d["mins"], b, out=mod.weight.data)
                codes[f"layers.{i}.{m}"] = (d, b)
        if model.lm_head is not None:
            _rtn_rows(model.lm_head.weight.data, head or (eb, pack.GROUP))
        return {}
    cal = Calibrator(cfg, recipe_segments(spec, recipe), lambda ids: e.data[ids].float(), device=device,
                     recipe=recipe, dense_rows=None if dense_e is None else lambda ids: dense_e[ids].float())
    cal.trace = trace
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
                codes[f"layers.{i}.{m}"] = (packed, bits[m])
            if "bias" in packed:  # AWQ folds a scale into the v rows' bias
                mods[m].bias.data.copy_(packed["bias"])
        for n, p in norms.items():  # AWQ folds scales into the norm weights
            if n in out:
                p.data.copy_(out[n]["weight"])
        print(f"  layer {i + 1}/{cfg.num_layers}", file=sys.stderr, end="\r", flush=True)
    if model.lm_head is not None and head is not None:
        _rtn_rows(model.lm_head.weight.data, head)
    elif model.lm_head is not None:
        h = model.lm_head.weight
        packed = cal.head(model.norm.weight.data, lambda r0, r1: h.data[r0:r1], cfg.vocab_size, eb)
        dequantize_matrix(packed["qweight"], packed["scales"], packed["mins"], eb, out=h.data)
        codes["lm_head"] = (packed, eb)
    return {"calibration_tokens": cal.tokens}


def tune_in_memory(model, spec, codes: dict, recipe: Recipe, targets, val: int = 0, ppl_every: int = 0,
                   ppl=None) -> dict:
    """End-to-end tuning (engine/quant/tune.py) of every packed tensor's scales/mins in `codes`, then the
    tuned values (fp16-rounded, as a checkpoint stores them) written into the model's weights. ppl_every > 0:
    also after every ppl_every-th epoch, measured by ppl() (-> hist["perplexity_by_epoch"]): one run gives the
    curve over epochs (the Adam state runs on, so epoch e there is the e-epoch recipe)."""
    cfg, device = spec.config, default_device()
    segs = recipe_segments(spec, recipe)
    q = {name: tune.QLinear.from_packed(d, b, _bias(model, name)) for name, (d, b) in codes.items()}
    dense = model.weights()
    layers = [LayerWeights(L.in_norm, L.post_norm, *[q.get(f"layers.{i}.{m}", getattr(L, FIELDS[m]))
                                                     for m in LINEARS]) for i, L in enumerate(dense.layers)]
    embed = q.get("embed_tokens", dense.embed)
    head = q.get("lm_head", embed if model.lm_head is None else dense.lm_head)
    w = tune.on_device(tune.Weights(embed, layers, dense.norm, head), device)
    by_epoch = {}

    def on_epoch(ep, hist):
        if ppl_every and (ep % ppl_every == 0 or ep == recipe.tune):
            _write_tuned(model, q, w if recipe.tune_norms else None)
            by_epoch[str(ep)] = ppl()
            print(f"  after epoch {ep}: ppl {by_epoch[str(ep)]:.4f}", file=sys.stderr, flush=True)

    hist = tune.tune(w, cfg, segs, targets, epochs=recipe.tune, lr=recipe.tune_lr, val=val, on_epoch=on_epoch,
                     norms=recipe.tune_norms, sched=recipe.tune_sched)
    _write_tuned(model, q, w if recipe.tune_norms else None)
    hist["tuned_parameters"] = tune.param_count(w, recipe.tune_norms)
    if by_epoch:
        hist["perplexity_by_epoch"] = by_epoch
    return hist


@torch.no_grad()
def _write_tuned(model, q: dict, w=None):
    """The tuned (fp16-rounded) scales/mins of every QLinear in q, dequantized into the model's weights;
    w: tune's Weights whose tuned norms (fp32, as a checkpoint stores them) go into the model too."""
    if w is not None:
        for L, M in zip(w.layers, model.layers):
            M.input_layernorm.weight.data.copy_(L.in_norm.detach().cpu())
            M.post_attention_layernorm.weight.data.copy_(L.post_norm.detach().cpu())
        model.norm.weight.data.copy_(w.norm.detach().cpu())
    for name, ql in q.items():
        s, m = ql.fp16()
        qc = ql.q.cpu()
        param = model.get_parameter(name + ".weight")
        step = row_chunk(qc.shape[1])  # row chunks: no whole fp32 temporary of a large head
        for r in range(0, qc.shape[0], step):
            param.data[r:r + step] = pack.dequantize(qc[r:r + step], s[r:r + step], m[r:r + step])


def _bias(model, name: str):
    try:
        return model.get_parameter(name + ".bias").data
    except AttributeError:
        return None


def targets_of(model, spec, recipe: Recipe):
    """The dense model's top-k log-probs on the recipe's calibration segments (tune.teacher_targets)."""
    d, device = model.weights(), default_device()
    w = tune.on_device(tune.Weights(d.embed, d.layers, d.norm, d.lm_head), device)
    return tune.teacher_targets(w, spec.config, recipe_segments(spec, recipe), device)


def _codes_path(a, scheme: str, recipe: Recipe) -> Path | None:
    """Where --codes-cache keeps a quantization: keyed by everything but the tuning fields."""
    if not a.codes_cache:
        return None
    fields = {k: v for k, v in recipe.as_dict().items() if not k.startswith("tune")}
    fields.update(tune=0, tune_lr=BASELINE.tune_lr, tune_norms=False)  # the key the cache had before tune_sched
    key = json.dumps([a.model, scheme, a.quantizer, a.head, a.embed, fields], sort_keys=True)
    Path(a.codes_cache).mkdir(parents=True, exist_ok=True)
    return Path(a.codes_cache) / f"{hashlib.sha256(key.encode()).hexdigest()[:12]}.pt"


def _rel(p: Path) -> str:
    """p relative to the repository when it is inside it (the JSON names repo files, not machine paths)."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return p.name


def weights_digest(model) -> str:
    """Digest of every parameter of the (fake-quantized) model: equal digests = bit-identical weights."""
    return digest([p.data for _, p in sorted(model.named_parameters())])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--variants", default="baseline", help="comma list of VARIANTS names or field+field=v")
    ap.add_argument("--schemes", default="w4")
    ap.add_argument("--quantizer", choices=["gptq", "rtn"], default="gptq")
    ap.add_argument("--head", help="lm_head layout instead of the scheme's, e.g. 8g32 (round-to-nearest), 16 (as is)")
    ap.add_argument("--embed", help="embedding layout instead of the scheme's, e.g. 8g32, 16")
    ap.add_argument("--eval-threads", default="", help="also measure perplexity at these thread counts (e.g. 1,2)")
    ap.add_argument("--trace", action="store_true", help="record per-layer digests of inputs, Hessians, outputs")
    ap.add_argument("--tag", default="", help="suffix of the run's key (e.g. @1thread)")
    ap.add_argument("--device", default="cpu", help="where calibration and GPTQ run (cuda: the export's "
                    "default on a GPU machine); perplexity is always measured on the CPU in float32")
    ap.add_argument("--tune-val", type=int, default=0, help="hold out this many calibration segments from "
                    "tuning and report their KL per epoch (a diagnostic: the export tunes on all)")
    ap.add_argument("--ppl-every", type=int, default=0, help="tuned recipes: also measure perplexity after every "
                    "N-th epoch (perplexity_by_epoch: the curve over epochs from one run)")
    ap.add_argument("--codes-cache", help="folder: keep each quantization's packed tensors there and reuse them "
                    "for recipes that differ only in tuning (the tune* fields)")
    ap.add_argument("--ppl-text", default=str(PPL_TEXT), help="the text whose perplexity is measured (default "
                    "tests/data/ppl_text.txt; tests/data/ppl_heldout.txt: a held-out check of choices made on it)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    ppl_text = Path(a.ppl_text)
    recipes = [(v, parse_variant(v)) for v in a.variants.split(",")]  # a bad variant fails before the model loads
    spec = load_spec(a.model)
    ids = [i for i in spec.tokenizer.encode(ppl_text.read_text(encoding="utf-8"))
           if i < spec.config.vocab_size]  # as calibration_ids: a test model's cut vocabulary drops the rest
    llm = _llm(spec, len(ids) + 8, 1)
    llm.runner.private_weights()  # a CPU runner (_llm's device): the weights written below are its own
    model = llm.runner.model
    runs = len(recipes) * len(a.schemes.split(","))
    # the dense weights, to restore between runs; one run needs no copy (the 1.5B's fp32 copy is 6.2 GB: with it a
    # tuned 1.5B run on a 23 GB machine was killed for memory)
    orig = {n: p.data.clone() for n, p in model.named_parameters()} if runs > 1 else None
    out = Path(a.out)
    res = json.loads(out.read_text()) if out.exists() else {
        "model": a.model, "source": Path(spec.source).name, "ppl_text": _rel(ppl_text),
        "ppl_tokens": len(ids), "method": "in-memory calibrated export (engine/quant/recipe_search.py), "
        "perplexity of the dequantized model, float32 CPU", "reference_perplexity": None, "runs": {}}
    if res["reference_perplexity"] is None:
        res["reference_perplexity"] = perplexity(llm, ids)
    threads = torch.get_num_threads()
    targets = {}  # calibration set -> the dense model's top-k log-probs (tuned recipes)
    for v, recipe in recipes:
        for scheme in a.schemes.split(","):
            t0 = time.perf_counter()
            trace = [] if a.trace else None
            codes = {}
            if recipe.tune and (recipe.calib, recipe.self_tokens) not in targets:
                targets[recipe.calib, recipe.self_tokens] = targets_of(model, spec, recipe)
            cached = _codes_path(a, scheme, recipe)
            if cached and cached.exists():  # the same quantization, already done: its packed tensors
                codes, info = torch.load(cached)
                with torch.no_grad():
                    for name, (d, b) in codes.items():
                        dequantize_matrix(d["qweight"], d["scales"], d["mins"], b,
                                          out=model.get_parameter(name + ".weight").data)
            else:
                info = fake_quantize(model, spec, scheme, recipe, a.quantizer, parse_layout(a.head),
                                     parse_layout(a.embed), trace, codes, a.device)
                if cached:
                    torch.save((codes, info), cached)
            if recipe.tune:
                ppl0 = perplexity(llm, ids)
                print(f"  before tuning: ppl {ppl0:.4f}", file=sys.stderr, flush=True)
                info["tune"] = {"perplexity_before": ppl0,
                                **tune_in_memory(model, spec, codes, recipe, targets[recipe.calib, recipe.self_tokens],
                                                 a.tune_val, a.ppl_every, lambda: perplexity(llm, ids))}
            del codes
            secs = round(time.perf_counter() - t0, 1)
            ppl = perplexity(llm, ids)
            by_threads = {}
            for t in [int(x) for x in a.eval_threads.split(",") if x]:
                torch.set_num_threads(t)
                by_threads[str(t)] = perplexity(llm, ids)
            torch.set_num_threads(threads)
            key = f"{scheme}:{a.quantizer if a.quantizer != 'gptq' else v}" + (f"+head={a.head}" if a.head else "") \
                + (f"+embed={a.embed}" if a.embed else "") + a.tag
            res["runs"][key] = {"scheme": scheme, "quantizer": a.quantizer, "recipe": recipe.as_dict(), "device": a.device,
                                "head": a.head or "scheme", "embed": a.embed or "scheme", "perplexity": ppl,
                                "seconds": secs, "threads": threads, "weights_digest": weights_digest(model),
                                **info}
            if by_threads:
                res["runs"][key]["perplexity_by_eval_threads"] = by_threads
            if trace is not None:
                res["runs"][key]["trace"] = trace
            print(f"{key}: ppl {ppl:.4f} (ref {res['reference_perplexity']:.4f}, "
                  f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            with torch.no_grad():
                for n, p in model.named_parameters() if orig is not None else ():
                    p.data.copy_(orig[n])
            cur = json.loads(out.read_text()) if out.exists() else res  # merge with runs written meanwhile
            cur["runs"].update(res["runs"])
            out.write_text(json.dumps(cur, indent=1, ensure_ascii=False))
            res = cur
    return 0


if __name__ == "__main__":
    sys.exit(main())
