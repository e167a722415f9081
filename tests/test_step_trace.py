"""engine/bench/step_trace.py's bookkeeping on a synthetic trace: kernel kinds by name and position, steps cut at the
embedding, each kernel's added time = its end minus the previous end (PDL overlap), summing to the step span."""
from engine.bench.step_trace import attribute, label_kernels, split_steps

LAYER = ["gemv_w4_store", "attn_decode_hd128", "gemv_w4_resid", "gemv_w4_silu", "gemv_w4_resid"]


def test_kinds_follow_the_step_order():
    names = ["embed_rows"] + LAYER * 2 + ["rmsnorm_rows", "gemv_w4_logits"]
    assert label_kernels(names) == ["embed"] + ["qkv", "attention", "o", "gate_up", "down"] * 2 + ["norm", "lm_head"]
    assert label_kernels(["gemv_w3_store", "attn_decode_hd64", "attn_merge_hd64", "gemv_w3_resid_mt2"]) == \
        ["qkv", "attention", "merge", "o"]


def test_added_time_is_end_minus_previous_end():
    names = ["embed_rows"] + LAYER + ["rmsnorm_rows", "gemv_w4_logits"]
    events, t = [], 0.0
    for rep in range(4):
        for i, n in enumerate(names):
            start = t - (1.0 if i else 0.0)  # each kernel starts 1 us before its predecessor ends (PDL)
            events.append({"name": n, "ts": start, "end": t + 2.0 + i})
            t = t + 2.0 + i
        t += 5.0  # host gap between replays
    steps = split_steps(events)
    assert len(steps) == 2 and all(len(s) == len(names) for s in steps)  # the first and last replay dropped
    r = attribute(steps)
    assert r["steps"] == 2
    assert abs(sum(k["added_us_per_step"] for k in r["kinds"].values()) - r["step_span_us"]) < 1e-9
    assert r["kinds"]["qkv"]["added_us_per_launch"] == 3.0  # i = 1: 2 + 1 us after the embedding's end
    assert r["kinds"]["qkv"]["own_us_per_launch"] == 4.0  # it started 1 us early
    assert r["kinds"]["embed"]["launches_per_step"] == 1 and r["kinds"]["gate_up"]["launches_per_step"] == 1
