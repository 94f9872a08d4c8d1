"""What the test modules share (conftest.py keeps the fixtures): the test queue, activation-dtype
rounding, the library's cache layouts <-> the reference's, USM upload, the error assertion.
Test modules import from here (or from op_checks.py), never from each other."""
import os
import shutil
import subprocess

import numpy as np

import pygdn  # sets OCL_ICD_FILENAMES before dpctl starts the runtime
import dpctl
from pygdn import _lib

C_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c")

ACT_DTYPES = ["f32", "f16", "bf16"]
# Relative tolerances for outputs computed in f32 from inputs of the activation dtype and
# rounded once to it at the end (plus one intermediate rounding for the conv output).
RTOL = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}


def default_queue():
    """An in-order queue on GDN_TEST_DEVICE (a dpctl filter string, e.g. "cpu", "level_zero:gpu"),
    else on the default SYCL device."""
    device = os.environ.get("GDN_TEST_DEVICE")
    return dpctl.SyclQueue(device, property="in_order") if device else dpctl.SyclQueue(property="in_order")


def quantize(x, dtype):
    """float array -> (storage array for the device, its exact value as float64)."""
    x = np.asarray(x, np.float32)
    if dtype == "f32":
        return x.copy(), x.astype(np.float64)
    if dtype == "f16":
        h = x.astype(np.float16)
        return h, h.astype(np.float64)
    bits = pygdn.to_bf16_bits(x)
    return bits, pygdn.from_bf16_bits(bits).astype(np.float64)


def dequantize(stored, dtype):
    if dtype == "bf16":
        return pygdn.from_bf16_bits(stored).astype(np.float64)
    return np.asarray(stored).astype(np.float64)


def usm(queue, array):
    return pygdn.UsmArray.from_numpy(np.ascontiguousarray(array), queue)


class EditedSUAI:
    """A USM array `base` seen through a copy of its __sycl_usm_array_interface__ dict that
    edit(dict) changes on every read (other strides, a read-only flag, ...)."""

    def __init__(self, base, edit):
        self.base, self._edit = base, edit

    @property
    def __sycl_usm_array_interface__(self):
        d = dict(self.base.__sycl_usm_array_interface__)
        self._edit(d)
        return d


def conv_to_canonical(state, layout):
    """library conv_state -> reference [slots, C, state_len]."""
    return state if layout == "dim_major" else np.swapaxes(state, 1, 2)


def conv_from_canonical(state, layout):
    return np.ascontiguousarray(state if layout == "dim_major" else np.swapaxes(state, 1, 2))


def ssm_to_canonical(state, layout):
    """library ssm_state -> reference [slots, HV, K, V]."""
    return state if layout == "kv" else np.swapaxes(state, 2, 3)


def ssm_from_canonical(state, layout):
    return np.ascontiguousarray(state if layout == "kv" else np.swapaxes(state, 2, 3))


def assert_close(got, want, rtol, what):
    """Relative error against the largest magnitude of the reference (robust near zeros)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: non-finite values"
    scale = max(np.max(np.abs(want)), 1e-6) if want.size else 1.0
    err = np.max(np.abs(got - want)) / scale if want.size else 0.0
    assert err <= rtol, f"{what}: max error {err:.3g} (relative to max |ref| {scale:.3g}) > {rtol}"


def build_c_program(source, out_dir, opt="-O1"):
    """Compiles a C program of tests/c against the installed header and library (as a C consumer
    of the wheel would: the wheel ships no executables); returns the executable's path."""
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    exe = os.path.join(str(out_dir), os.path.splitext(os.path.basename(source))[0])
    built = subprocess.run([cc, "-std=c99", opt, "-Wall", source, "-o", exe, *_lib.c_build_args(), "-lm"],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    return exe
