"""The sampling kernels (kernels/decode_sample.cu smp_*) and their reference (kernels/sample_reference.py): the
reference and sampling.pick_index (the CPU's topk and head paths too) draw what a plain float64 reading of the
semantics draws (temperature, top_k, top_p, the inverse CDF of one uniform over the canonical order); on a GPU the
kernels draw the reference's tokens on vocabulary-wide rows (peaked rows through the gathered prefix, flat ones
through the row-wide search), leave rows of temperature 0 alone, and a row draws the same token alone or in a
batch."""
import math

import pytest
import torch

from engine.runtime.sampling import SamplingParams, pick_index
from kernels.sample_reference import sample_rows_ref

SETTINGS = [(0.7, 0, 0.9), (1.3, 0, 1.0), (0.8, 40, 0.9), (0.3, 5, 1.0), (1.0, 0, 0.05), (2.0, 1000, 0.99)]


def _rows(B: int, V: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * 3
    x[:, ::97] = x[:, 5:6]  # ties: many ids share one value (the canonical order puts the lower id first)
    x[0, :3] = 9.0  # a peaked row with a three-way tie at the top
    return x


def _draw(x: torch.Tensor, settings, us, kn=None) -> list[int]:
    """The rows' tokens by the kernel (kn) or the reference, row r with settings[r] and uniform us[r]."""
    B = x.shape[0]
    prm = torch.tensor([list(s) for s in settings], dtype=torch.float64, device=x.device)
    u = torch.tensor(us, dtype=torch.float64, device=x.device)
    at = torch.zeros(1, dtype=torch.int32, device=x.device)
    keys = torch.full((B,), 7, dtype=torch.int64, device=x.device)
    (kn.sample_rows if kn is not None else sample_rows_ref)(x.contiguous(), prm, u, at, keys, B)
    return [int(0xFFFFFFFF - k) if k != 7 else -1 for k in keys.tolist()]


def _plain(x: torch.Tensor, t: float, k: int, p: float, u: float) -> int:
    """The semantics read plainly in float64 on the host: canonical order, top_k, masses, top_p, inverse CDF."""
    order = sorted(range(x.numel()), key=lambda i: (-float(x[i]), i))
    if 0 < k < len(order):
        order = order[:k]
    top = float(x[order[0]])
    mass = [math.exp(float(x[i]) / t - top / t) for i in order]
    total = math.fsum(mass)
    if p < 1.0:
        acc, keep = 0.0, len(order)
        for j, w in enumerate(mass):
            acc += w
            if acc >= p * total:
                keep = j + 1
                break
        order, mass = order[:keep], mass[:keep]
    target, acc = u * math.fsum(mass), 0.0
    for i, w in zip(order, mass):
        acc += w
        if acc > target:
            return i
    return order[-1]


def test_reference_and_pick_index_draw_what_the_semantics_say():
    x = _rows(len(SETTINGS), 2000)
    g = torch.Generator().manual_seed(1)
    for trial in range(40):
        us = torch.rand(len(SETTINGS), generator=g, dtype=torch.float64).tolist()
        got = _draw(x, SETTINGS, us)
        for r, (t, k, p) in enumerate(SETTINGS):
            want = _plain(x[r], t, k, p, us[r])
            pick = int(pick_index(x[r], SamplingParams(temperature=t, top_k=k, top_p=p),
                                  torch.tensor([us[r]], dtype=torch.float64)))
            assert got[r] == want and pick == want, (trial, r)


def test_reference_leaves_greedy_rows_and_reads_the_counter():
    x = _rows(3, 500)
    prm = torch.tensor([[0.0, 0, 1.0], [0.9, 0, 0.95], [0.0, 0, 1.0]], dtype=torch.float64)
    keys = torch.tensor([11, 12, 13], dtype=torch.int64)
    u = torch.tensor([0.9, 0.9, 0.1, 0.2], dtype=torch.float64)
    sample_rows_ref(x, prm, u, torch.tensor([2], dtype=torch.int32), keys, 3)
    assert keys[0] == 11 and keys[2] == 13  # temperature 0: untouched
    want = int(pick_index(x[1], SamplingParams(temperature=0.9, top_p=0.95), torch.tensor([0.2], dtype=torch.float64)))
    assert int(0xFFFFFFFF - keys[1]) == want  # u[at + r] = u[2 + 1]


@pytest.mark.gpu
def test_kernel_draws_the_references_tokens_on_the_gpu():
    from kernels.decode_kernels import DecodeKernels

    kn = DecodeKernels.get("cuda")
    V = 151936
    x = _rows(8, V, seed=3)
    settings = [SETTINGS[r % len(SETTINGS)] for r in range(7)] + [(0.0, 0, 1.0)]
    g = torch.Generator().manual_seed(4)
    for trial in range(20):
        us = torch.rand(8, generator=g, dtype=torch.float64).tolist()
        want = _draw(x.cuda(), settings, us)  # the reference on the GPU: the kernels' expf
        got = _draw(x.cuda(), settings, us, kn)
        assert got[:7] == want[:7] and got[7] == -1, trial  # the temperature-0 row keeps its key
        for r in (0, 3, 6):  # alone: the same token as in the batch
            assert _draw(x[r:r + 1].cuda(), settings[r:r + 1], us[r:r + 1], kn) == got[r:r + 1]


def _hard_rows(V: int) -> torch.Tensor:
    """Rows that take every route of the kernels: peaked (a few tokens hold the mass), flat (the nucleus past 4,096
    tokens: the row-wide search), half masked (-inf), all masked, a large tie at the top, real-model-like."""
    g = torch.Generator().manual_seed(11)
    rows = [torch.randn(V, generator=g) * 6, torch.randn(V, generator=g) * 0.05, torch.randn(V, generator=g)]
    half = torch.randn(V, generator=g) * 2
    half[::2] = float("-inf")
    rows.append(half)
    rows.append(torch.full((V,), float("-inf")))
    tie = torch.randn(V, generator=g)
    tie[torch.randperm(V, generator=g)[:5000]] = 8.0  # 5,000 ids share the max: ordered by id
    rows.append(tie)
    real = torch.randn(V, generator=g) * 2.5  # a bulk near 0 and a handful of strong candidates
    real[torch.randint(0, V, (12,), generator=g)] += torch.linspace(8, 18, 12)
    rows.append(real)
    rows.append(-torch.randn(V, generator=g).abs() * 0.01 - 3.0)  # flat, all negative
    return torch.stack(rows)


@pytest.mark.gpu
def test_kernel_matches_the_reference_on_every_route():
    from kernels.decode_kernels import DecodeKernels

    kn = DecodeKernels.get("cuda")
    x = _hard_rows(151936).cuda()
    B = x.shape[0]
    g = torch.Generator().manual_seed(12)
    settings_sets = [[(0.7, 0, 0.9)] * B, [(1.0, 0, 1.0)] * B, [(1.3, 0, 0.99)] * B, [(0.8, 40, 0.9)] * B,
                     [(1.0, 5000, 1.0)] * B, [(1.5, 100000, 0.95)] * B, [(0.7, 0, 0.0)] * B, [(2.0, 3, 0.5)] * B]
    for settings in settings_sets:
        for trial in range(6):
            us = torch.rand(B, generator=g, dtype=torch.float64).tolist()
            want = _draw(x, settings, us)
            got = _draw(x, settings, us, kn)
            assert got == want, (settings[0], trial)


def test_the_cpus_draw_from_the_head_is_the_full_sorts():
    """The CPU's draw without top_k looks at the 1,024 largest logits first (sampling._pick_cpu_head, ~1 ms against
    a ~14 ms sort of 151,936 on 2 cores): on a peaked row it draws there, on a flat one it falls back to the sort; both draw
    what the semantics say."""
    from engine.runtime import sampling

    g = torch.Generator().manual_seed(7)
    peaked = torch.randn(30000, generator=g) * 6
    flat = torch.randn(30000, generator=g) * 0.1
    flat[123] = flat[456] = flat.max() + 1  # a tie at the top
    used = {"head": 0, "sort": 0}
    for x in (peaked, flat):
        for t, p in [(0.7, 0.9), (1.0, 1.0), (0.3, 1.0), (1.5, 0.5)]:
            sp = SamplingParams(temperature=t, top_p=p)
            for _ in range(6):
                u = float(torch.rand(1, generator=g, dtype=torch.float64))
                ut = torch.tensor([u], dtype=torch.float64)
                used["head" if sampling._pick_cpu_head(x, sp, ut) is not None else "sort"] += 1
                assert int(pick_index(x, sp, ut)) == _plain(x, t, 0, p, u)
    assert used["head"] >= 20 and used["sort"] >= 10  # both ways taken


def test_pick_index_takes_the_canonical_k_among_ties_and_every_route_on_the_cpu():
    """The CPU's top_k path (topk, then the canonical order) keeps the lowest ids where ties straddle the k-th place
    (topk itself may return any of them), and every hard row draws the reference's (full sort's) token."""
    x = _hard_rows(20000)
    B = x.shape[0]
    g = torch.Generator().manual_seed(13)
    for t, k, p in [(1.5, 15000, 0.95), (1.0, 3000, 1.0), (0.7, 0, 0.9), (1.0, 0, 1.0), (2.0, 3, 0.5)]:
        us = torch.rand(B, generator=g, dtype=torch.float64).tolist()
        want = _draw(x, [(t, k, p)] * B, us)
        got = [int(pick_index(x[r], SamplingParams(temperature=t, top_k=k, top_p=p),
                              torch.tensor([us[r]], dtype=torch.float64))) for r in range(B)]
        assert got == want, (t, k, p)
    assert want[4] == 0  # every logit -inf: the first id


def test_the_kernels_route_draws_the_references_token():
    """kernels/sample_route.py walks decode_sample.cu's route in torch (the thresholds' sums, the chosen prefix gathered
    and scanned; when no prefix fits, the histogram's bin ranges gathered and scanned across the bins left out; the
    row-wide search in d when neither fits, finished in key space where d cannot split): on every hard row and
    setting it draws the reference's token, through every route (a small candidate cap sends more rows past the
    prefixes; without the histogram every such row searches)."""
    from kernels import sample_route as smp_mirror

    x = _hard_rows(6000)
    B = x.shape[0]
    g = torch.Generator().manual_seed(14)
    routes = {smp_mirror.NB: set(), 0: set()}
    for t, k, p in [(0.7, 0, 0.9), (1.0, 0, 1.0), (1.3, 0, 0.99), (0.8, 40, 0.9), (1.0, 700, 1.0), (2.0, 3, 0.5),
                    (0.7, 0, 0.0)]:
        us = torch.rand(B, generator=g, dtype=torch.float64).tolist()
        want = _draw(x, [(t, k, p)] * B, us)
        for r in range(B):
            for nb in routes:
                got, route = smp_mirror.pick(x[r], t, k, p, us[r], cap=256, nb=nb)
                routes[nb].add(route)
                assert got == want[r], (t, k, p, r, route)
    assert routes[0] == {"fast", "slow", "slow, keys", "masked"}
    assert routes[smp_mirror.NB] >= {"fast", "hist", "masked"} and routes[smp_mirror.NB] & {"slow", "slow, keys"}
