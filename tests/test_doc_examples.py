"""The documentation's runnable examples run as written and compute the right values. A code block
marked with the line `<!-- runnable: python -->` or `<!-- runnable: c -->` right before its fence, in
README.md or docs/usage.md, is executed here (C blocks compiled against the installed header and
library) and its results are checked against the float64 reference. dpnp is optional: without it a
stand-in module backed by pygdn.UsmArray provides the functions the examples use."""
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from helpers import RTOL, assert_close, build_c_program

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = ("README.md", os.path.join("docs", "usage.md"))
MARK = re.compile(r"<!-- runnable: (python|c) -->\n```\w*\n(.*?)```", re.S)


def runnable_blocks(lang):
    """(document, index, code) of every block marked runnable in `lang`."""
    found = []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        found += [(doc, i, code) for i, (kind, code) in enumerate(MARK.findall(text)) if kind == lang]
    return found


class _DpnpLike(pygdn.UsmArray):
    """Reports typestrs the way dpnp 0.20 does ('|f4', '|i4': '|' whatever the type)."""

    @property
    def __sycl_usm_array_interface__(self):
        s = dict(super().__sycl_usm_array_interface__)
        s["typestr"] = "|" + self.dtype.str[1:]
        return s

    def asnumpy(self):
        return self.to_numpy()


def dpnp_stand_in():
    m = types.ModuleType("dpnp")
    m.asarray = lambda a, sycl_queue: _DpnpLike.from_numpy(np.asarray(a), sycl_queue)
    m.zeros = lambda shape, dtype, sycl_queue: _DpnpLike.from_numpy(np.zeros(shape, dtype), sycl_queue)
    m.empty = lambda shape, dtype, sycl_queue: _DpnpLike(shape, dtype, sycl_queue)
    m.asnumpy = lambda a: a.to_numpy()
    return m


def to_host(a):
    return np.asarray(a.to_numpy() if hasattr(a, "to_numpy") else a.asnumpy())


def run_python_block(code, name, monkeypatch):
    try:
        import dpnp  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "dpnp", dpnp_stand_in())
    scope = {"__name__": "__doc_example__"}
    exec(compile(code, name, "exec"), scope)
    return scope


def test_every_document_has_its_examples():
    assert runnable_blocks("python") and runnable_blocks("c")
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        assert MARK.search(text), f"{doc} has no runnable example"


@pytest.mark.parametrize("doc,index,code", runnable_blocks("python"),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_python_example(doc, index, code, monkeypatch):
    scope = run_python_block(code, f"{doc}[{index}]", monkeypatch)
    if "assert_allclose(" in code:  # the block checks itself against the reference as it runs
        return
    assert (doc, index) == ("README.md", 1), f"{doc}[{index}]: no check for this example"
    check_mtp_step(scope)


def check_mtp_step(s):
    """The README's mixed MTP step: out against the float64 reference (zero initial states)."""
    cfg, h, meta = s["cfg"], s["host"], s["meta"]
    H, HV, K, V, W = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_width
    conv0 = np.zeros((cfg.num_slots, cfg.conv_dim, cfg.conv_state_len))
    ssm0 = np.zeros((cfg.num_slots, HV, K, V))
    want, _, _ = ref.gdn_attention(h["mixed_qkv"], h["a"], h["b"], h["conv_weight"], h["conv_bias"], h["A_log"],
                                   h["dt_bias"], conv0, ssm0, meta, H, HV, K, V, spec_layout=cfg.conv_spec_layout,
                                   z=h["z"], norm_weight=h["norm_weight"])
    got = to_host(s["out"])
    assert got.shape == (s["T"], HV, V)
    assert_close(got, want, RTOL["f32"], "README example out")


def c_block_reference():
    """The README's C program in float64: the same pattern, config and batch."""
    H, HV, K, V, W, SLOTS = 1, 2, 16, 16, 4, 2
    C = 2 * H * K + HV * V

    def pattern(n, seed, scale):
        i = np.arange(n)
        return scale * (((i * 7 + seed) % 13) - 6).astype(np.float64)

    meta = {"num_prefills": 0, "num_decodes": 1, "num_spec_decodes": 0, "num_actual_tokens": 1,
            "non_spec_query_start_loc": np.array([0, 1]), "non_spec_state_indices": np.array([1])}
    out, _, _ = ref.gdn_attention(pattern(C, 1, 0.125).reshape(1, C), pattern(HV, 2, 0.25).reshape(1, HV),
                                  pattern(HV, 3, 0.25).reshape(1, HV), pattern(C * W, 4, 0.0625).reshape(C, W),
                                  None, pattern(HV, 5, 0.125), pattern(HV, 6, 0.125),
                                  pattern(SLOTS * C * (W - 1), 7, 0.125).reshape(SLOTS, C, W - 1),
                                  pattern(SLOTS * HV * K * V, 8, 0.015625).reshape(SLOTS, HV, K, V),
                                  meta, H, HV, K, V)
    return out.reshape(-1)


@pytest.mark.parametrize("doc,index,code", runnable_blocks("c"),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_c_example(doc, index, code, tmp_path):
    src = tmp_path / "example.c"
    src.write_text(code)
    exe = build_c_program(str(src), tmp_path)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout + run.stderr
    got = np.array([float(v) for v in run.stdout.split()])
    assert (doc, index) == ("README.md", 0), f"{doc}[{index}]: no check for this C example"
    assert_close(got, c_block_reference(), RTOL["f32"], "README C example out")
