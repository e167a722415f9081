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

import torch

from engine.errors import BadRequestError, ModelFileError


def add_arguments(p):
    p.add_argument("--source", help="HF folder | file.gguf | ollama:NAME | a pulled model name")
    p.add_argument("--adapter", help="PEFT LoRA adapter folder to merge (adapter_config.json + "
                                     "adapter_model.safetensors)")
    p.add_argument("--scheme", choices=["w4", "w3", "mixed", "fp16"], default="w4")
    p.add_argument("--out", help="output checkpoint folder")
    p.add_argument("--quantizer", choices=["clip", "rtn"], default="clip",
                   help="clip: per-group clipping search (default); rtn: plain min/max round-to-nearest")
    p.add_argument("--verify", metavar="DIR", help="only verify the sha256 of an existing checkpoint")


def run(args) -> int:
    if args.verify:
        from engine.formats.checkpoint import open_checkpoint

        t0 = time.perf_counter()
        ck = open_checkpoint(args.verify, verify="full")
        print(f"{args.verify}: {len(ck.manifest['files'])} files, {ck.nbytes() / 2**30:.3f} GiB, sha256 ok "
              f"({time.perf_counter() - t0:.1f} s)")
        return 0
    if not args.source or not args.out:
        raise BadRequestError("export needs --source and --out", "e.g. deepinfer export --source "
                              "qwen2.5-coder-0.5b --scheme w4 --out ./q05-w4")
    t0 = time.perf_counter()
    man = export(args.source, args.out, args.scheme, adapter=args.adapter, clip=args.quantizer == "clip",
                 progress=sys.stderr)
    size = sum(f["bytes"] for f in man["files"].values())
    print(f"{args.out}: {args.scheme} checkpoint, {man['config']['num_layers']} layers, {size / 2**30:.3f} GiB, "
          f"sha256 verified, {time.perf_counter() - t0:.1f} s")
    return 0


class DenseSource:
    """Per-name access to the dense weights of a spec (readers yield in file order; we need layer order)."""

    def __init__(self, spec):
        path = Path(spec.source)
        self.spec = spec
        if spec.kind == "checkpoint":
            raise BadRequestError("exporting from a DeepInfer checkpoint is not supported",
                                  "export from the original HF / GGUF model")
        if path.is_file():
            from engine.formats.gguf_file import GGUFFile
            from engine.formats.gguf_reader import hf_name

            gf = GGUFFile(path)
            self._gguf = {hf_name(n): t for n, t in gf.tensors.items() if hf_name(n)}
            self.names = set(self._gguf)
        else:
            from safetensors import safe_open

            self._gguf = None
            self._st = {}
            for f in sorted(path.glob("*.safetensors")):
                with safe_open(str(f), "pt") as s:
                    for k in s.keys():
                        self._st[k] = f
            self.names = set(self._st)

    def rows(self, name: str, r0: int, r1: int) -> torch.Tensor:
        """float32 rows [r0, r1) of a 2-D weight."""
        if self._gguf is not None:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import dequantize
            import numpy as np

            t = self._gguf[name]
            arr = dequantize(t.raw()[r0:r1], GGMLQuantizationType(t.ggml_type))
            return torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))
        from safetensors import safe_open

        with safe_open(str(self._st[name]), "pt") as s:
            return s.get_slice(name)[r0:r1].float()

    def get(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise ModelFileError(f"{self.spec.source} lacks tensor {name}", "the model file is incomplete")
        if self._gguf is not None:
            import numpy as np

            return torch.from_numpy(np.array(self._gguf[name].dequantize(), dtype=np.float32, copy=True))
        from safetensors import safe_open

        with safe_open(str(self._st[name]), "pt") as s:
            return s.get_tensor(name).float()


def _quantized(w: torch.Tensor, bits: int, clip: bool) -> dict[str, torch.Tensor]:
    from engine.quant.quantize import quantize_matrix

    if bits == 16:
        return {"weight": w.half()}
    return quantize_matrix(w, bits, clip=clip)


def _embedding(src: DenseSource, name: str, rows: int, bits: int, clip: bool, adapter) -> dict[str, torch.Tensor]:
    """Quantize a [vocab, hidden] matrix in row chunks (never the whole float32 matrix, seed 5.8)."""
    chunk = 8192
    parts = []
    for r in range(0, rows, chunk):
        w = src.rows(name, r, min(rows, r + chunk))
        delta = adapter.delta_rows(name, r, min(rows, r + chunk)) if adapter else None
        if delta is not None:
            w = w + delta
        parts.append(_quantized(w, bits, clip))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def export(source: str, out: str | Path, scheme: str = "w4", adapter: str | None = None, clip: bool = True,
           progress=None, _after_layer=None) -> dict:
    """Write the checkpoint; returns its manifest. `_after_layer(i)` is a test hook (interrupt midway)."""
    from engine.assets_path import bundled_chat_template
    from engine.formats.checkpoint import layer_file, open_checkpoint
    from engine.quant.scheme import LINEARS, check_scheme, embed_bits, linear_bits, policy
    from engine.quant.writer import CheckpointWriter
    from engine.formats.load import load_spec

    check_scheme(scheme)
    spec = load_spec(source)
    cfg = spec.config
    src = DenseSource(spec)
    lora = None
    if adapter:
        from engine.formats.lora import load_adapter
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
    tensors, bits = {}, {}
    for hf, prefix in [("model.embed_tokens.weight", "embed_tokens")] + \
            ([] if cfg.tie_word_embeddings else [("lm_head.weight", "lm_head")]):
        say(f"{prefix} ({cfg.vocab_size} rows, {eb}-bit)")
        for k, v in _embedding(src, hf, cfg.vocab_size, eb, clip, lora).items():
            tensors[f"{prefix}.{k}"], bits[f"{prefix}.{k}"] = v, eb
    w.write_tensors("embed.safetensors", tensors, bits)
    w.write_tensors("norm.safetensors", {"norm.weight": src.get("model.norm.weight")}, {"norm.weight": 32})

    fused = {"self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
             "self_attn.o_proj": ["self_attn.o_proj"], "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
             "mlp.down_proj": ["mlp.down_proj"]}
    for i in range(cfg.num_layers):
        hp, p = f"model.layers.{i}.", f"layers.{i}."
        tensors, bits = {}, {}
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            tensors[p + n], bits[p + n] = src.get(hp + n), 32
        for mod in LINEARS:
            parts = [(lora.apply(hp + m + ".weight", src.get(hp + m + ".weight")) if lora
                      else src.get(hp + m + ".weight")) for m in fused[mod]]
            dense = torch.cat(parts) if len(parts) > 1 else parts[0]
            b = linear_bits(scheme, mod, i, cfg.num_layers)
            for k, v in _quantized(dense, b, clip).items():
                tensors[f"{p}{mod}.{k}"], bits[f"{p}{mod}.{k}"] = v, b
            del parts, dense
        tensors[p + "self_attn.qkv_proj.bias"] = torch.cat([src.get(hp + m + ".bias") for m in fused["self_attn.qkv_proj"]])
        bits[p + "self_attn.qkv_proj.bias"] = 32
        w.write_tensors(layer_file(i), tensors, bits)
        say(f"layer {i + 1}/{cfg.num_layers}")
        if _after_layer:
            _after_layer(i)
    if lora:
        lora.check_all_used()
    extra = {"policy": policy(scheme, cfg.num_layers), "quantizer": "clip" if clip and scheme != "fp16" else
             ("rtn" if scheme != "fp16" else "none"), "source_types": _type_summary(spec.weight_types)}
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
