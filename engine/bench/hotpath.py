"""The tray's hot path on one model, in-process: prefix-cache TTFT and prompt-lookup speculative decoding.

    python -m engine.bench.hotpath --model qwen2.5-coder-0.5b --device cpu --out docs/results/hotpath_cpu_0.5b.json
    python -m engine.bench.hotpath --model ckpt/3b-w4 --device cuda --texts 10 --max-tokens 128 --out $OUT/hotpath_gpu_3b.json
    python -m engine.bench.hotpath --model /path/to/qwen2.5-coder-0.5b.gguf --device cuda --texts 10 \
        --out $OUT/hotpath_gpu_0.5b.json      (--model: a pulled name, a .gguf file or a checkpoint folder)

prefix:  TTFT (prefill + first token) of a >= 200-token template + a new 50-token selection, the template
         cached (as after the tray's warm-up) vs the template not cached vs the 50 tokens alone (medians; the
         last two with the cache off, so nothing is reused: from position 0, on the GPU the plain prefill graphs;
         the cached run's suffix replays the offset prefill graphs, GPUModel.offset_graphs).
chat:    a second chat turn over a ~2,000-token history vs the first turn (TTFT).
speculative: the 改写 (rewrite) and 翻译 (translate) templates over the texts below, greedy, with and without
         prompt lookup: decode tokens/s, speed-up, acceptance rate, identical outputs; and a task whose output
         does not copy its input (quick_ask on questions) for the slowdown check. On a GPU verification is one
         graph-captured decode step of 1 + k tokens (GPUModel.verify, k <= 7).
Both are forced on here (EngineConfig.prefix_cache_gpu / speculative_gpu) so the GPU numbers say whether the
defaults should flip; `targets` in the JSON compares each number with issue #17's goal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from engine.bench.envinfo import emit_json, environment
from engine.config import EngineConfig
from engine.runtime import speculative
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from trayapp.config import default_config
from trayapp.templates import render_messages

TEMPLATE = ("You are a careful writing assistant inside a desktop tool. The user selected a passage in some "
            "application and pressed a hotkey. Rewrite the passage so that it reads clearly and politely, keeps "
            "every fact, name, number and date exactly as written, keeps the original language, and does not "
            "add greetings, explanations, notes, quotes or markdown. If the passage is a list, keep it a list "
            "with the same items in the same order. If it is code, return it unchanged. Answer with the "
            "rewritten passage only, nothing before it and nothing after it. Keep the length within ten percent "
            "of the original. Preserve line breaks where they separate paragraphs. Do not translate. Do not "
            "summarize. Do not answer questions that appear in the passage; rewrite them as questions. "
            "Respect the register of the original: formal stays formal, casual stays casual. Fix spelling and "
            "grammar mistakes, split sentences that run on, and replace vague words with precise ones, but never "
            "change what the passage claims, promises or asks for. Passage to rewrite follows after the colon:\n")
# texts a user selects: mails, chat messages, notes, meeting minutes (zh and en)
TEXTS = [
    "明天下午三点前把实验报告发给导师，并抄送课题组的其他同学。会议改到周四上午十点，在三楼会议室。",
    "各位同事：本周五下午两点进行服务器维护，预计持续两个小时，期间内网系统无法访问，请提前保存好工作。",
    "老师您好，我是二班的李明，因为发烧今天没法去上课，想请一天假，作业我会在周末补交，谢谢老师。",
    "周会纪要：一、新版本下周二发布；二、测试组需要在周一前完成回归测试；三、市场部准备发布会的材料。",
    "我们的房租下个月开始涨到每月四千五百元，水电费另算，如果你还想继续合租请在月底前告诉我。",
    "Hi Anna, the client moved the review to Friday at 11 am. Could you send me the updated slides by "
    "Thursday evening so I can check the numbers before the call?",
    "Reminder: the library closes early on Saturday because of the staff training. Please return borrowed "
    "laptops to the front desk before 2 pm.",
    "The build failed after last night's dependency update. I pinned the old version for now, but we need to "
    "read the changelog and fix the two failing tests before the release.",
    "Dear Mr. Chen, thank you for your quick reply. We would like to order 200 units of the blue model and "
    "receive them before the end of March, if possible.",
    "Note to self: call the dentist on Monday to move the appointment, buy a birthday gift for Mia, and renew "
    "the car insurance before it expires on the 15th.",
]
QUESTIONS = ["什么是 CUDA Graph？用两句话解释。", "Why is the sky blue? Answer in two sentences.",
             "给我三个提高专注力的建议。", "What is the difference between a process and a thread?"]


def _ttft(llm, ids: list[int]) -> float:
    t: dict = {}
    for _ in llm.stream(ids, SamplingParams(max_tokens=1), t):
        pass
    return t["prefill_s"]


def _med(xs):
    return round(statistics.median(xs), 4)


def prefix_run(llm, repeats: int = 5) -> dict:
    tok = llm.tokenizer
    prefix = tok.encode(TEMPLATE)
    sels = [tok.encode(f"Note {i}: " + TEXTS[5 + i % 5] + " " + TEXTS[5 + (i + 1) % 5])[:50] for i in range(repeats)]
    _ttft(llm, prefix + tok.encode("warm-up"))  # the tray's warm-up
    cached, alone, cold = [], [], []
    for i, s in enumerate(sels):
        cached.append(_ttft(llm, prefix + s))
        pc = getattr(llm.runner, "_prefix_cache", False)
        llm.runner._prefix_cache = None  # off: the whole prompt prefilled (and no stray partial reuse in "alone")
        try:
            alone.append(_ttft(llm, tok.encode("x")[:1] + s[1:]))
            cold.append(_ttft(llm, prefix + tok.encode(f"cold {i}")[:1] + s[1:]))
        finally:
            llm.runner._prefix_cache = pc
    return {"template_tokens": len(prefix), "selection_tokens": 50, "repeats": repeats,
            "ttft_cached_s": _med(cached), "ttft_selection_alone_s": _med(alone), "ttft_uncached_s": _med(cold),
            "cached_over_alone": round(statistics.median(cached) / statistics.median(alone), 3),
            "uncached_over_cached": round(statistics.median(cold) / statistics.median(cached), 3)}


def chat_run(llm, history_tokens: int = 2000) -> dict:
    tok = llm.tokenizer
    n = min(history_tokens, llm.max_context - 64)
    hist: list[int] = []
    i = 0
    while len(hist) < n:
        hist += tok.encode(f"Turn {i}: " + TEXTS[i % len(TEXTS)] + "\n")
        i += 1
    hist = hist[:n]
    t: dict = {}
    for _ in llm.stream(hist, SamplingParams(max_tokens=8), t):
        pass
    second = _ttft(llm, hist + t["token_ids"] + tok.encode("\nAnd the next step?"))
    return {"history_tokens": n, "first_turn_ttft_s": round(t["prefill_s"], 4), "second_turn_ttft_s": round(second, 4),
            "speedup": round(t["prefill_s"] / second, 2)}


def _gen(llm, prompt: str, n: int, spec: bool) -> dict:
    st = speculative.stats_for(llm.runner)
    before = {k: dict(v) for k, v in st["by_source"].items()}
    before_all = {k: st[k] for k in ("drafted", "accepted", "verify_steps", "tokens")}
    c = llm.complete(prompt, SamplingParams(max_tokens=n, temperature=0.0, speculative=spec))
    by = {k: {f: v[f] - before.get(k, {}).get(f, 0) for f in v} for k, v in st["by_source"].items()}
    d = {k: st[k] - before_all[k] for k in before_all}
    return {"ids": c.token_ids, "tokens": c.completion_tokens, "decode_s": c.decode_s, "drafted": d["drafted"],
            "accepted": d["accepted"], "verify_steps": d["verify_steps"], "verify_tokens": d["tokens"],
            "by_source": {k: v for k, v in by.items() if v["verify_steps"]}}


def three_runs(llm, prompt: str, max_tokens: int) -> tuple[dict, dict, dict]:
    """After a warm-up that caches the prompt's prefix for all alike: (plain chained, speculative, plain one token
    per engine step) runs of prompt, as _gen reports them."""
    _gen(llm, prompt, 2, False)
    a, b = _gen(llm, prompt, max_tokens, False), _gen(llm, prompt, max_tokens, True)
    chain, llm.runner.cfg.decode_chain = llm.runner.cfg.decode_chain, 0  # plain, one token per engine step
    try:
        h = _gen(llm, prompt, max_tokens, False)
    finally:
        llm.runner.cfg.decode_chain = chain
    return a, b, h


def spec_run(llm, template_ids: list[str], texts: list[str], max_tokens: int) -> dict:
    cfg = default_config("zh")
    out = {}
    for tid in template_ids:
        rows = []
        tpl = cfg.template(tid)
        for text in texts:
            a, b, h = three_runs(llm, llm.render(render_messages(tpl, text, cfg.lang)), max_tokens)
            rows.append({"tokens": a["tokens"], "identical": a["ids"] == b["ids"] == h["ids"],
                         "plain_tps": (a["tokens"] - 1) / a["decode_s"] if a["decode_s"] else 0.0,
                         "plain_host_loop_tps": (h["tokens"] - 1) / h["decode_s"] if h["decode_s"] else 0.0,
                         "spec_tps": (b["tokens"] - 1) / b["decode_s"] if b["decode_s"] else 0.0,
                         "drafted": b["drafted"], "accepted": b["accepted"], "verify_steps": b["verify_steps"],
                         "verify_tokens": b["verify_tokens"], "by_source": b["by_source"]})
        plain_t = sum(r["tokens"] - 1 for r in rows)
        plain_s = sum((r["tokens"] - 1) / r["plain_tps"] for r in rows if r["plain_tps"])
        spec_s = sum((r["tokens"] - 1) / r["spec_tps"] for r in rows if r["spec_tps"])
        host_s = sum((r["tokens"] - 1) / r["plain_host_loop_tps"] for r in rows if r["plain_host_loop_tps"])
        d, acc = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
        by: dict = {}
        for r in rows:
            for k, v in r["by_source"].items():
                t = by.setdefault(k, {})
                for f, x in v.items():
                    t[f] = t.get(f, 0) + x
        for t in by.values():
            t["acceptance_rate"] = round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None
            t["tokens_per_verify_step"] = round(t["tokens"] / t["verify_steps"], 3) if t["verify_steps"] else None
            if t.get("wall_s") and t["verify_steps"]:  # bursts: wall per step, and the host's share spent waiting
                t["wall_us_per_step"] = round(t["wall_s"] * 1e6 / t["verify_steps"], 1)
                t["wait_share"] = round(t["wait_s"] / t["wall_s"], 3)
                t["share_of_decode"] = round(t["wall_s"] / spec_s, 3) if spec_s else None
        out[tid] = {"texts": len(rows), "max_tokens": max_tokens, "all_identical": all(r["identical"] for r in rows),
                    "plain_tps": round(plain_t / plain_s, 2), "spec_tps": round(plain_t / spec_s, 2),
                    "speedup": round(plain_s / spec_s, 3),
                    # plain decoding one token per engine step (EngineConfig.decode_chain 0): the baseline before
                    # the chained plain steps (GPU; on the CPU runner both are the same path)
                    "plain_host_loop_tps": round(plain_t / host_s, 2) if host_s else None,
                    "speedup_vs_host_loop": round(host_s / spec_s, 3) if spec_s and host_s else None,
                    "acceptance_rate": round(acc / d, 3) if d else None,
                    "drafted": d, "accepted": acc, "by_source": by, "rows": rows}
    return out


def spec_cost(llm, reps: int = 50) -> dict | None:
    """GPU: ms per plain decode step (batch 1), per verify step of 1 + k tokens, per draft-heads proposal: what a
    speculative step costs against the plain one it replaces (the replays as the engine runs them, host sync
    included)."""
    import torch
    r, heads = llm.runner, getattr(llm.runner, "heads", None)
    m = getattr(r, "model", None)
    if getattr(r, "device", "cpu") != "cuda" or heads is None:
        return None
    from engine.runtime.sequence import Sequence

    def ms(fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return round((time.perf_counter() - t0) * 1000 / reps, 4)
    slot = r.free_slots[0]
    s = Sequence([1, 2, 3], SamplingParams(max_tokens=4, speculative=True), llm.tokenizer)
    s.output_ids, s.hidden = [7], m.x[0].clone()
    out = {"decode_b1_ms": ms(lambda: m.decode([7], [64], [slot]))}
    for k in range(1, heads.K + 1):
        out[f"verify_k{k}_ms"] = ms(lambda: m.verify([7] * (k + 1), 64, slot))
    out["heads_propose_ms"] = ms(lambda: heads.propose(s, heads.K))
    tree = heads.propose_tree(s, heads.K, 7)
    if tree is not None:  # the tree's proposal (top-k included) and its 8-row verify step
        out["heads_propose_tree_ms"] = ms(lambda: heads.propose_tree(s, heads.K, 7))
        out["verify_tree_ms"] = ms(lambda: m.verify([7] + tree[0], 64, slot, parents=tree[1]))
    return out


def graphs_report(runner) -> dict | None:
    """GPU: graphs captured at load (decode, prefill, offset prefill, verify) and the offset graphs' capture checks."""
    model = getattr(runner, "model", None)
    pg = getattr(model, "prefill_graphs", None)
    if pg is None:
        return None
    return {"at_load": getattr(runner, "graphs_at_load", None), "offset_graphs": sorted(pg.at_graphs),
            "offset_disabled": pg.at_disabled, "offset_checks": pg.at_checks,
            "verify_graphs": sorted(getattr(model, "verify_graphs", {}))}


def targets(res: dict) -> dict:
    """Each measured ratio next to issue #17's goal (None: not measured in this run)."""
    pre, chat = res.get("prefix"), res.get("chat")
    spec, other = res.get("speculative", {}), res.get("speculative_no_overlap", {})
    row = lambda v, goal, ok: None if v is None else {"value": v, "goal": goal, "met": ok(v)}  # noqa: E731
    out = {"prefix_cached_over_alone": row(pre and pre["cached_over_alone"], "<= 1.3", lambda v: v <= 1.3),
           "chat_second_turn_speedup": row(chat and chat["speedup"], ">= 5", lambda v: v >= 5)}
    for k in ("rewrite", "translate"):
        out[f"spec_{k}_speedup"] = row(spec.get(k, {}).get("speedup"), ">= 1.5", lambda v: v >= 1.5)
        out[f"spec_{k}_speedup_ngram1"] = row(res.get("speculative_ngram1", {}).get(k, {}).get("speedup"), ">= 1.5",
                                              lambda v: v >= 1.5)
    for k, v in other.items():
        out[f"spec_{k}_no_overlap_speedup"] = row(v.get("speedup"), ">= 0.95", lambda v: v >= 0.95)
    out["greedy_identical"] = all(v.get("all_identical", True) for v in
                                  [*spec.values(), *other.values(), *res.get("speculative_ngram1", {}).values(),
                                   *res.get("speculative_chain", {}).values(),
                                   *res.get("speculative_noburst", {}).values()])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.hotpath", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    p.add_argument("--texts", type=int, default=5, help="texts per template (of the 10 built in)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--parts", default="prefix,chat,spec,spec1", help="spec1: speculation with 1-token matches too; "
                   "chain: also the heads' drafts as a chain instead of a tree (EngineConfig.draft_tree off); noburst: "
                   "the tree steps without the burst (EngineConfig.spec_burst 0); cost: "
                   "ms per plain / verify / draft step (GPU)")
    p.add_argument("--draft-model", default="", help="optional draft model for speculation (e.g. the 0.5B for 3B)")
    p.add_argument("--draft-heads", default="auto", help="draft heads (EngineConfig.draft_heads): auto, on, off, a file")
    p.add_argument("--draft-vocab", default="on", choices=["on", "off"],
                   help="the heads draft over the tokenizer's draft vocabulary (EngineConfig.draft_vocab)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    llm = LLM(EngineConfig(model=args.model, device=args.device, max_context=args.max_context, max_batch=2,
                           draft_model=args.draft_model, prefix_cache_gpu=True, speculative_gpu=True,  # measure both
                           draft_heads="" if args.draft_heads == "off" else args.draft_heads,
                           draft_vocab=args.draft_vocab == "on"))
    parts = args.parts.split(",")
    argv = sys.argv[1:] if argv is None else argv
    env = environment(argv)
    # a model given as a file or folder is recorded by its name (no machine path in a results file)
    argv = [Path(x).name if x in (args.model, args.draft_model, args.draft_heads) and Path(x).exists() else x
            for x in argv]
    env["command"] = " ".join(["python -m engine.bench.hotpath", *argv])
    env["sys_argv"] = ["-m", "engine.bench.hotpath", *argv]  # not the checkout's path
    model = Path(args.model).name if Path(args.model).exists() else args.model
    heads = getattr(llm.runner, "heads", None)
    res: dict = {"schema": "deepinfer-hotpath/1", "model": model, "draft_model": args.draft_model or None,
                 "draft_heads": {"file": heads.name, "heads": heads.K, "trained": heads.meta,
                                 "draft_vocab": int(heads.sub.numel()) if heads.sub is not None else None}
                 if heads else None,
                 "device": llm.runner.device, "env": env}
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    if "prefix" in parts:
        res["prefix"] = prefix_run(llm, args.repeats)
        log(f"prefix: {res['prefix']}")
    if "chat" in parts:
        res["chat"] = chat_run(llm)
        log(f"chat: {res['chat']}")
    if "spec" in parts:
        res["speculative"] = spec_run(llm, ["rewrite", "translate"], TEXTS[:args.texts], args.max_tokens)
        res["speculative_no_overlap"] = spec_run(llm, ["quick_ask"], QUESTIONS[:max(2, args.texts // 2)],
                                                 args.max_tokens)
        for k, v in {**res["speculative"], **res["speculative_no_overlap"]}.items():
            log(f"speculative {k}: " + json.dumps({a: b for a, b in v.items() if a != "rows"}))
    if "chain" in parts and heads is not None:  # the same runs with the heads' drafts verified as a chain
        llm.runner.cfg.draft_tree = False
        try:
            res["speculative_chain"] = spec_run(llm, ["rewrite", "translate"], TEXTS[:args.texts], args.max_tokens)
        finally:
            llm.runner.cfg.draft_tree = True
        for k, v in res["speculative_chain"].items():
            log(f"speculative (heads as a chain) {k}: " + json.dumps({a: b for a, b in v.items() if a != "rows"}))
    if "noburst" in parts and heads is not None:  # the tree steps driven by the host, one round trip each
        llm.runner.cfg.spec_burst = 0
        try:
            res["speculative_noburst"] = spec_run(llm, ["rewrite", "translate"], TEXTS[:args.texts], args.max_tokens)
        finally:
            llm.runner.cfg.spec_burst = EngineConfig.spec_burst
        for k, v in res["speculative_noburst"].items():
            log(f"speculative (no burst) {k}: " + json.dumps({a: b for a, b in v.items() if a != "rows"}))
    if "cost" in parts:
        res["spec_cost"] = spec_cost(llm)
        log(f"spec cost: {res['spec_cost']}")
    if "spec1" in parts:  # drafts from single-token matches too (EngineConfig.spec_ngram_min = 1): translation's case
        llm.runner.cfg.spec_ngram_min = 1
        try:
            res["speculative_ngram1"] = spec_run(llm, ["translate", "rewrite"], TEXTS[:args.texts], args.max_tokens)
        finally:
            llm.runner.cfg.spec_ngram_min = 2
        for k, v in res["speculative_ngram1"].items():
            log(f"speculative (1-token matches) {k}: " + json.dumps({a: b for a, b in v.items() if a != "rows"}))
    res["prefix_cache"] = getattr(llm.runner, "_prefix_cache").stats() if getattr(llm.runner, "_prefix_cache", None) \
        else None
    res["graphs"] = graphs_report(llm.runner)
    res["targets"] = targets(res)
    res["total_s"] = round(time.perf_counter() - t0, 1)
    emit_json(res, args.out, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
