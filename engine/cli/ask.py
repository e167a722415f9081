"""deepinfer ask "question": stream an answer to the terminal."""
from __future__ import annotations

import sys
import time

from engine.config import DEFAULT_CHAT_MODEL, EngineConfig, add_gpu_memory_arguments, gpu_memory_kwargs
from engine.errors import BadRequestError
from engine.hub import catalog


def add_arguments(p):
    p.add_argument("question", nargs="*", help="the question (read from stdin when omitted or '-')")
    p.add_argument("--model", default=DEFAULT_CHAT_MODEL,
                   help=f"pulled name (pulled on first use), .gguf path, HF folder or checkpoint "
                        f"(default {DEFAULT_CHAT_MODEL})")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--stats", action="store_true", help="print load time, prefill time and decode tokens/s")
    p.add_argument("--speculative", action="store_true",
                   help="prompt-lookup speculative decoding (drafts copied from the prompt; same output under greedy)")
    p.add_argument("--no-pull", action="store_true", help="do not download --model if it is a registry name not pulled yet")
    add_gpu_memory_arguments(p)


def run(args) -> int:
    from engine.runtime import speculative  # heavy (torch)
    from engine.runtime.llm import LLM, encode_chat  # heavy (torch): ask --help stays light
    from engine.runtime.sampling import SamplingParams  # heavy (torch)
    from engine.runtime.slots import check_fits
    from engine.formats.load import load_spec

    question = " ".join(args.question).strip()
    if not question or question == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise BadRequestError("no question given", 'pass it as an argument: deepinfer ask "..." or pipe text in')
        question = sys.stdin.read().strip()
    if not question:
        raise BadRequestError("the question is empty")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, stop=args.stop, speculative=args.speculative)
    if not args.no_pull:
        catalog.ensure(args.model)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": question}]
    # the header, tokenizer and chat template only (~0.5 s): a prompt that cannot fit the asked context is refused
    # before the weights load (~10 s for the 0.5B on a CPU, more for a 7B on a GPU); the runner checks again against
    # the context it holds, which the free memory may make shorter
    cfg = EngineConfig(model=args.model, device=args.device, max_context=args.max_context, max_batch=1,
                       **gpu_memory_kwargs(args))  # its own checks first (a --max-context below 16, ...)
    t_spec = time.perf_counter()
    spec = load_spec(args.model)
    t_spec = time.perf_counter() - t_spec  # part of the load the stats report
    prompt = encode_chat(spec, messages)
    check_fits(len(prompt), params.max_tokens, cfg.context_for(spec.config))
    llm = LLM(cfg, spec=spec)
    timings: dict = {}
    t0 = time.perf_counter()
    out = sys.stdout
    for ev in llm.stream(prompt, params, timings):
        out.write(ev.text)
        out.flush()
    out.write("\n")
    if args.stats:
        n = timings["completion_tokens"]
        dec = timings["decode_s"]
        tps = (n - 1) / dec if n > 1 and dec > 0 else 0.0
        dev = llm.runner.device
        if dev == "cpu":  # how the CPU holds the linears (--cpu-weights): int4, int8, float32 or bfloat16
            dev += f" {llm.runner.weights_kind}"
        print(f"[load {llm.load_seconds + t_spec:.2f}s | device {dev} | prompt {timings['prompt_tokens']} tok, "
              f"prefill {timings['prefill_s'] * 1000:.0f} ms | {n} tok, decode {tps:.1f} tok/s | "
              f"wall {time.perf_counter() - t0:.2f}s | finish {timings['finish_reason']}]", file=sys.stderr)
        if args.speculative:
            st = speculative.report(llm.runner)
            rate = f"{st['acceptance_rate']:.0%}" if st["acceptance_rate"] is not None else "-"
            print(f"[speculative: {st['drafted']} drafted, {st['accepted']} accepted ({rate}), "
                  f"{st['tokens_per_step'] or '-'} tokens per verify step]", file=sys.stderr)
    return 0
