"""The draft heads (engine/draft/heads.py) as a speculative drafter: proposes up to K tokens from the hidden
state the target's last step left for a sequence (Sequence.hidden, recorded by the runners and by
speculative.step), at the cost of one small GEMV and one K-row lm_head GEMV. No KV cache of its own.

On a CUDA GPU the lm_head is the model's own decode GEMV (packed or dense, the step's fused argmax) on K rows;
on the CPU it is the reference model's head matrix. Optional: EngineConfig.draft_heads ("auto" = the heads
bundled for the model file, if any; "" = none; or a path).
"""
from __future__ import annotations

import logging

import torch

from engine.draft import heads as H

log = logging.getLogger("deepinfer.spec")


class DraftHeads:
    def __init__(self, runner, w: torch.Tensor, b: torch.Tensor, meta: dict, name: str = ""):
        self.runner, self.meta, self.name = runner, meta, name
        self.K = w.shape[0]
        model = runner.model
        self.step_model = hasattr(model, "kn")  # GPUModel (CUDA kernels, or their references on the CPU in tests)
        self.cuda = self.step_model and model.device.type == "cuda"
        if self.step_model:
            from kernels.decode_kernels import MAX_TOKENS
            from kernels.decode_reference import dense_gemv
            dev = model.device
            self.w, self.b = (w.to(dev, torch.float16), b.to(dev, torch.float16)) if self.cuda else (w.float(), b.float())
            c = model.cfg
            self.z = torch.zeros(MAX_TOKENS, c.hidden_size, dtype=torch.float16, device=dev)  # gemv reads 8 rows
            self.logits = torch.zeros(MAX_TOKENS, c.vocab_size, dtype=torch.float32, device=dev)
            self.keys = torch.zeros(MAX_TOKENS, dtype=torch.int64, device=dev)
            self.keys_host = torch.zeros(MAX_TOKENS, dtype=torch.int64, pin_memory=self.cuda)
            head = model.w.lm_head
            self._gemv = {"packed": model.kn.gemv, "dense": dense_gemv}[head.kind]
            self.head = head
            self.K = min(self.K, MAX_TOKENS - 1)  # verify takes 1 + k <= 8 tokens
        else:
            self.w, self.b = w.float(), b.float()
            self.head = model.head_weight()  # [vocab, H]

    @classmethod
    def load(cls, runner, spec, choice: str) -> "DraftHeads | None":
        """choice: "auto" (the bundled heads of the model file on a CUDA GPU, else None), "on" (those on the CPU
        too), "" / "off" (None) or a path (errors raise)."""
        if choice in ("", "off", "none") or choice == "auto" and getattr(runner, "device", "cpu") != "cuda":
            return None
        bundled = choice in ("auto", "on")
        path = H.bundled(spec.source) if bundled else choice
        if path is None:
            return None
        try:
            w, b, meta = H.load(path, spec.config.hidden_size)
        except H.HeadsError:
            if not bundled:
                raise
            log.warning("bundled draft heads unusable, speculation without them", exc_info=True)
            return None
        if meta.get("vocab_size") not in (None, spec.config.vocab_size):
            msg = f"draft heads {path} are for a vocabulary of {meta.get('vocab_size')}, not {spec.config.vocab_size}"
            if not bundled:
                raise H.HeadsError(msg)
            log.warning(msg)
            return None
        return cls(runner, w, b, meta, str(getattr(path, "name", path)))

    @torch.inference_mode()
    def propose(self, seq, k: int) -> list[int]:
        h = getattr(seq, "hidden", None)
        k = min(k, self.K)
        if h is None or k <= 0:
            return []
        if not self.step_model:  # CPU runner: the reference model's head matrix
            z = H.residual(h.float(), self.w[:k], self.b[:k])  # [k, H]
            return (z @ self.head.T).argmax(dim=-1).tolist()
        from kernels.decode_kernels import keys_to_ids
        self.z[:k] = H.residual(h.to(self.w.dtype), self.w[:k], self.b[:k])
        self.keys.zero_()  # the fused argmax keeps the max of 64-bit keys
        self._gemv(self.head, self.z, k, "logits", self.logits, self.keys)
        self.keys_host.copy_(self.keys, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        return keys_to_ids(self.keys_host.numpy()[:k])

    def forget(self, seq):
        seq.hidden = None
