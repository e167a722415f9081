"""Programmatic dependent launch (sm_90+): cuLaunchKernelEx with PROGRAMMATIC_STREAM_SERIALIZATION, via ctypes.

A kernel launched this way may start while its predecessor in the stream is still running; it runs its
prologue (weight loads, K/V rows of earlier steps: nothing the predecessor writes) and then waits in
`griddepcontrol.wait` (PDL_WAIT in the .cu files) for the predecessor to finish. Kernels call
`griddepcontrol.launch_dependents` (PDL_TRIGGER) first thing. On older GPUs both are compiled out and
kernels are launched the ordinary way (the same call without the attribute: DecodeKernels launches every
kernel through it). CUDA-graph capture keeps these edges (CUDA >= 12.3).
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

_ATTR_CLUSTER_DIMENSION = 4
_ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5  # CUclusterSchedulingPolicy: 0 default, 1 spread, 2 load balancing
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("i", ctypes.c_int), ("dim", _Dim3)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("nattrs", ctypes.c_uint)]


class PDLLauncher:
    def __init__(self):
        lib = self.lib = ctypes.CDLL("libcuda.so.1")
        self._launch = lib.cuLaunchKernelEx
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.c_void_p]
        self.attr = _Attr()
        self.attr.id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
        self.attr.value.i = 1

    def _bind_primary_context(self):
        ctx = ctypes.c_void_p()
        self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), ctypes.c_int(torch.cuda.current_device()))
        self.lib.cuCtxSetCurrent(ctx)

    def launch(self, func_ptr: int, grid, block, smem: int, stream_ptr: int, args, pdl: bool = True,
               cluster: tuple[int, int, int] | None = None, cluster_policy: int = 0):
        """One launch on stream_ptr; pdl False: an ordinary launch (no attribute; any GPU, CUDA 12+ drivers).
        cluster: thread block cluster dims (sm_90+; each must divide the grid's), e.g. a split-K GEMV's (1, KSB, 1);
        cluster_policy: its scheduling preference where not 0 (1 spread, 2 load balancing)."""
        vals = []
        for a in args:
            if a is None:
                vals.append(ctypes.c_uint64(0))
            elif isinstance(a, np.uint64):
                vals.append(ctypes.c_uint64(int(a)))
            elif isinstance(a, np.int32):
                vals.append(ctypes.c_int32(int(a)))
            elif isinstance(a, np.float32):
                vals.append(ctypes.c_float(float(a)))
            else:
                raise TypeError(f"unsupported kernel argument {type(a)}")
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        attrs = [self.attr] if pdl else []
        if cluster is not None:
            assert all(gi % ci == 0 for gi, ci in zip(g, cluster)), (g, cluster)
            ca = _Attr()
            ca.id = _ATTR_CLUSTER_DIMENSION
            ca.value.dim = _Dim3(*cluster)
            attrs.append(ca)
            if cluster_policy:
                cp = _Attr()
                cp.id = _ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE
                cp.value.i = cluster_policy
                attrs.append(cp)
        arr = (_Attr * len(attrs))(*attrs) if attrs else None
        cfg = _Config(g[0], g[1], g[2], b[0], b[1], b[2], smem, stream_ptr, arr, len(attrs))
        rc = self._launch(ctypes.byref(cfg), func_ptr, params, None)
        if rc == 201:  # CUDA_ERROR_INVALID_CONTEXT: a thread that never touched the device (server thread)
            self._bind_primary_context()
            rc = self._launch(ctypes.byref(cfg), func_ptr, params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {rc}")
