"""Do a verify step's rows carry one-token steps' bits on the REAL model, K/V and logits, deep layers included? (#17)

spec_diff --kv found speculation's K/V parting from plain decoding in an accepted draft's row (a verify row b >= 1)
at a deep layer (8, 20), by one fp16 ulp, only with the deferred rmsnorm on; the tests' 2-layer random model never
shows it. This drives GPUModel directly, with no drafter: the translate prompt of the hot-path bench is decoded
plainly one token a step in slot 0 (the reference), then again in slot 1 by verify steps whose drafts are the plain
tokens themselves (every draft accepted), as
  chain  the root and the 6 next tokens as a chain (rows 1..6 at their own cache rows);
  tree   draft heads' TREE (engine/runtime/draft_heads.py) with the true path on nodes 2 (depth 1) or 1, 4, 6
         (depth 3) and wrong tokens elsewhere, then keep_path moves the accepted rows into place;
  chain+draft, tree+draft  the same with the draft heads' graph replayed before each verify step (its work on the
         shared buffers and workspaces, as the heads' speculation runs it; its drafts are not used).
Per mode: the logits rows that differ from the plain step's bit for bit, and the K/V rows of slot 1 against slot 0
(first differing row, its layer, the verify row it came from, the number of differing rows).

    python -m engine.bench.verify_rows [--tokens 64] [--device cuda|ref] [--model M] [--heads H] [--out FILE]

The first parting found is also traced op by op, eagerly (`trace`), and when that op is a GEMV it is re-run on its
recorded inputs (`probe_gemv`: deterministic? the same inputs? which change of batch size, row or the other rows
gives the one-token step's bits): that is how the store epilogue's column-0 rounding was found (docs/hotpath.md, "The
parting found"). Run under knobs to bisect (engine/bench/device_parting.sh): the default (the deferred norm),
DEEPINFER_DEFER_NORM=0 (separate launches), and the deferred norm with DEEPINFER_PDL=0,
DEEPINFER_KERNEL_DEFINES="-DGEMV_XPRED=0" / "-DDEFER_EARLY=0".
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from engine.bench.envinfo import emit_json, environment
from engine.bench.hotpath import TEXTS
from engine.bench.spec_diff import kv_parting, ref_runner
from engine.config import EngineConfig
from engine.runtime.draft_heads import TREE_PARENTS
from engine.runtime.llm import LLM
from engine.runtime.prefix_cache import kv_tensors
from trayapp.config import default_config
from trayapp.templates import render_messages

# TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 4]: nodes 1-3 depth 1, 4-5 under node 1, 6 under node 4.
# (true nodes, in depth order) per tree shape: the accepted path and the nodes keep_path moves (root excluded)
TREE_PATHS = ([2], [1, 4, 6], [3], [1, 5])


def plain_steps(m, prompt: list[int], n: int, slot: int):
    """Greedy: n one-token steps after the prompt -> (tokens [n + 1] incl. the prefill's, logits of each step)."""
    toks = [int(m.prefill(prompt, slot, 0).argmax())]
    logs = []
    for i in range(n):
        ids, lg = m.decode([toks[-1]], [len(prompt) + i], [slot])
        toks.append(ids[0])
        logs.append(lg[0].clone())
    return toks, logs


def _wrong(t: int, V: int, k: int) -> int:
    return (t + 7 + 13 * k) % V


def _chain(m, prompt, toks, logs, slot, pre=None):
    """Verify steps of 7 true tokens each (root + 6 drafts) -> ([(step start, row, logits and greedy id equal)],
    the rows of K/V written by row b of the step starting at s: {cache row: (s, b)}, {s: the step's verify args}).
    The drafts are fed whatever the step's own ids say (teacher forcing), so rows after a parting still compare."""
    P, n = len(prompt), len(logs)
    m.prefill(prompt, slot, 0)
    res, origin, i, calls = [], {}, 0, {}
    while i < n:
        B = min(7, n - i)
        if pre is not None:
            pre()
        ids, lg = m.verify(toks[i:i + B], P + i, slot)
        calls[i] = (toks[i:i + B], P + i, None)
        for b in range(B):
            res.append((i, b, bool(torch.equal(lg[b], logs[i + b])) and ids[b] == toks[i + b + 1]))
            origin[P + i + b] = (i, b)
        i += B
    return res, origin, calls


def _tree(m, prompt, toks, logs, slot, pre=None):
    """Tree verify steps with the true path on TREE_PATHS[k] (cycled); keep_path after each."""
    P, n, V = len(prompt), len(logs), m.cfg.vocab_size
    m.prefill(prompt, slot, 0)
    res, origin, i, k, calls = [], {}, 0, 0, {}
    while i < n:
        path = TREE_PATHS[k % len(TREE_PATHS)]
        k += 1
        d = len(path)
        if i + d >= n:
            path, d = [], 0
        tokens = [toks[i]] + [_wrong(toks[i + 1], V, j) for j in range(1, len(TREE_PARENTS))]
        for j, node in enumerate(path):
            tokens[node] = toks[i + 1 + j]
        parents = TREE_PARENTS if d else [-1]
        tokens = tokens if d else tokens[:1]
        if pre is not None:
            pre()
        ids, lg = m.verify(tokens, P + i, slot, parents=parents)
        calls[i] = (tokens, P + i, parents)
        for j, node in enumerate([0] + path):
            res.append((i, node, bool(torch.equal(lg[node], logs[i + j])) and ids[node] == toks[i + j + 1]))
            origin[P + i + j] = (i, node)
        if d:
            m.keep_path(slot, P + i, path)
        i += d + 1
    return res, origin, calls


def _kv(llm, P: int, n: int, origin: dict) -> dict:
    """Slot 1's K/V rows (verify steps) against slot 0's (plain steps), bit for bit, through spec_diff.kv_parting:
    the first differing row, its layer, and the (step start, row) of the verify step that wrote it."""
    k, v = kv_tensors(llm.runner)
    run = [{"prompt": P, "k": k[:, s, :, :P + n].cpu(), "v": v[:, s, :, :P + n].cpu(), "steps": []} for s in (0, 1)]
    got = kv_parting(*run)
    if got is None:
        return {"rows_differing": 0}
    return {"rows_differing": got["rows_differing"], "first_row": got["row"], "first_layer": got["layer"],
            "from_step_row": list(origin.get(got["row"], (None, None))), "max_abs_k": got["max_abs_k"],
            "max_abs_v": got["max_abs_v"]}


class Tap:
    """DecodeKernels with a snapshot of the step's buffers (their first B rows, the norm sums' columns) after every
    kernel call, synchronized: for eager steps (GPUModel.use_graphs False)."""
    BUFS = ("h", "x", "qkv", "attn", "act")

    def __init__(self, m, B: int):
        self.kn, self.m, self.B, self.log, self.calls = m.kn, m, B, [], []

    def __getattr__(self, name):
        f = getattr(self.kn, name)
        if not callable(f):
            return f

        def call(*a, **kw):
            # each call's inputs as they were (GEMVs re-run by probe_gemv; other ops: not kept), and which snapped
            # buffer a GEMV writes (its out: h, qkv or act; None for the logits)
            out = next((k for k in self.BUFS if name == "gemv" and getattr(self.m, k).data_ptr() == a[4].data_ptr()),
                       None)
            self.calls.append((name, _clone(a), _clone(kw), out) if name == "gemv" else (name, None, None, None))
            ret = f(*a, **kw)
            self.snap(name)
            return ret
        return call

    def snap(self, name: str):
        if self.m.cuda:
            torch.cuda.synchronize()
        s = {k: getattr(self.m, k)[:self.B].clone() for k in self.BUFS}
        s["ss"] = self.m.ss[:, :self.B].t().clone()
        self.log.append((name, s))


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (tuple, list)):
        return type(v)(_clone(e) for e in v)
    if isinstance(v, dict):
        return {k: _clone(e) for k, e in v.items()}
    return v


def _traced(m, B: int, fn, taps: list | None = None):
    kn, graphs = m.kn, m.use_graphs
    m.kn, m.use_graphs = Tap(m, B), False
    m.kn.snap("before")
    try:
        fn()
        if taps is not None:
            taps.append(m.kn)
        return m.kn.log
    finally:
        m.kn, m.use_graphs = kn, graphs


def _rerun(kn, call, B=None, x=None, ss=None):
    """One recorded GEMV call again on its recorded inputs (optionally another B, x or norm sums) -> its output."""
    _, a, kw, _ = _clone(call)
    a = list(a)  # (w, x, B, epi, out, ...)
    if x is not None:
        a[1] = x
    if B is not None:
        a[2] = B
    if ss is not None:
        kw["ss"] = ss
    kn.gemv(*a, **kw)
    if a[1].is_cuda:
        torch.cuda.synchronize()
    return a[4]


def probe_gemv(kn, rcall, vcall, b: int, recorded: tuple | None) -> dict:
    """The parting GEMV (row b of the verify step against row 0 of the one-token step) re-run on its recorded
    inputs: does the re-run give the steps' recorded outputs (row 0, row b; recorded None: its out is not a snapped
    buffer), do the inputs of the two rows agree, and which change of the verify call's other rows / batch size gives
    row b the one-token step's bits."""
    r_out, v_out = _rerun(kn, rcall)[0], _rerun(kn, vcall)
    _, ra, rkw, _ = rcall
    _, va, vkw, _ = vcall
    Bv = va[2]
    rx, vx = ra[1], va[1]
    rss, vss = rkw.get("ss"), vkw.get("ss")
    res = {"B": Bv, "epi": va[3], "x_equal": bool(torch.equal(rx[0], vx[b])),
           "ss_equal": None if rss is None else bool(torch.equal(rss[:, 0], vss[:, b]))}
    res["rerun_ref_equal_recorded"] = None if recorded is None else bool(torch.equal(r_out, recorded[0]))
    res["rerun_ver_equal_recorded"] = None if recorded is None else bool(torch.equal(v_out[b], recorded[1]))
    res["ver_row_equal_ref"] = bool(torch.equal(v_out[b], r_out))
    d = (v_out[b].double() - r_out.double()).abs()
    res["differing"] = [[int(i), float(r_out.view(-1)[i]), float(v_out[b].view(-1)[i])]
                        for i in torch.nonzero(d.view(-1) > 0).view(-1)[:8].tolist()]

    def variant(B, xrows, ssrows):
        x = vx.clone()
        ss = None if vss is None else vss.clone()
        for dst, src in xrows:
            x[dst] = src
        if ss is not None:
            for dst, src in ssrows:
                if src is not None:
                    ss[:, dst] = src
        out = _rerun(kn, vcall, B=B, x=x, ss=ss)
        row = [dst for dst, _ in xrows][0]
        return bool(torch.equal(out[row], r_out))
    sb = None if vss is None else vss[:, b]
    z = torch.zeros_like(vx[b])
    # row b's inputs alone at row 0 with B = 1 (the one-token step's shape)
    res["alone_at_row0_B1"] = variant(1, [(0, vx[b])], [(0, sb)])
    # row b's inputs at row 0, the verify's B (the other rows as recorded)
    res["at_row0_Bv"] = variant(Bv, [(0, vx[b])] + [(b, vx[0])], [(0, sb)] + [(b, vss[:, 0] if vss is not None
                                                                                else None)])
    # row b at its own row, every other row's x zero (and their sums row b's)
    res["others_zero"] = variant(Bv, [(b, vx[b])] + [(i, z) for i in range(Bv) if i != b],
                                 [(b, sb)] + [(i, sb) for i in range(Bv) if i != b])
    # the ref's row 0 inputs put at row b of the verify call
    res["ref_at_row_b"] = variant(Bv, [(b, rx[0])], [(b, None if rss is None else rss[:, 0])])
    return res


def trace(m, call, b: int, toks: list[int], P: int, pre=None) -> dict:
    """Eagerly, op by op: row b of the verify step `call` (tokens, start, parents) against row 0 of the one-token step
    that feeds the same token at the same position in slot 0 (whose cache holds the plain run). -> the first op and
    buffer where they part, or that they do not (eager steps may not show a parting graphs show)."""
    tokens, start, parents = call
    depth = b if parents is None else len(_root_path(parents, b))
    pos = start + depth
    taps: list = []
    ref = _traced(m, 1, lambda: m.decode([toks[pos - P]], [pos], [0]), taps)
    if pre is not None:
        pre()
    ver = _traced(m, len(tokens), lambda: m.verify(tokens, start, 1, parents=parents), taps)
    for j in range(1, min(len(ref), len(ver))):
        (n1, a), (n2, v) = ref[j], ver[j]
        for k in a:  # a buffer row either step's op wrote (the rest hold other steps' leftovers)
            wrote = not torch.equal(a[k][0], ref[j - 1][1][k][0]) or not torch.equal(v[k][b], ver[j - 1][1][k][b])
            if wrote and not torch.equal(a[k][0], v[k][b]):
                d = (a[k][0].double() - v[k][b].double()).abs()
                got = {"parts_at_op": j - 1, "op": [n1, n2], "buffer": k, "max_abs": float(d.max()),
                       "elements": int((d > 0).sum()), "ops": len(ref) - 1}
                rc, vc = taps[0].calls[j - 1], taps[1].calls[j - 1]
                if rc[0] == vc[0] == "gemv":
                    o = rc[3]  # the buffer the GEMV writes, as snapped after it
                    got["probe"] = probe_gemv(m.kn, rc, vc, b, None if o is None else (a[o][0], v[o][b]))
                return got
    return {"parts_at_op": None, "ops": [len(ref) - 1, len(ver) - 1]}


def _root_path(parents: list[int], b: int) -> list[int]:
    out = []
    while b > 0:
        out.append(b)
        b = parents[b]
    return out[::-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="cuda", choices=["cuda", "ref"])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--text", type=int, default=0)
    p.add_argument("--heads", default="auto", help="draft heads for the +draft modes: auto (the model file's "
                   "bundled ones), a path (random weights: any heads of the same hidden size and vocabulary), or ''")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ref = args.device == "ref"
    llm = LLM(EngineConfig(model=args.model, device="cpu" if ref else "cuda", max_context=2048, max_batch=3,
                           prefix_cache_mb=0, speculative_gpu=True, draft_heads=args.heads, warmup=not ref),
              runner_factory=ref_runner if ref else None)
    m = llm.runner.model
    cfg = default_config("zh")
    prompt = llm.tokenizer.encode(llm.render(render_messages(cfg.template("translate"), TEXTS[args.text], cfg.lang)))
    knobs = {k: v for k, v in os.environ.items() if k.startswith("DEEPINFER_")}
    res: dict = {"env": environment(sys.argv[1:] if argv is None else argv), "knobs": knobs,
                 "prompt_tokens": len(prompt), "tokens": args.tokens, "modes": {}}
    with torch.inference_mode():
        toks, logs = plain_steps(m, prompt, args.tokens, 0)
        P, n = len(prompt), args.tokens
        heads = getattr(llm.runner, "heads", None)
        modes = [("chain", _chain, None), ("tree", _tree, None)]
        if heads is not None and getattr(heads, "step_model", False):
            heads.h.copy_(m.x[0])  # any features: the draft's output is not used
            heads.tok.fill_(toks[0])
            modes += [("chain+draft", _chain, heads._run), ("tree+draft", _tree, heads._run)]
        for mode, fn, pre in modes:
            steps, origin, calls = fn(m, prompt, toks, logs, 1, pre)
            kv = _kv(llm, P, n, origin)
            res["modes"][mode] = {"logit_rows": len(steps), "logit_rows_differing": sum(not e for *_, e in steps),
                                  "logit_differing": [[s, b] for s, b, e in steps if not e][:12], "kv": kv}
            print(f"{mode:11s} logits differ {res['modes'][mode]['logit_rows_differing']:3d}/{len(steps):3d}  "
                  f"K/V rows differ {kv['rows_differing']:3d}/{n}" +
                  (f"  first row {kv['first_row']} layer {kv['first_layer']} from (step, row) "
                   f"{kv['from_step_row']} max |dk| {kv['max_abs_k']:.2g} |dv| {kv['max_abs_v']:.2g}"
                   if kv["rows_differing"] else ""), flush=True)
            if kv["rows_differing"] and "trace" not in res:  # the first parting, op by op, eagerly
                s0, b = kv["from_step_row"]
                res["trace"] = {"mode": mode, "step": s0, "row": b, **trace(m, calls[s0], b, toks, P, pre)}
                print(f"trace  {res['trace']}", flush=True)
    emit_json(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
