"""deepinfer serve: the OpenAI-compatible endpoint (default http://127.0.0.1:18000/v1)."""
from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

from engine.config import DEFAULT_CHAT_MODEL, EngineConfig, add_gpu_memory_arguments, gpu_memory_kwargs
from engine.errors import BadRequestError, ResourceError
from engine.hub import catalog
from engine.logs import setup_logging
from engine.server.portcheck import bind_socket


def add_arguments(p):
    p.add_argument("--model", default=DEFAULT_CHAT_MODEL,
                   help=f"pulled name (pulled on first use), .gguf path, HF folder or checkpoint "
                        f"(default {DEFAULT_CHAT_MODEL})")
    p.add_argument("--models", nargs="*", default=[], metavar="NAME=PATH",
                   help="more backends listed in /v1/models, loaded on first use (one resident at a time)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=18000)
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY on /v1/*")
    p.add_argument("--max-batch", type=int, default=4, help="sequences decoded together (KV slots)")
    p.add_argument("--max-context", type=int, default=4096, help="tokens per slot (prompt + output)")
    p.add_argument("--fit-context", action="store_true",
                   help="GPU: if --max-context does not fit the memory budget, use the longest that does")
    p.add_argument("--max-queue", type=int, default=32, help="waiting requests before 429")
    p.add_argument("--prefill-slice", type=int, default=512,
                   help="prompt tokens per engine step while other requests decode (0 = whole prompts)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request, queueing included")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow another browser origin (pattern, e.g. https://my.app or http://localhost:*)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="accept requests whose Host header names NAME (pattern, e.g. mybox.lan or *.lan; "
                        "loopback names and --host are always accepted; DNS rebinding guard)")
    p.add_argument("--max-resident", type=int, default=1, help="models held in memory at once")
    p.add_argument("--no-pull", action="store_true",
                   help="do not download --model if it is a registry name not pulled yet")
    p.add_argument("--only-given-models", action="store_true",
                   help="/v1/models lists only --model/--models, not every pulled model")
    p.add_argument("--prefix-cache-mb", type=int, default=256,
                   help="MiB of prompt-prefix KV kept for reuse (0 = off)")
    p.add_argument("--prefix-cache-gpu", action=argparse.BooleanOptionalAction, default=True,
                   help="use the prefix cache on a CUDA GPU (offset prefill graphs; docs/hotpath.md)")
    p.add_argument("--speculative-gpu", action=argparse.BooleanOptionalAction, default=True,
                   help="honour \"speculative\": true on a CUDA GPU (verification as one captured decode step)")
    p.add_argument("--decode-q8", action=argparse.BooleanOptionalAction, default=False,
                   help="int8 activations in the batch-1 decode GEMVs on a CUDA GPU (llama.cpp's numerics; measured "
                        "4.5-6%% fewer tokens/s than the default fp16 step on an H100; with DEEPINFER_Q8_PLAN=fp16 "
                        "+2%% on a 7B and +9%% on a 14B, -4%% on a 3B (H200); other answers; turns "
                        "--speculative-gpu off; docs/gpu.md)")
    p.add_argument("--draft-heads", default="auto",
                   help="draft heads for speculation where prompt lookup has none: auto or on (the heads bundled for "
                        "the model, on a GPU or the CPU), off, or a .heads.safetensors file")
    p.add_argument("--decode-chain", type=int, default=16, metavar="N",
                   help="a greedy request decoding alone on a CUDA GPU takes up to N tokens per engine step, each step "
                        "queued before the host reads the last one's token (docs/gpu.md); 0 = one token per step")
    p.add_argument("--load-timeout", type=float, default=600.0,
                   help="seconds to wait for the model to load before giving up (exit 1)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_gpu_memory_arguments(p)


def build_config(args) -> EngineConfig:
    cfg = EngineConfig(model=args.model, device=args.device, max_context=args.max_context,
                       max_batch=args.max_batch, host=args.host, port=args.port, api_key=args.api_key,
                       max_queue=args.max_queue, request_timeout_s=args.timeout, served_models=list(args.models),
                       list_pulled=not args.only_given_models,
                       prefill_slice=args.prefill_slice, fit_context=args.fit_context,
                       prefix_cache_mb=args.prefix_cache_mb, prefix_cache_gpu=args.prefix_cache_gpu,
                       speculative_gpu=args.speculative_gpu, draft_heads="" if args.draft_heads == "off" else args.draft_heads,
                       decode_chain=args.decode_chain, decode_q8=args.decode_q8, **gpu_memory_kwargs(args))
    cfg.cors_origins = cfg.cors_origins + list(args.cors_origin)
    cfg.allow_hosts = list(getattr(args, "allow_host", []))
    if args.decode_chain < 0:
        raise BadRequestError(f"--decode-chain {args.decode_chain} is negative", "use 0 (off) or a token count, e.g. 16")
    if not 0 <= args.port <= 65535:
        raise BadRequestError(f"port {args.port} is not a TCP port", "use 1..65535, e.g. --port 18000")
    return cfg


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args) -> int:
    from engine.runtime.worker import EngineWorker  # heavy (torch)
    from engine.server.app import create_app, uvicorn_server  # heavy (torch): serve --help stays light

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    setup_logging("serve", level=getattr(logging, args.log_level.upper()))  # rotating file in the log dir
    cfg = build_config(args)
    if not _is_loopback(cfg.host) and not cfg.api_key:
        print(f"warning: listening on {cfg.host} without --api-key: anyone on the network can use the model",
              file=sys.stderr)
    sock = bind_socket(cfg.host, cfg.port)  # fail on a busy port before the model loads
    worker = None
    try:
        if not args.no_pull:
            catalog.ensure(cfg.model)
        from engine.runtime.llm import pick_device  # heavy (torch)
        pick_device(cfg.device)  # "no GPU" is reported here, before anything loads
        worker = EngineWorker(cfg, max_resident=args.max_resident).start()
        print(f"loading {cfg.model} ...", file=sys.stderr)
        state = worker.wait_ready(args.load_timeout)
        if state == "error":  # any load failure (missing CuPy/Triton, OOM, a corrupt file): its message, exit 1
            raise worker.load_error
        if state != "ready":
            raise ResourceError(f"{cfg.model} did not finish loading within {args.load_timeout:.0f} s",
                                "raise --load-timeout, or check the disk and `deepinfer doctor`")
    except BaseException:
        sock.close()
        if worker is not None:
            worker.stop()
        raise
    h = worker.health()
    url = f"http://{cfg.host}:{sock.getsockname()[1]}/v1"
    print(f"DeepInfer serving {h['model']} on {h['device']} at {url}  (models: "
          f"{', '.join(worker.backends.ids)}; Ctrl+C stops)", file=sys.stderr)
    server = uvicorn_server(create_app(cfg, worker), "info" if args.log_level == "debug" else "warning")
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
    return 0
