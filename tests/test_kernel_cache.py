"""The kernel caches: a second process's first conv call must be >= 5x faster than a cold one
(the SYCL runtime's persistent cache, switched on by the library), and in-process calls reuse
the compiled kernels."""
import json
import os
import subprocess
import sys
import time

import numpy as np

import pygdn
from pygdn.batch import make_batch, to_device
from helpers import usm

CHILD = r"""
import json, sys, time
import numpy as np
import pygdn, dpctl
from pygdn.batch import make_batch, to_device
q = dpctl.SyclQueue(property="in_order")
cfg = pygdn.Config(num_k_heads=1, num_v_heads=1, head_k_dim=8, head_v_dim=8, num_slots=4, conv_width=4,
                   act_dtype="f32", conv_layout="dim_major")
meta = make_batch(np.random.default_rng(0), num_slots=4, num_decodes=2)
arr = lambda shape: pygdn.UsmArray.from_numpy(np.ones(shape, np.float32), q)
args = dict(mixed_qkv=arr((2, cfg.conv_dim)), conv_weight=arr((cfg.conv_dim, 4)), conv_state=arr(cfg.conv_state_shape),
            conv_out=arr((2, cfg.conv_dim)))
batch = to_device(meta, q)
t0 = time.perf_counter()
pygdn.causal_conv1d(q, cfg, batch, **args)     # first call: compile or load from the disk cache
first = time.perf_counter() - t0
t0 = time.perf_counter()
pygdn.causal_conv1d(q, cfg, batch, **args)     # in-process: the memoised kernel
second = time.perf_counter() - t0
print(json.dumps({"first": first, "second": second}))
"""


def run_child(cache_dir):
    env = dict(os.environ, SYCL_CACHE_DIR=str(cache_dir))
    env.pop("SYCL_CACHE_PERSISTENT", None)  # the library turns it on itself
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600,
                         cwd=cache_dir.parent)  # not the repo: its pygdn/ would shadow the installed one
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_starts_fast(tmp_path):
    cold = run_child(tmp_path / "cache")
    warm = run_child(tmp_path / "cache")
    ratio = cold["first"] / warm["first"]
    print(f"\nfirst conv call: cold process {cold['first'] * 1e3:.0f} ms, second process {warm['first'] * 1e3:.0f} ms "
          f"({ratio:.1f}x); next call in-process {warm['second'] * 1e3:.2f} ms")
    assert any((tmp_path / "cache").iterdir()), "nothing was written to the persistent cache"
    assert ratio >= 5.0, f"second process only {ratio:.1f}x faster (cold {cold['first']:.3f} s, warm {warm['first']:.3f} s)"
    assert warm["second"] < warm["first"]


def test_disk_cache_can_be_disabled(tmp_path):
    cache_dir = tmp_path / "off"
    env = dict(os.environ, SYCL_CACHE_DIR=str(tmp_path / "off"), GDN_XPU_DISK_CACHE="0")
    env.pop("SYCL_CACHE_PERSISTENT", None)
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600,
                         cwd=cache_dir.parent)  # not the repo: its pygdn/ would shadow the installed one
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "off").exists() or not any((tmp_path / "off").iterdir())
