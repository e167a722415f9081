"""kernels/checks.py's own code on the CPU: the GPU checks (tests/test_gpu_decode.py) run only on a device, so a slip
in their plumbing surfaced there first (the thirty-fourth session: the embedding check read the 3B's lm_head weight
instead of the 0.5B's, a shape error before any row was judged). Here the lm_head and embedding checks run on the
references (RefKernels) with a small vocabulary: every row is judged and passes, with the rows and names the GPU
check records."""
import torch

from kernels.checks import lm_head_embed_checks, recorder
from kernels.decode_reference import RefKernels


def test_lm_head_and_embedding_checks_run_on_the_references():
    rows = []
    rec = recorder(rows, lambda *a: None)
    gen = torch.Generator().manual_seed(1234)
    for bits in (4, 3):
        lm_head_embed_checks(RefKernels(), rec, gen, torch.device("cpu"), bits, vocab=512)
    assert [(r["kernel"], r["shape"]) for r in rows[:6]] == [
        ("gemv_w4_logits", (3, 512, 896)), ("gemv_w4_logits", (3, 512, 2048)), ("gemv_w4_logits_ksw4", (3, 512, 2048)),
        ("embed_w4", (3, 896)), ("embed_w4", (3, 5120)), ("embed_w4", (3, 6400))]
    assert len(rows) == 12 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert all(r["argmax_ok"] for r in rows if "logits" in r["kernel"])


def test_deferred_norm_checks_run_on_the_references():
    """defer_checks on the references: besides the plumbing, the identity the deferred norm rests on (a consumer of
    the deferred x equals the same linear on a separate rmsnorm of the same h, within 5e-3) holds in the references."""
    from kernels.checks import defer_checks
    rows = []
    rec = recorder(rows, lambda *a: None)
    defer_checks(RefKernels(), rec, torch.Generator().manual_seed(1234), torch.device("cpu"),
                 shapes=[(256, 512, None), (384, 1024, (4, 2))], vocab=512)
    kinds = {r["kernel"] for r in rows}
    assert {"gemv_w4_resid+defer", "gemv_w4_store+defer", "gemv_w3_silu+defer", "defer row 0 = B 1", "defer column",
            "embed+defer", "copy_rows+defer"} <= kinds
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert all(r["separate_ok"] for r in rows if "separate_ok" in r)
