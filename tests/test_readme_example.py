"""The README's Python example runs as written. dpnp is optional (`pip install pygdn[dpnp]`);
without it a minimal stand-in module backed by pygdn.UsmArray provides the three
functions the example uses, so the example's pygdn calls are exercised either way."""
import os
import re
import sys
import types

import numpy as np

import pygdn

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def python_example():
    text = open(README, encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    return blocks[0]


class _DpnpLike(pygdn.UsmArray):
    """Reports typestrs the way dpnp 0.20 does ('|f4', '|i4': '|' whatever the type)."""

    @property
    def __sycl_usm_array_interface__(self):
        s = dict(super().__sycl_usm_array_interface__)
        s["typestr"] = "|" + self.dtype.str[1:]
        return s


def dpnp_stand_in():
    m = types.ModuleType("dpnp")
    m.asarray = lambda a, sycl_queue: _DpnpLike.from_numpy(np.asarray(a), sycl_queue)
    m.zeros = lambda shape, dtype, sycl_queue: _DpnpLike.from_numpy(np.zeros(shape, dtype), sycl_queue)
    m.empty = lambda shape, dtype, sycl_queue: _DpnpLike(shape, dtype, sycl_queue)
    return m


def test_readme_python_example_runs(monkeypatch):
    try:
        import dpnp  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "dpnp", dpnp_stand_in())
    scope = {}
    exec(compile(python_example(), "README.md", "exec"), scope)
    out = scope["out"]
    host = np.asarray(out.to_numpy() if hasattr(out, "to_numpy") else out.asnumpy())
    assert host.shape == (scope["T"], 32, 128)
    assert np.all(np.isfinite(host)) and np.any(host != 0)
