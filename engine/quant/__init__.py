"""Weight-only quantization: packed layouts (pack.py) shared by the CPU reference and GPU kernels."""
