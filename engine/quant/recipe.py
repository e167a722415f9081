"""The calibrated quantizer's recipe: which steps run on each linear, given its calibration Hessian.

    q, s, m = quantize_linear(w [N, K], H [K, K], bits, recipe)

GPTQ (engine/quant/gptq.py), optionally in act-order with static groups, then `refit` rounds of
(least-squares scales/mins with the codes fixed (engine/quant/refit.py), GPTQ again on those fixed
scales/mins), on the bundled calibration set that gives the model's widest Hessian full rank, then `tune`
epochs of end-to-end scale/min tuning against the dense model (engine/quant/tune.py, tune_export.py). The winning
recipe is DEFAULT (chosen by measured perplexity on the real 0.5B and 1.5B: docs/quantization.md,
engine/quant/recipe_search.py); it is recorded in every manifest.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from engine.quant.gptq import DAMP, gptq_prepare, gptq_quantize
from engine.quant.refit import refit_params


@dataclass(frozen=True)
class Recipe:
    act_order: bool = False  # GPTQ column order by decreasing diag(H), static groups
    refit: int = 0  # rounds of refit scales/mins (codes fixed); rounds after the first re-run GPTQ first
    damp: float = DAMP  # GPTQ damping, x mean diag(H)
    awq: bool = False  # per-input-channel scaling search before GPTQ, folded where exact (awq.py)
    embed: str = "rtn"  # the embedding (a lookup, no activations): rtn | clip
    calib: str = "base"  # calibration texts: base | extended | large (calibrate.CALIBRATION_TEXTS) | auto (by width)
    self_tokens: int = 0  # + this many tokens of the model's own sampled text (selfcalib.py); 0: none
    token_cap: float = 0.0  # > 0: a token counts at most this x the mean squared norm in a Hessian (gptq.Hessian)
    asym: float = 0.0  # > 0: GPTQ of the target matching the dense model's outputs, shrunk to W by this (calibrate.asym_target)
    tune: int = 0  # > 0: epochs of end-to-end scale/min tuning after GPTQ, codes fixed (tune.py)
    tune_lr: float = 1e-3  # its Adam learning rate (relative to each group's starting scale)
    tune_norms: bool = False  # the tuning fits the RMSNorm weights too (fp32, stored as they are; tune._Norms)
    tune_sched: str = "const"  # the learning rate over the tuning's steps: const | cos (cosine decay to 0 at the end)

    def __post_init__(self):  # a bad schedule fails when the recipe is named, not after an hour of GPTQ
        from engine.quant.tune import SCHEDS
        if self.tune_sched not in SCHEDS:
            raise ValueError(f"tune_sched {self.tune_sched!r}: " + " or ".join(SCHEDS))

    def as_dict(self) -> dict:
        return asdict(self)

    def but(self, **kw) -> "Recipe":
        return replace(self, **kw)


BASELINE = Recipe()  # the GPTQ of the first calibrated release (w4 8.270 on the real 0.5B)
# + the calibration set by model width (calib="auto", calibrate.calibration_set): the 0.5B on "extended" w4 8.122
# at 1 and 2 threads (bit-identical weights; "large" 8.235), the 1.5B on "large" 5.306 (CPU) / 5.322 (GPU)
# ("extended" 5.382); docs/results/quant_calibration_size_*.json, quant_calibration_large_*.json
# + 3 epochs of end-to-end scale/min tuning at 1e-4 (tune.py, in the export: tune_export.py): 0.5B 8.122 -> 8.117,
# 1.5B 5.322 -> 5.312 on the GPU (held-out KL lower on both); quant_tune_*.json. 35.7 s for the tuned 1.5B run on the
# H200, ~172 s an epoch for the 0.5B on 2 CPU cores (quant_default_tuned_0.5b.json); export --tune-epochs 0 skips it.
# Since 2026-12-03: 1 epoch with the RMSNorm weights tuned too (tune_norms), better on both models and a third of the
# cost: 0.5B 8.1045 (3 epochs of scales/mins: 8.117), 1.5B 5.3025 on 2 CPU cores from the same GPTQ codes as the
# 5.3044 of 3 epochs of scales/mins (quant_tune_norms_*_cpu.json; a second epoch was worse on both: 8.1142, 5.3045)
# Since 2026-12-03 (later): 2 epochs at 4e-4 with a cosine decay to 0 (tune_sched="cos"): the decay lets a 4x higher
# rate help instead of hurt (const 2e-4 was worse than 1e-4). 1.5B 5.2734 (from the CPU GPTQ codes, tuned on the GPU:
# the 1-epoch recipe gives 5.3025 there as on the CPU), 0.5B 8.0836 on 2 CPU cores; the rate sweep on the 1.5B
# (quant_tune_sched_1.5b_gpu.json): 1.5e-4 5.2974, 2e-4 5.2950, 3e-4 5.2849, 4e-4 5.2734, 6e-4 5.2718, 1e-3 5.3097;
# 3 or 4 epochs were worse (5.3023 at 2e-4, 5.3215 at 6e-4)
DEFAULT = Recipe(act_order=True, refit=2, calib="auto", tune=2, tune_lr=4e-4, tune_norms=True, tune_sched="cos")


def quantize_linear(w: torch.Tensor, H: torch.Tensor, bits: int, recipe: Recipe = DEFAULT):
    """w [N, K], H [K, K] -> (q uint8 [N, K], scales fp16, mins fp16 [N, K/128]) on CPU."""
    prep = gptq_prepare(H, recipe.damp, recipe.act_order)
    q, s, m = gptq_quantize(w, H, bits, act_order=recipe.act_order, prep=prep)
    for r in range(recipe.refit):  # 1: GPTQ, refit; 2: GPTQ, refit, GPTQ on those, refit; ...
        if r:
            q, s, m = gptq_quantize(w, H, bits, act_order=recipe.act_order, params=(s, m), prep=prep)
        s, m = refit_params(w, q, s, m, H, damp=recipe.damp)
    return q, s, m
