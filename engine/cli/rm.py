"""deepinfer rm NAME: delete a pulled model; refused while a running DeepInfer server uses it.

"Uses" = the server on 127.0.0.1:PORT reports it as its model or resident (GET /health), or as
loaded in GET /v1/models. No server answering means nothing uses it.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from engine.errors import ResourceError
from engine.hub import catalog, ollama_registry


def add_arguments(p):
    p.add_argument("name", help="a name from `deepinfer list`")
    p.add_argument("--port", type=int, default=18000, help="port of a running `deepinfer serve` (default 18000)")


def _get(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # /health answers 503 while a model failed: still a body
        try:
            return json.loads(e.read())
        except ValueError:
            return {}
    except (urllib.error.URLError, OSError, ValueError):
        return {}


def in_use(name: str, port: int) -> bool:
    """Does the DeepInfer server on 127.0.0.1:port hold `name` (its model, resident or loaded)?"""
    base = f"http://127.0.0.1:{port}"
    h = _get(base + "/health")
    used = {h.get("model")} | set(h.get("resident") or [])
    used |= {m.get("id") for m in _get(base + "/v1/models").get("data", []) if m.get("loaded")}
    names = {name}
    if catalog.source(name) == "ollama":
        names.add(ollama_registry.canonical(name))
    where = catalog.resolve(name)
    if where is not None:  # served by path: the server's id is the file's stem or the folder's name
        names |= {where.stem if where.is_file() else where.name}
    return bool(names & {u for u in used if u})


def run(args) -> int:
    if in_use(args.name, args.port):
        raise ResourceError(f"{args.name} is in use by the DeepInfer server on 127.0.0.1:{args.port}",
                            "stop that server (or switch it to another model) and run `deepinfer rm` again")
    for p in catalog.remove(args.name):
        print(f"deleted {p}")
    return 0
