"""The GPU branches of `deepinfer doctor` on a CPU machine: the hardware edge (torch.cuda's device
queries, nvidia-smi) is faked; the decisions and messages are the real ones."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.doctor import checks as dc
GIB = 1 << 30
SMI = "| NVIDIA-SMI 550.54.14   Driver Version: 550.54.14   CUDA Version: {cuda}   |\n"


class FakeCuda:
    def __init__(self, available=True, cc=(8, 6), total=4 * GIB, free=3.5 * GIB, archs=("sm_80", "sm_86", "sm_90")):
        self.available, self.cc, self.total, self.free, self.archs = available, cc, int(total), int(free), archs

    def is_available(self):
        return self.available

    def get_device_properties(self, i):
        return SimpleNamespace(name="NVIDIA GeForce RTX 3050 Laptop GPU", major=self.cc[0], minor=self.cc[1])

    def mem_get_info(self, i=0):
        return self.free, self.total

    def get_arch_list(self):
        return list(self.archs)


def fake_torch(cuda_build="12.8", **kw):
    return SimpleNamespace(__version__="2.13.0+" + (f"cu{cuda_build.replace('.', '')}" if cuda_build else "cpu"),
                           version=SimpleNamespace(cuda=cuda_build), cuda=FakeCuda(**kw))


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """Put a fake nvidia-smi reporting the given driver CUDA version first on PATH."""
    def put(cuda: str | None):
        exe = tmp_path / "nvidia-smi"
        exe.write_text("#!/bin/sh\n" + (f"echo '{SMI.format(cuda=cuda).strip()}'\n" if cuda else "exit 9\n"))
        exe.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return put


def test_gpu_ready(smi):
    smi("12.9")
    ctx = {"torch": fake_torch()}
    c = dc.check_cuda(ctx)
    assert c.status == "ok" and c.summary == "CUDA 12.8 available (driver supports CUDA 12.9)" and ctx["gpu"]
    g = dc.check_gpu(ctx)
    assert g.status == "ok"
    assert g.summary == "NVIDIA GeForce RTX 3050 Laptop GPU, compute capability 8.6, 4.0 GiB total, 3.5 GiB free"
    assert ctx["vram_free"] == int(3.5 * GIB)


def test_vram_held_by_other_programs(smi):
    smi("12.9")
    ctx = {"torch": fake_torch(free=1 * GIB), "gpu": True}
    g = dc.check_gpu(ctx)
    assert g.status == "warn" and "other programs hold 3.0 GiB" in g.summary and "WDDM" in g.summary
    assert "close other GPU programs" in g.fix


def test_torch_without_kernels_for_this_card(smi):
    smi("12.9")  # an RTX 50xx (sm_120) with a torch built only up to sm_90
    g = dc.check_gpu({"torch": fake_torch(cc=(12, 0)), "gpu": True})
    assert g.status == "warn" and "no kernels for sm_120" in g.summary
    assert "cu128" in g.fix and "--index-url https://download.pytorch.org/whl/cu128" in g.fix


def test_cpu_torch_on_a_gpu_machine(smi):
    smi("12.4")
    c = dc.check_cuda({"torch": fake_torch(cuda_build=None, available=False)})
    assert c.status == "warn" and "torch is the CPU build" in c.summary and "CPU path works" in c.summary
    assert c.fix == "run the installer again without --cpu (it picks torch cu126 + cupy-cuda12x)"


def test_cuda_torch_newer_than_the_driver(smi):
    smi("11.8")
    c = dc.check_cuda({"torch": fake_torch(cuda_build="12.8", available=False)})
    assert c.status == "warn" and "cannot use the GPU (driver supports CUDA 11.8)" in c.summary
    assert "update the NVIDIA driver" in c.fix


def test_cupy_missing_on_a_gpu_machine(smi):
    # CuPy is not installed on the CI machine: this is the real ImportError path
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    smi("13.0")
    c = dc.check_cupy({"gpu": True})
    assert c.status == "warn" and c.fix == "pip install cupy-cuda13x"


def test_no_driver_at_all(smi):
    smi(None)  # nvidia-smi present but failing: no driver
    c = dc.check_cuda({"torch": fake_torch(cuda_build=None, available=False)})
    assert c.status == "warn" and c.summary.startswith("no NVIDIA GPU found")
    assert "--cpu-weights int8" in c.fix and c.data["cpu_int4_kernel"] is False  # a torch without the int4 kernel
    import torch
    c = dc.check_cuda({"torch": torch})  # this torch (CPU build, no driver here): the int4 kernel is there
    if not torch.cuda.is_available():
        assert c.data["cpu_int4_kernel"] and "--cpu-weights int4" in c.fix
