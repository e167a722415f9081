"""`deepinfer export`: a model (HF folder | .gguf | ollama:NAME | pulled name) -> layered quantized checkpoint.

Streams layer by layer: the dense weights of one decoder layer at a time (plus the embedding /
head in row chunks, seed 5.8), optional PEFT LoRA merge (W += B @ A * alpha / r) before fusing
and quantizing, then a full sha256 read-back of everything written.

    deepinfer export --source qwen2.5-coder-0.5b --scheme w4 --out ~/ckpt/q05-w4
    deepinfer export --source ollama:qwen2.5:3b --adapter my-lora/ --scheme mixed --out ~/ckpt/q3b
    deepinfer export --verify ~/ckpt/q05-w4
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize
from safetensors import safe_open

from engine.assets_path import bundled_chat_template
from engine.errors import BadRequestError, ModelFileError
from engine.formats.checkpoint import layer_file, open_checkpoint
from engine.formats.gguf_file import GGUFFile
from engine.formats.gguf_reader import hf_name
from engine.formats.load import load_spec
from engine.formats.lora import load_adapter
from engine.formats.prequant import concat_rows
from engine.model.layout import BIASED, EMBED, FUSED, HEAD, LINEARS, NORM, NORMS
from engine.quant.calibrate import CALIBRATION_TEXTS, Calibrator, calibration_set, recipe_segments
from engine.quant.export_gguf import export_lossless
from engine.quant.quantize import quantize_matrix
from engine.quant.recipe import DEFAULT as RECIPE
from engine.quant.scheme import check_scheme, embed_bits, head_layout, linear_bits, policy
from engine.quant.tune_export import tune_packed
from engine.quant.writer import CheckpointWriter
from kernels import pack
from kernels.pack import GROUP

# Chosen by measured perplexity on the real 0.5B (docs/results/quant_quality_calibrated_0.5b.json).
QUANTIZERS = ("gptq", "rtn", "clip")
DEFAULT_QUANTIZER = "gptq"


def add_arguments(p):
    p.add_argument("--source", help="HF folder | file.gguf | ollama:NAME | a pulled model name")
    p.add_argument("--adapter", help="PEFT LoRA adapter folder to merge (adapter_config.json + "
                                     "adapter_model.safetensors)")
    p.add_argument("--scheme", choices=["w4", "w3", "mixed", "fp16", "lossless"], default="w4",
                   help="lossless: a quantized GGUF's tensors exactly as they are (engine/quant/export_gguf.py)")
    p.add_argument("--out", help="output checkpoint folder")
    p.add_argument("--quantizer", choices=list(QUANTIZERS), default=DEFAULT_QUANTIZER,
                   help="gptq: calibrated error compensation on the bundled calibration text (default, "
                        "best measured perplexity); rtn: plain min/max round-to-nearest; clip: per-group "
                        "clipping search (least weight error, worse perplexity)")
    p.add_argument("--tune-epochs", type=int, default=None, metavar="N",
                   help=f"gptq: epochs of end-to-end scale/min tuning after GPTQ (default {RECIPE.tune}; 0 = off: "
                        "seconds on a GPU, ~3 min an epoch for a 0.5B on 2 CPU cores)")
    p.add_argument("--verify", metavar="DIR", help="only verify the sha256 of an existing checkpoint")


def run(args) -> int:
    if args.verify:
        t0 = time.perf_counter()
        ck = open_checkpoint(args.verify, verify="full")
        print(f"{args.verify}: {len(ck.manifest['files'])} files, {ck.nbytes() / 2**30:.3f} GiB, sha256 ok "
              f"({time.perf_counter() - t0:.1f} s)")
        return 0
    if not args.source or not args.out:
        raise BadRequestError("export needs --source and --out", "e.g. deepinfer export --source "
                              "qwen2.5-coder-0.5b --scheme w4 --out ./q05-w4")
    t0 = time.perf_counter()
    if args.tune_epochs is not None and args.tune_epochs < 0:
        raise BadRequestError(f"--tune-epochs must be >= 0, got {args.tune_epochs}")
    man = export(args.source, args.out, args.scheme, adapter=args.adapter, quantizer=args.quantizer,
                 progress=sys.stderr, tune=args.tune_epochs)
    size = sum(f["bytes"] for f in man["files"].values())
    print(f"{args.out}: {args.scheme} checkpoint, {man['config']['num_layers']} layers, {size / 2**30:.3f} GiB, "
          f"sha256 verified, {time.perf_counter() - t0:.1f} s")
    return 0


class DenseSource:
    """Per-name access to the dense weights of a spec (readers yield in file order; we need layer order)."""

    def __init__(self, spec):
        path = Path(spec.source)
        self.spec = spec
        self.prequant = getattr(spec, "prequant", None)  # AWQ/GPTQ folder: engine/formats/prequant.py
        if spec.kind == "checkpoint":
            raise BadRequestError("exporting from a DeepInfer checkpoint is not supported",
                                  "export from the original HF / GGUF model")
        if path.is_file():
            gf = GGUFFile(path)
            self._gguf = {hf_name(n): t for n, t in gf.tensors.items() if hf_name(n)}
            self.names = set(self._gguf)
        else:
            self._gguf = None
            self._st = {}
            for f in sorted(path.glob("*.safetensors")):
                with safe_open(str(f), "pt") as s:
                    for k in s.keys():
                        self._st[k] = f
            self.names = set(self._st) | set(self.prequant.linears if self.prequant else ())

    def packed(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        """AWQ/GPTQ linears `names` repacked into our W4 layout and fused along rows (no re-quantization);
        None unless all of them are pre-quantized."""

        if not self.prequant or not all(n in self.prequant.linears for n in names):
            return None
        return concat_rows([self.prequant.ours(n) for n in names])

    def rows(self, name: str, r0: int, r1: int) -> torch.Tensor:
        """float32 rows [r0, r1) of a 2-D weight."""
        if self.prequant and name in self.prequant.linears:
            return self.prequant.dense(name)[r0:r1]
        if self._gguf is not None:
            t = self._gguf[name]
            arr = dequantize(t.raw()[r0:r1], GGMLQuantizationType(t.ggml_type))
            return torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))

        with safe_open(str(self._st[name]), "pt") as s:
            return s.get_slice(name)[r0:r1].float()

    def get(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise ModelFileError(f"{self.spec.source} lacks tensor {name}", "the model file is incomplete")
        if self.prequant and name in self.prequant.linears:
            return self.prequant.dense(name)
        if self._gguf is not None:
            return torch.from_numpy(np.array(self._gguf[name].dequantize(), dtype=np.float32, copy=True))

        with safe_open(str(self._st[name]), "pt") as s:
            return s.get_tensor(name).float()


def _quantized(w: torch.Tensor, bits: int, clip: bool, group: int = GROUP) -> dict[str, torch.Tensor]:
    if bits == 16:
        return {"weight": w.half()}
    return quantize_matrix(w, bits, clip=clip, group=group)


def _calibrator(spec, embed: dict[str, torch.Tensor], bits: int, group: int = GROUP, src=None, adapter=None):
    """GPTQ calibration state; the first layer reads the embedding as stored (dequantized). A recipe with
    asymmetric targets also follows the dense model, from the source's own embedding rows (src)."""

    def rows(ids):
        if "embed_tokens.weight" in embed:
            return embed["embed_tokens.weight"][ids].float()
        sc = embed["embed_tokens.scales"]
        return pack.dequantize_rows(embed["embed_tokens.qweight"], sc, embed["embed_tokens.mins"], torch.as_tensor(ids),
                                    sc.shape[1] * group, bits)
    segments = recipe_segments(spec, RECIPE)
    dense = _dense_rows(src, adapter, segments, spec.config.vocab_size) if RECIPE.asym and src else None
    return Calibrator(spec.config, segments, rows, recipe=RECIPE, dense_rows=dense)


def _dense_rows(src, adapter, segments: list[list[int]], vocab: int, chunk: int = 8192):
    """ids -> the source's float32 embedding rows (LoRA merged), for the tokens of `segments`: one pass over
    the embedding in row chunks keeps only the rows those tokens use (never the whole float32 matrix)."""
    need = sorted({i for s in segments for i in s})
    keep = {}
    for r in range(0, vocab, chunk):
        sel = [i for i in need if r <= i < r + chunk]
        if not sel:
            continue
        w = src.rows(EMBED, r, min(vocab, r + chunk))
        delta = adapter.delta_rows(EMBED, r, min(vocab, r + chunk)) if adapter else None
        if delta is not None:
            w = w + delta
        keep.update({i: w[i - r].clone() for i in sel})
    return lambda ids: torch.stack([keep[int(i)] for i in ids])


def _embedding(src: DenseSource, name: str, rows: int, bits: int, clip: bool, adapter,
               group: int = GROUP) -> dict[str, torch.Tensor]:
    """Quantize a [vocab, hidden] matrix in row chunks (never the whole float32 matrix, seed 5.8)."""
    chunk = 8192
    parts = []
    for r in range(0, rows, chunk):
        w = src.rows(name, r, min(rows, r + chunk))
        delta = adapter.delta_rows(name, r, min(rows, r + chunk)) if adapter else None
        if delta is not None:
            w = w + delta
        parts.append(_quantized(w, bits, clip, group))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def export(source: str, out: str | Path, scheme: str = "w4", adapter: str | None = None, clip: bool | None = None,
           progress=None, _after_layer=None, quantizer: str | None = None, tune: int | None = None) -> dict:
    """Write the checkpoint; returns its manifest. quantizer: one of QUANTIZERS (default DEFAULT_QUANTIZER;
    clip=True/False means "clip"/"rtn"). `_after_layer(i)` is a test hook (interrupt midway).
    scheme "lossless": a quantized GGUF as it is (export_gguf.export_lossless; no quantizer, no adapter).
    tune: epochs of end-to-end scale/min tuning after GPTQ (None: the recipe's; 0: none)."""

    if scheme == "lossless":
        if adapter:
            raise BadRequestError("--scheme lossless cannot merge a LoRA adapter (a merged weight has no exact "
                                  "GGUF layout)", "use --scheme w4 with --adapter")
        return export_lossless(source, out, progress)
    check_scheme(scheme)
    if quantizer is None:
        quantizer = DEFAULT_QUANTIZER if clip is None else ("clip" if clip else "rtn")
    if quantizer not in QUANTIZERS:
        raise BadRequestError(f"unknown quantizer {quantizer!r}", f"use one of: {', '.join(QUANTIZERS)}")
    calibrated = quantizer == "gptq" and scheme != "fp16"
    clip = quantizer == "clip"  # every matrix when not calibrated: clip | rtn
    emb_clip = clip or (calibrated and RECIPE.embed == "clip")  # the embedding (and a tied head)
    spec = load_spec(source)
    cfg = spec.config
    src = DenseSource(spec)
    lora = None
    if adapter:
        lora = load_adapter(adapter)
    w = CheckpointWriter(out)
    tok_file = Path(spec.source) / "tokenizer.json"
    w.write_text("tokenizer.json", tok_file.read_text(encoding="utf-8") if tok_file.is_file()
                 else spec.tokenizer.tok.to_str())
    w.write_text("chat_template.jinja", spec.chat_template or bundled_chat_template())
    t0 = time.perf_counter()

    def say(msg):
        if progress:
            progress.write(f"\rexport {scheme}: {msg} ({time.perf_counter() - t0:.0f} s)   ")
            progress.flush()

    eb = embed_bits(scheme)
    hb, hg = head_layout(scheme)  # a tied embedding is the head: it takes the head's layout
    layout = {"embed_tokens": (hb, hg) if cfg.tie_word_embeddings else (eb, GROUP), "lm_head": (hb, hg)}
    emb, emb_bits, emb_groups = {}, {}, {}
    # GPTQ on the final hidden states (our 4-bit g128 head); any other head layout is round-to-nearest
    head_later = calibrated and not cfg.tie_word_embeddings and not lora and (hb, hg) == (eb, GROUP)
    for hf, prefix in [(EMBED, "embed_tokens")] + ([] if cfg.tie_word_embeddings or head_later
                                                    else [(HEAD, "lm_head")]):
        b, g = layout[prefix]
        say(f"{prefix} ({cfg.vocab_size} rows, {b}-bit, group {g})")
        for k, v in _embedding(src, hf, cfg.vocab_size, b, emb_clip, lora, g).items():
            emb[f"{prefix}.{k}"], emb_bits[f"{prefix}.{k}"] = v, b
            if g != GROUP and b != 16:
                emb_groups[f"{prefix}.{k}"] = g
    cal = _calibrator(spec, emb, *layout["embed_tokens"], src=src, adapter=lora) if calibrated else None
    recipe = RECIPE if tune is None else RECIPE.but(tune=tune)
    tuned = cal is not None and recipe.tune > 0 and not lora  # engine/quant/tune_export.py: layers held until tuned
    held: list[tuple[dict, dict]] = []
    frozen: set[tuple[int, str]] = set()  # linears an AWQ/GPTQ source gave packed: imported exactly, never tuned
    final = {"norm.weight": src.get(NORM)}  # written after the layers (tuning may fit it: tune_norms)

    for i in range(cfg.num_layers):
        hp, p = f"model.layers.{i}.", f"layers.{i}."
        tensors, bits = {}, {}
        for n in NORMS:
            tensors[f"{p}{n}.weight"], bits[f"{p}{n}.weight"] = src.get(f"{hp}{n}.weight"), 32
        for mod in BIASED:
            tensors[f"{p}{mod}.bias"] = torch.cat([src.get(f"{hp}{m}.bias") for m in FUSED[mod]])
            bits[f"{p}{mod}.bias"] = 32
        dense, fixed = {}, {}  # calibrated: the whole layer at once (its forward needs every linear)
        for mod in LINEARS:
            b = linear_bits(scheme, mod, i, cfg.num_layers)
            pre = src.packed([hp + m + ".weight" for m in FUSED[mod]]) if b == 4 and not lora else None
            if pre is not None:  # AWQ/GPTQ source: repacked as is
                fixed[mod] = pre
                frozen.add((i, mod))
                for k, v in pre.items():
                    tensors[f"{p}{mod}.{k}"], bits[f"{p}{mod}.{k}"] = v, b
                if cal is None:
                    continue
            parts = [(lora.apply(hp + m + ".weight", src.get(hp + m + ".weight")) if lora
                      else src.get(hp + m + ".weight")) for m in FUSED[mod]]
            dense[mod] = torch.cat(parts) if len(parts) > 1 else parts[0]
            del parts
            if cal is None:
                for k, v in _quantized(dense.pop(mod), b, clip).items():
                    tensors[f"{p}{mod}.{k}"], bits[f"{p}{mod}.{k}"] = v, b
        if cal is not None:  # GPTQ on this layer's calibration inputs; advances the hidden states
            lbits = {mod: linear_bits(scheme, mod, i, cfg.num_layers) for mod in LINEARS}
            dense.update({f"{mod}.bias": tensors[f"{p}{mod}.bias"] for mod in BIASED})
            dense.update({n: tensors[f"{p}{n}.weight"] for n in NORMS})
            for mod, packed in cal.layer(dense, lbits, fixed).items():
                for k, v in packed.items():  # AWQ scales folded into a norm or the qkv bias: fp32 as always
                    tensors[f"{p}{mod}.{k}"] = v
                    bits[f"{p}{mod}.{k}"] = 32 if mod in NORMS or k == "bias" else lbits[mod]
        del dense
        if tuned:
            held.append((tensors, bits))
        else:
            w.write_tensors(layer_file(i), tensors, bits)
        say(f"layer {i + 1}/{cfg.num_layers}")
        if _after_layer:
            _after_layer(i)
    if head_later:
        say(f"lm_head ({cfg.vocab_size} rows, {eb}-bit, calibrated)")
        for k, v in cal.head(src.get(NORM), lambda r0, r1: src.rows(HEAD, r0, r1), cfg.vocab_size, eb).items():
            emb[f"lm_head.{k}"], emb_bits[f"lm_head.{k}"] = v, eb
    tune_log = None
    if tuned:
        say(f"tuning scales/mins end to end ({recipe.tune} epochs)")
        tune_log = tune_packed(spec, src, held, emb, emb_bits, emb_groups, recipe, cal.device, frozen, final=final)
        for i, (tensors, bits) in enumerate(held):
            w.write_tensors(layer_file(i), tensors, bits)
        held.clear()
    w.write_tensors("norm.safetensors", final, {"norm.weight": 32})
    w.write_tensors("embed.safetensors", emb, emb_bits, emb_groups)
    if lora:
        lora.check_all_used()
    extra = {"policy": policy(scheme, cfg.num_layers), "quantizer": quantizer if scheme != "fp16" else "none",
             "source_types": _type_summary(spec.weight_types)}
    if cal is not None:
        cal_set = calibration_set(spec, RECIPE)
        extra["calibration"] = {"text": [f"assets/{t}" for t in CALIBRATION_TEXTS[cal_set]],
                                "set": cal_set, "tokens": cal.tokens, "method": "gptq",
                                "damp": RECIPE.damp, "act_order": RECIPE.act_order, "refit": RECIPE.refit,
                                "awq": RECIPE.awq, "group_size": 128, "device": cal.device,
                                "embedding": RECIPE.embed, "asym": RECIPE.asym,
                                "tune": {"epochs": tune_log["epochs"], "lr": RECIPE.tune_lr,
                                         "kl_train": tune_log["kl_train"], "norms": RECIPE.tune_norms,
                                         "sched": RECIPE.tune_sched}
                                if tune_log else None}
    if lora:
        extra["adapter"] = {"path": str(lora.path), "r": lora.config.get("r"), "lora_alpha": lora.config.get("lora_alpha"),
                            "targets": len(lora.targets)}
    man = w.finish(cfg, scheme, spec.source, extra)
    say("verifying")
    open_checkpoint(out, verify="full")  # read everything back from disk
    if progress:
        progress.write("\n")
    return man


def _type_summary(types: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in types.values():
        out[t] = out.get(t, 0) + 1
    return out
