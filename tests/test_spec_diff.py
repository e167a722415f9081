"""engine/bench/spec_diff.py's cache comparison (the tool that locates where speculative and plain greedy decoding
part, #17): the row / layer a K/V difference starts at and the traced step that wrote it, on tensors and on the real
0.5B's three hot-path runs (CPU)."""
import torch

from engine.bench.hotpath import TEXTS
from engine.bench.spec_diff import Probe, first_diff, kv_parting, runs, writer


def _run(prompt: int, n: int, steps: list) -> dict:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(3, 2, n, 8, generator=g).half()
    return {"prompt": prompt, "k": k, "v": k.clone(), "steps": steps}


def test_kv_parting_names_the_first_row_layer_and_its_writer():
    a = _run(5, 12, [("plain", 1, 1), ("plain", 2, 1), ("plain", 3, 1), ("plain", 4, 1)])
    b = {"prompt": 5, "k": a["k"][:, :, :10].clone(), "v": a["v"][:, :, :10].clone(),
         "steps": [("plain", 1, 1), ("lookup", 2, 4), ("burst", 6, 2)]}
    assert kv_parting(a, b) is None  # the rows both hold are the same bits
    b["v"][2, 1, 7, 3] += 1  # answer token 2 (row 5 + 2) parts in layer 2's v; written by the lookup step
    b["k"][1, 0, 9, 0] += 1  # a later row, not the first
    got = kv_parting(a, b)
    assert got["row"] == 7 and got["answer_token"] == 2 and got["layer"] == 2 and got["max_abs_k"] == 0
    assert got["max_abs_v"] > 0 and got["rows_differing"] == 2 and got["rows_compared"] == 10
    assert got["written_by"] == ["lookup", 2, 4] and got["base_written_by"] == ["plain", 3, 1]
    b["k"][0, 0, 3, 0] += 1  # a prompt row
    assert kv_parting(a, b)["written_by"] == "prefill"
    assert writer([("burst", 6, 3)], 5) == ["burst", 6, 3] and writer([("burst", 6, 3)], 8) is None
    assert first_diff([1, 2, 3], [1, 2]) == 2 and first_diff([1], [1]) is None


def test_probe_records_each_run_and_restores_the_runner(llm):
    r = llm.runner
    with Probe(llm) as probe:
        ids = runs(llm, "rewrite", TEXTS[0], 10)
    assert "release" not in vars(r) and "decode" not in vars(r)  # the class's methods again
    assert ids["chain"] == ids["spec"] == ids["host"]
    warm, a, b, h = probe.runs
    assert a["k"].shape[2] == a["prompt"] + len(ids["chain"]) - 1 == h["k"].shape[2]
    assert kv_parting(a, h) is None  # plain runs write the same rows
    assert any(s[0] == "lookup" for s in b["steps"]), b["steps"]  # a rewrite copies its input: lookup drafted
    assert sum(s[2] for s in b["steps"]) == len(ids["spec"]) - 1  # every token after the prefill's, traced
    got = kv_parting(a, b)  # the CPU verifies a draft in one all-position forward: its rows may differ in low bits
    assert got is None or got["written_by"][0] == "lookup" and max(got["max_abs_k"], got["max_abs_v"]) < 1e-3


def test_the_gpu_runners_code_on_the_references_speculates_to_the_same_cache(tmp_path):
    """`spec_diff --device ref`: the GPU runner's own steps (prefix cache on, prompt lookup through GPUModel.verify)
    over the kernels' CPU references, on a small random Q4_0 file (its answer repeats itself: lookup drafts from the
    third token): the three runs give the same tokens and the same K/V rows, bit for bit (the references' verify rows
    are one-token steps' bits: decode_reference.gemv_ref multiplies each row alone)."""
    import json

    from engine.bench import spec_diff
    from engine.config import ModelConfig
    from engine.quant.random_gguf import write_random_gguf

    cfg = ModelConfig(vocab_size=151936, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=False)
    write_random_gguf(cfg, tmp_path / "r.gguf", ftype="q4_0")
    out = tmp_path / "d.json"
    assert spec_diff.main(["--device", "ref", "--model", str(tmp_path / "r.gguf"), "--template", "rewrite",
                           "--texts", "0", "--configs", "kquant", "--max-tokens", "12", "--kv", "--out",
                           str(out)]) == 0
    row, = json.loads(out.read_text())["runs"]
    assert row["identical"] and row["kv"]["chain/spec"] is None and row["kv"]["chain/host"] is None
    assert any(s[0] == "lookup" and s[2] > 1 for s in row["kv"]["spec_steps"]), row["kv"]["spec_steps"]


def test_verify_rows_finds_the_verify_steps_exact_on_the_references_and_traces_a_parting(tmp_path, monkeypatch):
    """engine/bench/verify_rows.py (#17's bisect without drafters): on the references a verify step's rows are
    one-token steps' bits in chains and trees (K/V and logits); a kernel that lets a verify row drift is found at the
    op that did it by the eager trace."""
    import json

    from engine.bench import verify_rows
    from engine.config import ModelConfig
    from engine.quant.random_gguf import write_random_gguf
    from kernels.decode_reference import RefKernels

    cfg = ModelConfig(vocab_size=151936, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=False)
    write_random_gguf(cfg, tmp_path / "r.gguf", ftype="q4_0")
    out = tmp_path / "v.json"
    args = ["--device", "ref", "--model", str(tmp_path / "r.gguf"), "--tokens", "9", "--heads", "", "--out", str(out)]
    assert verify_rows.main(args) == 0
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"chain", "tree"} and "trace" not in res
    for mode in res["modes"].values():
        assert mode["logit_rows_differing"] == 0 and mode["kv"]["rows_differing"] == 0 and mode["logit_rows"] >= 9

    attention = RefKernels.attention_tree

    def drifting(self, qkv, *a, **k):  # a verify step's row 1 attends a little off: its K/V from layer 1 on part
        attention(self, qkv, *a, **k)
        a[-3][1] += 0.01  # out [B, q]
    monkeypatch.setattr(RefKernels, "attention_tree", drifting)
    assert verify_rows.main(args) == 0
    res = json.loads(out.read_text())
    kv = res["modes"]["chain"]["kv"]
    assert kv["rows_differing"] > 0 and kv["first_layer"] == 1 and kv["from_step_row"][1] == 1, kv
    t = res["trace"]
    assert t["mode"] == "chain" and t["row"] == 1 and t["op"] == ["attention", "attention_tree"], t
    assert t["buffer"] == "attn", t

    # a GEMV whose row 1 rounds differently in a batch (the kind of parting the H200 shows with the deferred norm):
    # the trace names the GEMV, and its probe re-runs it on the recorded inputs to say what the row depends on
    monkeypatch.setattr(RefKernels, "attention_tree", attention)
    gemv = RefKernels.gemv

    def batch_drift(self, w, x, B, epi, out, *a, **k):
        gemv(self, w, x, B, epi, out, *a, **k)
        if epi == "store" and B > 1:
            out[1] += 0.01
    monkeypatch.setattr(RefKernels, "gemv", batch_drift)
    assert verify_rows.main(args) == 0
    t = json.loads(out.read_text())["trace"]
    assert t["op"] == ["gemv", "gemv"] and t["buffer"] == "qkv" and t["row"] == 1, t
    p = t["probe"]
    assert p["x_equal"] and p["rerun_ref_equal_recorded"] and p["rerun_ver_equal_recorded"], p
    assert not p["ver_row_equal_ref"] and p["differing"], p
    # alone (B = 1) or moved to row 0 the row has the one-token step's bits; at row 1 it drifts, whatever the others
    assert p["alone_at_row0_B1"] and p["at_row0_Bv"] and not p["others_zero"] and not p["ref_at_row_b"], p
