"""Only the package list: assets/ (a data folder at the repo root, not a Python package) is installed as
the package `deepinfer_assets`, so non-editable installs carry the tokenizer, chat template, icons and
templates; engine/assets_path.py looks in the checkout first, then there. Metadata: pyproject.toml."""
from setuptools import find_namespace_packages, setup

ASSETS = ["deepinfer_assets", "deepinfer_assets.icons", "deepinfer_assets.templates", "deepinfer_assets.drafters"]

setup(
    packages=find_namespace_packages(include=["engine*", "kernels*", "trayapp*"]) + ASSETS,
    package_dir={"deepinfer_assets": "assets"},
    package_data={"kernels": ["*.cu", "*.cuh"], **{p: ["*"] for p in ASSETS}},
)
