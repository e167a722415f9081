"""Hugging Face model folder reader: config.json, tokenizer.json, sharded *.safetensors.

AWQ / GPTQ 4-bit folders (config.json quantization_config, engine/formats/prequant.py): their linears
are listed under the dense HF name with type "awq-4bit-g128" / "gptq-4bit-g128", weights() yields them
dequantized exactly, and spec.prequant lets `deepinfer export` repack them without re-quantizing."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.formats.prequant import PreQuantReader, parse_config
from engine.formats.spec import ModelSpec
from engine.formats.tokenizer import Tokenizer


def read_hf(path: str | Path) -> ModelSpec:
    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path / 'config.json'} is unreadable ({e})") from e
    archs = raw.get("architectures") or [raw.get("model_type", "?")]
    if raw.get("model_type") != "qwen2" and "Qwen2ForCausalLM" not in archs:
        raise ModelFileError(f"{path.name}: architecture {archs[0]!r} is not supported (only Qwen2 / Qwen2.5)")
    cfg = ModelConfig.from_hf(raw)
    pq = parse_config(raw, str(path / "config.json"))
    if not (path / "tokenizer.json").exists():
        raise ModelFileError(f"{path} has no tokenizer.json")
    tok = Tokenizer.from_file(path / "tokenizer.json", cfg.eos_token_ids)
    cfg.eos_token_ids = tok.eos_token_ids
    template = None
    tc = path / "tokenizer_config.json"
    if tc.exists():
        template = json.loads(tc.read_text(encoding="utf-8")).get("chat_template")
    if (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path} has no *.safetensors weights")
    types, where = {}, {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as s:
                for k in s.keys():
                    types[k], where[k] = str(s.get_slice(k).get_dtype()), f
        except Exception as e:
            raise ModelFileError(f"{f.name} is not a readable safetensors file ({e})") from e
    reader = PreQuantReader(pq, where) if pq else None
    if reader:
        types = {k: t for k, t in types.items() if not reader.owns(k)}
        types.update({n: pq.label for n in reader.linears})
    if cfg.tie_word_embeddings:
        types.pop("lm_head.weight", None)

    def weights():
        for f in files:
            with safe_open(str(f), "pt") as s:
                for k in s.keys():
                    if k in types and not (reader and k in reader.linears):
                        yield k, s.get_tensor(k).float()
        for k in (reader.linears if reader else ()):
            yield k, reader.dense(k)

    spec = ModelSpec(cfg, tok, template, str(path), weights, types, kind="dense")
    spec.prequant = reader  # noqa: attribute on the instance, like read_checkpoint's .checkpoint
    return spec
