"""pygdn — Python bindings of libgdn_xpu: Gated DeltaNet attention with speculative decoding
on SYCL devices, through a C ABI (cffi, ABI mode). No torch.

Quick start::

    import dpctl, pygdn
    q = dpctl.SyclQueue("cpu", property="in_order")
    cfg = pygdn.Config(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, ...)
    pygdn.attention(q, cfg, batch, mixed_qkv=..., a=..., b=..., ...)

See docs/usage.md for using it and docs/op.md for the layouts and the metadata of a mixed batch.
"""
from __future__ import annotations

import glob as _glob
import os as _os
import sys as _sys


def _point_opencl_at_wheel_runtime() -> None:
    # pip's intel-opencl-rt ships libintelocl.so but an ICD file pointing at a conda placeholder,
    # so the OpenCL loader finds no CPU device. Must happen before the SYCL runtime starts.
    if "OCL_ICD_FILENAMES" in _os.environ:
        return
    for prefix in (_sys.prefix, _sys.base_prefix):
        hits = _glob.glob(_os.path.join(prefix, "lib", "libintelocl.so"))
        if hits:
            _os.environ["OCL_ICD_FILENAMES"] = hits[0]
            return


_point_opencl_at_wheel_runtime()

# ffi and lib: the raw cffi objects, importable (pygdn.ffi, pygdn.lib) but not part of the API.
from ._lib import ffi, lib, version  # noqa: E402,F401
from ._usm import UsmArray, from_bf16_bits, to_bf16_bits  # noqa: E402
from ._c import GdnError  # noqa: E402
from .batch import Batch  # noqa: E402
from .config import Config  # noqa: E402
from .ops import (PreparedCall, attention, causal_conv1d, flush_replay, gated_delta_rule, prefill_path,  # noqa: E402
                  prepare, warmup, workspace_size)
from .graph import Graph  # noqa: E402

__version__ = version()
__all__ = ["Batch", "Config", "GdnError", "Graph", "UsmArray", "attention", "causal_conv1d", "flush_replay", "gated_delta_rule",
           "PreparedCall", "prefill_path", "prepare", "warmup", "workspace_size", "to_bf16_bits", "from_bf16_bits", "version"]
