"""Draft heads for speculative decoding: Medusa-style heads on the model's last hidden state (heads.py), trained
by self-distillation on the model's own outputs (train.py)."""
