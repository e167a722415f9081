"""Speculative verification through the decode step (GPUModel.verify, engine/model/ops_step.py verify): the k+1
tokens of one sequence at consecutive positions of one slot in ONE step give the tokens (and, on the GPU, the
logits bit for bit) of k+1 one-token steps.

CPU: the step on the kernels' PyTorch references (kernels/decode_reference.py attention_tree_ref through
RefKernels). GPU (@pytest.mark.gpu): decode_attn.cu's _tree kernels against the default kernel token by token along
each node's path (bit for bit), the captured verify graphs against one-token
graphs on a random 2-layer checkpoint, and the real 0.5B: greedy speculation == plain greedy decoding.
"""
from __future__ import annotations

import pytest
import torch

from engine.bench.verify_rows import plain_steps as _plain
from engine.config import QWEN25_SHAPES, EngineConfig, ModelConfig
from engine.formats.load import load_spec
from engine.model.gpu_load import load_checkpoint
from engine.model.gpu_model import GPUModel
from engine.quant.make_random import make_random


def _model(path, device, cfg: ModelConfig, max_context=256) -> GPUModel:
    make_random(cfg, "w4", path, seed=3, name="verify-check")
    return GPUModel(load_checkpoint(load_spec(str(path)).checkpoint, device), 3, max_context, device)


def check_verify_equals_steps(m: GPUModel, bitwise: bool):
    V = m.cfg.vocab_size
    prompt = torch.randint(0, V, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    toks, logs = _plain(m, prompt, 12, 0)
    P = len(prompt)
    for k in (1, 4, 7):  # the whole draft right: ids are the next k+1 plain tokens
        m.prefill(prompt, 1, 0)
        start = P  # token toks[0] sits at position P
        ids, lg = m.verify(toks[:k + 1], start, 1)
        assert ids == toks[1:k + 2], (k, ids, toks)
        for i in range(k + 1):
            if bitwise:
                assert torch.equal(lg[i], logs[i]), (k, i, float((lg[i] - logs[i]).abs().max()))
            else:
                assert float((lg[i] - logs[i]).norm() / logs[i].norm()) < 1e-3  # CPU BLAS: B rows vs 1 row
    # a wrong draft: rows up to the first wrong token agree; decoding on from the kept tokens is still plain
    m.prefill(prompt, 2, 0)
    bad = [(t + 1) % V for t in toks[3:7]]
    ids, _ = m.verify(toks[:3] + bad, P, 2)
    assert ids[:3] == toks[1:4]
    kept = toks[:4]  # 2 drafts accepted + the model's own next token (rows 3.. are stale K/V past the end)
    for i in range(len(kept) - 1, 10):
        nxt, _ = m.decode([kept[-1]], [P + i], [2])
        kept.append(nxt[0])
    assert kept == toks[:11]
    check_tree_verify(m, prompt, toks, logs, bitwise)


def check_tree_verify(m: GPUModel, prompt: list[int], toks: list[int], logs: list, bitwise: bool):
    """A draft tree in one step: each node's row is the one-token step after its root path (bit for bit on the
    GPU), and after keep_path moves the accepted path's K/V into place, plain decoding goes on as plain."""
    V, P = m.cfg.vocab_size, len(prompt)
    w = lambda t: (t + 7) % V  # noqa: E731  a wrong token
    # node: 0 root toks[0]; 1 wrong (child of 0); 2 toks[1] (0); 3 wrong (2); 4 toks[2] (2); 5 toks[3] (4);
    # 6 wrong (1); 7 toks[4] (5): the accepted path is 2, 4, 5, 7 (not the chain's rows 1, 2, 3, 4)
    tokens = [toks[0], w(toks[1]), toks[1], w(toks[2]), toks[2], toks[3], w(toks[2]), toks[4]]
    parents = [-1, 0, 0, 2, 2, 4, 1, 5]
    m.prefill(prompt, 2, 0)
    ids, lg = m.verify(tokens, P, 2, parents=parents)
    for node, step in ((0, 0), (2, 1), (4, 2), (5, 3), (7, 4)):  # on-path nodes: plain step `step`'s logits
        assert ids[node] == toks[step + 1], (node, ids, toks)
        if bitwise:
            assert torch.equal(lg[node], logs[step]), (node, float((lg[node] - logs[step]).abs().max()))
        else:
            assert float((lg[node] - logs[step]).norm() / logs[step].norm()) < 1e-3
    m.keep_path(2, P, [2, 4, 5, 7])
    kept = toks[:6]  # 4 drafts accepted + the argmax of node 7's row
    for i in range(len(kept) - 1, 10):
        nxt, lgi = m.decode([kept[-1]], [P + i], [2])
        if bitwise:
            assert torch.equal(lgi[0], logs[i]), i
        kept.append(nxt[0])
    assert kept == toks[:11]


def test_tree_attention_reference_reads_the_root_path():
    """attention_nowrite_ref over a tree = the chain reference over the root path's rows laid out in order."""
    from kernels.decode_kernels import pack_path
    from kernels.decode_reference import attention_nowrite_ref, tree_rows
    from kernels.ops_reference import Rotary
    torch.manual_seed(0)
    H, Hkv, hd, ctx, base = 4, 2, 64, 64, 20
    rot = Rotary(hd, ctx, 1e6)
    kc, vc = torch.randn(2, Hkv, ctx, hd).half(), torch.randn(2, Hkv, ctx, hd).half()
    qkv = torch.randn(8, (H + 2 * Hkv) * hd).half()
    # node 5 of a tree with path 2 -> 4 -> 5 sits in row base + 5 at position base + 3
    assert tree_rows(base + 5, 5, base + 3, pack_path([2, 4, 5])) == list(range(base + 1)) + [base + 2, base + 4,
                                                                                              base + 5]
    rpos = [base + i for i in range(8)]
    paths = [pack_path(list(range(1, i + 1))) if i else 0 for i in range(8)]
    rpos[5], paths[5] = base + 3, pack_path([2, 4, 5])
    got = attention_nowrite_ref(qkv, kc, vc, [1] * 8, [base + i for i in range(8)], rot.cos, rot.sin, H, Hkv, hd,
                                rpos, paths)[5:6]
    k2, v2 = kc.clone(), vc.clone()
    for j, n in enumerate([2, 4, 5], 1):
        k2[1, :, base + j], v2[1, :, base + j] = kc[1, :, base + n], vc[1, :, base + n]
    want = attention_nowrite_ref(qkv[5:6], k2, v2, [1], [base + 3], rot.cos, rot.sin, H, Hkv, hd)
    assert torch.equal(got, want)


def test_verify_step_on_references_equals_one_token_steps(tmp_path):
    cfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    check_verify_equals_steps(_model(tmp_path, "cpu", cfg, 64), bitwise=False)


def test_speculative_steps_through_gpu_runner_verify_on_references(tmp_path):
    """engine/runtime/speculative.py's CUDA branch (GPURunner: verify step, k <= 7, fused argmax ids) on a CPU
    GPUModel: a right draft, a wrong one, then drafting on its own: the plain greedy tokens."""
    from engine.runtime import speculative
    from engine.runtime.gpu_runner import GPURunner
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence
    cfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    m = _model(tmp_path, "cpu", cfg, 96)
    tok = load_spec(str(tmp_path)).tokenizer
    r = object.__new__(GPURunner)  # the runner's own methods over the CPU model (its __init__ needs CUDA)
    r.model, r.max_context, r.free_slots, r.eos_ids = m, 96, [0, 1], set()
    r.chain_stats = GPURunner.new_chain_stats(m)
    r.cfg = EngineConfig(model=str(tmp_path), device="cpu", max_context=96, max_batch=2, speculative_gpu=True)
    base = torch.randint(0, 1024, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    prompt = base + base[:10]  # something for prompt lookup to copy
    plain = Sequence(prompt, SamplingParams(max_tokens=24, ignore_eos=True), tok)
    r.allocate(plain)
    r.prefill(plain)
    while not plain.finished:
        r.decode([plain])
    want = plain.output_ids
    s = Sequence(prompt, SamplingParams(max_tokens=24, ignore_eos=True, speculative=True), tok)
    r.allocate(s)
    r.prefill(s)
    speculative.step(r, s, want[1:6])  # right: 5 kept + the model's next
    assert s.output_ids == want[:7] and s.spec_accepted == 5
    speculative.step(r, s, [(t + 1) % 1024 for t in want[7:10]])  # wrong: the model's own token only
    assert s.output_ids == want[:8] and s.spec_accepted == 5
    w = lambda t: (t + 1) % 1024  # noqa: E731
    # a tree whose right path is off the chain's rows: nodes 2 -> 4 (rows 1 and 3 hold wrong tokens)
    speculative.step(r, s, [w(want[8]), want[8], w(want[9]), want[9]], "tree", parents=[-1, 0, 0, 2, 2])
    assert s.output_ids == want[:11] and s.spec_accepted == 7
    assert speculative.report(r)["by_source"]["tree"]["tokens_per_step"] == 3.0
    while not s.finished:
        speculative.decode(r, [s])
    assert s.output_ids == want, (s.output_ids, want)


@pytest.mark.gpu
def test_tree_attention_equals_default_kernel_bitwise():
    """decode_attn.cu's _tree kernels (the step's rows rebuilt from qkv, every row written) = one-token steps of
    the default kernel along each node's root path: outputs and written rows bit for bit (chains and a tree)."""
    from engine.runtime.draft_heads import TREE_PARENTS
    from kernels.decode_kernels import AttnWorkspace, DecodeKernels, pack_path, tree_roots
    from kernels.ops_reference import Rotary
    kn = DecodeKernels.get("cuda")
    torch.manual_seed(0)
    for H, Hkv, hd in ((14, 2, 64), (16, 2, 128), (28, 4, 128)):
        ctx, rep = 4096, H // Hkv
        rot = Rotary(hd, ctx, 1e6)
        cos, sin = rot.cos.cuda(), rot.sin.cuda()
        ws = AttnWorkspace(8, H, Hkv, hd, "cuda")
        cases = [(p, B, None) for p, B in ((0, 8), (300, 5), (3000, 8), (63, 2))]
        cases += [(p, len(TREE_PARENTS), TREE_PARENTS) for p in (0, 61, 2999)]
        cases += [(p, 8, [-1, 0, 0, 0, 0, 1, 1, 5]) for p in (0, 2999)]  # an 8-row tree
        for p, B, parents in cases:
            qkv = torch.randn(8, (H + 2 * Hkv) * hd, device="cuda").half()
            kc = torch.randn(3, Hkv, ctx, hd, device="cuda").half()
            vc = torch.randn(3, Hkv, ctx, hd, device="cuda").half()
            roots = tree_roots(parents or [-1] + list(range(B - 1)))  # node b's path: its ancestors, then b
            slots = torch.ones(B, dtype=torch.int32, device="cuda")
            pos = torch.arange(p, p + B, dtype=torch.int32, device="cuda")
            rpos, path = None, None
            if parents is not None:
                rpos = torch.tensor([p + len(r) for r in roots], dtype=torch.int32, device="cuda")
                path = torch.tensor([pack_path(r) for r in roots], dtype=torch.int32, device="cuda")
            k2, v2 = kc.clone(), vc.clone()
            out = torch.zeros(8, H * hd, device="cuda").half()
            kn.attention_tree(qkv, k2, v2, slots, pos, cos, sin, B, Hkv, rep, hd, ctx, out, ws, ws.splits(1),
                              rpos=rpos, path=path)
            torch.cuda.synchronize()
            assert not ws.counters.any()
            # the long-context graphs' path (partials, then attn_merge as its own launch): the same bits
            out_m = torch.zeros_like(out)
            kn.attention_tree(qkv, kc.clone(), vc.clone(), slots, pos, cos, sin, B, Hkv, rep, hd, ctx, out_m, ws,
                              ws.splits(1), rpos=rpos, path=path, merge=True)
            assert torch.equal(out_m[:B], out[:B]), (H, p)
            for b in range(B):  # one token per step along b's root path: the default kernel writes, then attends
                k1, v1 = kc.clone(), vc.clone()
                for d, n in enumerate([0] + roots[b]):
                    meta = torch.tensor([[1], [p + d]], dtype=torch.int32, device="cuda")
                    one = torch.zeros(8, H * hd, device="cuda").half()
                    kn.attention(qkv[n:n + 1].contiguous(), k1, v1, meta[0], meta[1], cos, sin, 1, Hkv, rep, hd, ctx,
                                 one, ws)
                torch.cuda.synchronize()
                depth = len(roots[b])
                assert torch.equal(out[b], one[0]), (H, p, b, float((out[b].float() - one[0].float()).abs().max()))
                assert torch.equal(k2[1, :, p + b], k1[1, :, p + depth]), (H, p, b)
                assert torch.equal(v2[1, :, p + b], v1[1, :, p + depth]), (H, p, b)
            assert torch.equal(k2[:, :, :p], kc[:, :, :p]) and torch.equal(k2[1, :, p + B:], kc[1, :, p + B:])


@pytest.mark.gpu
def test_verify_graphs_equal_one_token_graphs(tmp_path):
    cfg = ModelConfig(**QWEN25_SHAPES["0.5b"])
    cfg.num_layers = 2
    m = _model(tmp_path, "cuda", cfg, 512)
    check_verify_equals_steps(m, bitwise=True)
    assert sorted(m.verify_graphs) == [2, 5, 7, 8], sorted(m.verify_graphs)


@pytest.mark.gpu
def test_real_model_greedy_speculation_identical_gpu():
    from engine.errors import ResourceError
    from engine.hub import store
    from engine.runtime import speculative
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams
    from trayapp.config import default_config
    from trayapp.templates import render_messages
    try:  # the device machine is offline: the real model comes in parts (engine.bench.device --real-model)
        store.pull("qwen2.5-coder-0.5b", quiet=True)
    except ResourceError as e:
        pytest.skip(f"the real 0.5B model is not available here: {e}")
    # prefix cache off: the second request would reuse the first's KV and prefill only its last token through
    # an offset graph, whose fp16 logits equal a fresh prefill's within tolerance but not bit for bit (a near-tie
    # may then flip, which is not speculation's doing); the cache's own test is tests/test_prefill_offset.py
    llm = LLM(EngineConfig(model="qwen2.5-coder-0.5b", device="cuda", max_context=2048, max_batch=2,
                           speculative_gpu=True, prefix_cache_mb=0))
    text = "明天下午三点前把实验报告发给导师，并抄送课题组的其他同学。会议改到周四上午十点，在三楼会议室。"
    cfg = default_config("zh")
    for t in cfg.templates:
        prompt = llm.render(render_messages(t, text, cfg.lang))
        plain = llm.complete(prompt, SamplingParams(max_tokens=48, temperature=0.0))
        spec = llm.complete(prompt, SamplingParams(max_tokens=48, temperature=0.0, speculative=True))
        assert spec.token_ids == plain.token_ids, (t.id, plain.text, spec.text)
    st = speculative.report(llm.runner)
    assert st["accepted"] > 0 and st["verify_steps"] > 0, st
    assert sorted(llm.runner.model.verify_graphs) == list(range(2, 9))


@pytest.mark.gpu
def test_topk_kernel_equals_reference_ties_included():
    from kernels.decode_kernels import DecodeKernels
    from kernels.decode_reference import topk_ref
    kn = DecodeKernels.get("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    for R, N in ((4, 151936), (8, 1024), (1, 7)):
        x = torch.randn(8, N, generator=g)
        x[:, :: 97] = 3.5  # many equal maxima: ties go to the lower id
        x[0, 5] = float("-inf")
        out = torch.zeros(8, 4, dtype=torch.int64, device="cuda")
        for _ in range(2):  # the counters are reset for the next launch
            kn.topk(x.cuda(), R, out)
            torch.cuda.synchronize()
            assert torch.equal(out[:R].cpu(), topk_ref(x[:R])), (R, N, out[:R].tolist(), topk_ref(x[:R]).tolist())


@pytest.mark.gpu
def test_move_rows_kernel_equals_reference():
    from kernels.decode_kernels import DecodeKernels
    from kernels.decode_reference import move_rows_ref
    kn = DecodeKernels.get("cuda")
    for hd in (64, 128):
        kc = torch.randn(3, 2, 2, 64, hd).half()
        vc = torch.randn(3, 2, 2, 64, hd).half()
        for nodes in ([2, 3], [1, 4, 5, 7], [3], [1, 2]):
            k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.cuda(), vc.cuda()
            move_rows_ref(k1, v1, 1, 20, nodes)
            kn.move_rows(k2, v2, 1, 20, nodes)
            torch.cuda.synchronize()
            assert torch.equal(k2.cpu(), k1) and torch.equal(v2.cpu(), v1), (hd, nodes)


def _accept_case(device: str, ids: list[int], toks: list[int]):
    """spec_accept's inputs for an 8-row tree (parents [-1, 0, 0, 0, 0, 1, 1, 5]: head 1's four best, head 2's two
    under its best, head 3's best under that) at start 40 of slot 1."""
    parents = [-1, 0, 0, 0, 0, 1, 1, 5]
    meta = torch.zeros(5, 8, dtype=torch.int32)
    meta[0] = torch.tensor(toks)
    meta[1] = torch.arange(40, 48)
    meta[2] = 1
    keys = torch.tensor([((0x3F800000 | 0x80000000) << 32 | (0xFFFFFFFF - i)) - (1 << 63) for i in ids],
                        dtype=torch.int64)  # orderable(1.0) << 32 | ~id, as the GEMV writes it (int64 view)
    x = torch.randn(8, 64).half()
    bufs = [torch.zeros(8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), torch.zeros(64).half(),
            torch.zeros(8, dtype=torch.int32)]
    return [t.to(device) for t in (meta, keys, x, *bufs)], parents


@pytest.mark.parametrize("ids,path", [
    ([12, 0, 0, 0, 0, 0, 0, 0], []),  # nothing accepted: the root's argmax only
    ([102, 0, 50, 0, 0, 0, 0, 0], [2]),  # head 1's second token, then its row's argmax
    ([101, 106, 0, 0, 0, 105, 60, 0], [1, 6]),  # off the chain's rows
    ([101, 105, 0, 0, 0, 107, 0, 70], [1, 5, 7]),  # the deepest path
])
def test_accept_reference_walks_the_tree(ids, path):
    from kernels.decode_reference import accept_ref
    toks = [9, 101, 102, 103, 104, 105, 106, 107]
    (meta, keys, x, out, margs, hh, htok), parents = _accept_case("cpu", ids, toks)
    accept_ref(meta, keys, parents, 8, x, out, margs, hh, htok)
    last = path[-1] if path else 0
    kept = [toks[n] for n in path] + [ids[last]]
    assert out[0] == len(kept) and out[1:1 + len(kept)].tolist() == kept
    assert margs.tolist() == [40, sum(n << 3 * j for j, n in enumerate(path)), len(path), 1]
    ns = 40 + len(kept)
    assert meta[0, 0] == ids[last] and meta[1].tolist() == list(range(ns, ns + 8))
    assert meta[3].tolist() == [ns + d for d in (0, 1, 1, 1, 1, 2, 2, 3)]
    assert torch.equal(hh, x[last]) and htok[0] == ids[last]


@pytest.mark.gpu
def test_accept_kernel_equals_reference():
    from kernels.decode_kernels import DecodeKernels
    from kernels.decode_reference import accept_ref
    kn = DecodeKernels.get("cuda")
    toks = [9, 101, 102, 103, 104, 105, 106, 107]
    for ids in ([12, 0, 0, 0, 0, 0, 0, 0], [102, 0, 50, 0, 0, 0, 0, 0], [101, 106, 0, 0, 0, 105, 60, 0],
                [101, 105, 0, 0, 0, 107, 0, 70]):
        ref, parents = _accept_case("cpu", ids, toks)
        gpu = [t.cuda() for t in ref]
        accept_ref(*ref[:2], parents, 8, *ref[2:])
        kn.spec_accept(gpu[0], gpu[1], parents, 8, *gpu[2:])
        torch.cuda.synchronize()
        for a, b in zip(ref, gpu):
            assert torch.equal(a, b.cpu()), (ids, a, b)


@pytest.mark.gpu
def test_gemv_rows_are_one_row_launches_bit_for_bit_in_every_layout():
    """A verify step's rows are one-token steps' bits only if every GEMV's row b of a B-row launch equals a one-row
    launch of it: checked for W4 g128 and every GGUF layout and form the real models load (the plain repacks, KQ,
    SYM), every epilogue (store + bias, resid, silu, logits + argmax), B = 2..8, with the step's own plans. The
    references make it so by construction (decode_reference.gemv_ref); `spec_diff --device ref` then finds the real
    0.5B's translate text 0 identical with the prefix cache on, so a GPU parting must come from kernel bits."""
    from kernels.checks_gguf import rand_layout
    from kernels.decode_kernels import DecodeKernels
    kn, dev = DecodeKernels.get("cuda"), torch.device("cuda")
    gen = torch.Generator().manual_seed(11)
    bad = []
    for bits, group, form in _layouts():
        K = 1024 if form == "kq" else 896  # KQ: super-blocks of 256
        for epi, N in (("store", 1152), ("resid", 896), ("silu", 2 * 4864), ("logits", 32768)):
            w, _ = rand_layout(N, K, bits, group, gen, dev, bias=epi == "store", form=form)
            x = torch.randn(8, K, generator=gen).half().to(dev)
            h0 = torch.randn(8, N, generator=gen).to(dev)

            def run(rows: torch.Tensor, B: int):
                # rows >= B: another step's leftovers in a real step; garbage, different per launch
                xx = (torch.randn(8, K, generator=gen) * 4).half().to(dev)
                xx[:B] = rows
                keys = torch.zeros(8, dtype=torch.int64, device=dev)
                if epi == "resid":  # B > 1 only (a one-row resid starts at its own row of h0, below)
                    out = h0.clone()
                elif epi == "logits":
                    out = torch.zeros(8, N, device=dev)
                else:
                    out = torch.zeros(B, N // 2 if epi == "silu" else N, dtype=torch.float16, device=dev)
                kn.gemv(w, xx, B, epi, out, keys if epi == "logits" else None)
                return out[:B], keys[:B]

            for B in (2, 3, 7, 8):
                many, mkeys = run(x[:B], B)
                for b in range(B):
                    if epi == "resid":  # one row at h0[b]
                        xx = x[b:b + 1]
                        out = h0[b:b + 1].repeat(8, 1)
                        xz = (torch.randn(8, K, generator=gen) * 4).half().to(dev)
                        xz[:1] = xx
                        kn.gemv(w, xz, 1, epi, out)
                        one, okeys = out[:1], None
                    else:
                        one, okeys = run(x[b:b + 1], 1)
                    if not torch.equal(many[b], one[0]) or (okeys is not None and int(mkeys[b]) != int(okeys[0])):
                        bad.append((bits, group, form, epi, B, b, float((many[b].float() - one[0].float()).abs().max())))
    torch.cuda.synchronize()
    assert not bad, bad[:10]


def _layouts(*extra: tuple[int, int, str]) -> list[tuple[int, int, str]]:
    """(bits, group, form) of W4 g128, every GGUF layout and form the real models load (plain repacks, KQ, SYM)."""
    from kernels.decode_kernels import GGUF_LAYOUTS, KQ_LAYOUTS, SYM_LAYOUTS
    return [(4, 128, ""), *extra] + [(b, g, "") for b, g in GGUF_LAYOUTS] + \
        [(b, g, "kq") for b, g in KQ_LAYOUTS] + [(b, g, "sym") for b, g in SYM_LAYOUTS]


def _deferred_columns_bad(kn, dev) -> list:
    """Every layout's store (+ bias) and silu consumers of a deferred norm (rs = rstd / sc != 1), 8 rows, then the rows
    with each even / odd pair swapped: the layouts whose outputs do not swap back bit for bit (kernels/checks.py
    columns_alike, whose store bias cancels y * rs: the case where the epilogue's roundings show)."""
    from kernels.checks import columns_alike
    from kernels.checks_gguf import rand_layout
    gen = torch.Generator().manual_seed(12)
    bad = []
    for bits, group, form in _layouts((3, 128, "")):
        K = 1024 if form == "kq" else 896
        wq, _ = rand_layout(1152, K, bits, group, gen, dev, bias=True, form=form)
        wg, _ = rand_layout(2 * 512, K, bits, group, gen, dev, form=form)
        x = torch.randn(8, K, generator=gen).half().to(dev)
        ss = torch.randint(1 << 26, 1 << 30, (2, 8), generator=gen).to(dev)
        if not columns_alike(kn, wq, wg, x, ss, 1e-6):
            bad.append((bits, group, form))
    return bad


def test_deferred_consumers_round_alike_in_every_mma_column_on_the_references():
    """The check's own logic, on the references (row-independent by construction), so the GPU test below tests the
    kernels and not a mistake of its own."""
    from kernels.decode_reference import RefKernels
    assert _deferred_columns_bad(RefKernels(), torch.device("cpu")) == []


@pytest.mark.gpu
def test_deferred_consumers_round_alike_in_every_mma_column():
    """A verify row b sits in column b of the GEMV's mma, the one-token step's token in column 0: with the deferred
    norm's scale the store epilogue once rounded column 0 (FMUL + FADD) unlike columns 1..3 (FFMA) and the H200's
    speculation parted from plain decoding by an ulp (docs/hotpath.md, "The parting found"). Every layout the
    real models load, with a bias that cancels y * rs."""
    from kernels.decode_kernels import DecodeKernels
    assert _deferred_columns_bad(DecodeKernels.get("cuda"), torch.device("cuda")) == []
