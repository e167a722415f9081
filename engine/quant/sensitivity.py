"""Which tensors lose the most when quantized? Perplexity with one group of tensors fake-quantized.

Loads the dense reference once (fp32), then for each variant quantizes + dequantizes only the chosen
tensors in place (same quantizer as export), measures perplexity of tests/data/ppl_text.txt, and
restores them. This is the evidence behind the `mixed` policy (engine/quant/scheme.py).

    python -m engine.quant.sensitivity --model qwen2.5-coder-0.5b --out docs/results/quant_sensitivity_0.5b.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from engine.formats.load import load_spec
from engine.quant.eval_quality import PPL_TEXT, _llm, perplexity
from engine.quant.quantize import dequantize_matrix, quantize_matrix


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    spec = load_spec(a.model)
    ids = spec.tokenizer.encode(PPL_TEXT.read_text(encoding="utf-8"))
    llm = _llm(spec, len(ids) + 8)
    llm.runner.private_weights()  # a CPU runner (_llm's device): the weights written below are its own
    model, L = llm.runner.model, spec.config.num_layers

    def params(sel):
        out = []
        for name, p in model.named_parameters():
            if p.dim() == 2 and sel(name):
                out.append((name, p))
        return out

    def layer_of(n):
        return int(n.split(".")[1]) if n.startswith("layers.") else -1

    variants = {
        "embed+head 4-bit": (lambda n: n.startswith(("embed_tokens", "lm_head")), 4),
        "attention 4-bit": (lambda n: "self_attn" in n, 4),
        "mlp 4-bit": (lambda n: ".mlp." in n, 4),
        "attention 3-bit": (lambda n: "self_attn" in n, 3),
        "mlp 3-bit": (lambda n: ".mlp." in n, 3),
        "mlp 3-bit, first+last layer only": (lambda n: ".mlp." in n and layer_of(n) in (0, L - 1), 3),
        "mlp 3-bit, middle layers only": (lambda n: ".mlp." in n and layer_of(n) not in (0, L - 1), 3),
        "mlp gate_up 3-bit": (lambda n: "gate_up" in n, 3),
        "mlp down 3-bit": (lambda n: "down_proj" in n, 3),
        "embed+head 3-bit": (lambda n: n.startswith(("embed_tokens", "lm_head")), 3),
    }
    t0 = time.perf_counter()
    res = {"model": a.model, "ppl_text": str(PPL_TEXT.name), "ppl_tokens": len(ids),
           "method": "fake-quantize the named tensors only (clip quantizer, group 128), rest float32",
           "reference": perplexity(llm, ids), "variants": {}}
    print(f"reference ppl {res['reference']:.3f}", file=sys.stderr)
    for label, (sel, bits) in variants.items():
        saved = []
        with torch.no_grad():
            for name, p in params(sel):
                saved.append((p, p.data.clone()))
                d = quantize_matrix(p.data, bits)
                dequantize_matrix(d["qweight"], d["scales"], d["mins"], bits, out=p.data)
        res["variants"][label] = perplexity(llm, ids)
        with torch.no_grad():
            for p, orig in saved:
                p.data.copy_(orig)
        print(f"{label}: ppl {res['variants'][label]:.3f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
