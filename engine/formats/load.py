"""load_spec: resolve a model argument (pulled name, .gguf file, HF folder, checkpoint folder, ollama:NAME)
to the ModelSpec of the reader that understands it."""
from __future__ import annotations

from pathlib import Path

from engine.errors import ModelFileError
from engine.formats.checkpoint import read_checkpoint
from engine.formats.gguf_reader import read_gguf
from engine.formats.hf_reader import read_hf
from engine.formats.spec import ModelSpec
from engine.hub import catalog, store
from engine.hub.ollama_local import resolve_ollama


def load_spec(model: str) -> ModelSpec:
    """Resolve a model argument: a pulled name (qwen2.5:3b, hf:ORG/REPO, qwen2.5-coder-0.5b), a .gguf file,
    an HF folder, a checkpoint folder or ollama:NAME (a local Ollama store)."""
    if catalog.source(model) is not None:
        path = catalog.resolve(model)
        if path is None:
            raise ModelFileError(f"model {model!r} is not downloaded yet", f"run `deepinfer pull {model}`")
    elif model.startswith("ollama:"):
        path = resolve_ollama(model[len("ollama:"):])
    else:
        path = Path(model).expanduser()
        if not path.exists():
            raise ModelFileError(f"model {model!r} not found (no such file or folder, not a known name)",
                                 f"pass a .gguf file, a model folder, a pulled name (`deepinfer list`) or one of: "
                                 f"{', '.join(store.KNOWN_MODELS)}")
    if path.is_file():
        return read_gguf(path)
    if (path / "manifest.json").exists():
        return read_checkpoint(path)
    if (path / "config.json").exists():
        return read_hf(path)
    raise ModelFileError(f"{path} is neither a GGUF file, an HF model folder (config.json) nor a "
                         "DeepInfer checkpoint (manifest.json)")
