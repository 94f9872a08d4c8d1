"""Element-aligned views: an array need only be aligned to its element size.
Views an engine hands over -- a slot range of a bigger cache, a dpnp slice -- start anywhere on
an element boundary, not on the 64-byte boundary of an allocation; the kernels' wider accesses
(16-wide vectors, the CPU device's streaming stores of spec states) must fall back, never refuse
or misread. Here ssm_state, conv_state, mixed_qkv, a, b and core_attn_out are each one element
into a larger USM allocation (described as dpnp describes a slice: the allocation's address and
an SUAI offset in elements), as is the caller's workspace (4 bytes in), and a mixed batch
(prefill, decodes, spec) must give results equal, bit for bit, to the same call on aligned
arrays. (The refusal of a pointer that is not
element-aligned is in test_validation.py.)

Shapes and dtypes of test_attention / test_delta_rule (H=1, HV=2, K=V=16, f32 vk/kv, bf16 kv) and,
with bf16 states (the streaming stores' fallback for them), of test_state_caches: no new kernel
builds."""
import numpy as np
import pytest

import pygdn
from pygdn.batch import make_batch, to_device
from helpers import conv_from_canonical, quantize, ssm_from_canonical

H, HV, K, V, W, S, SLOTS = 1, 2, 16, 16, 4, 2, 12


class OffsetView:
    """`shape` elements starting `offset` elements into the UsmArray `base`."""

    def __init__(self, base, shape, offset):
        self.base, self.shape, self.offset = base, tuple(shape), offset

    @property
    def __sycl_usm_array_interface__(self):
        s = dict(self.base.__sycl_usm_array_interface__)
        s.update(shape=self.shape, offset=self.offset)
        return s

    @property
    def address(self):
        return self.base.__sycl_usm_array_interface__["data"][0] + self.offset * self.base.dtype.itemsize

    def to_numpy(self):
        n = int(np.prod(self.shape))
        return self.base.to_numpy().reshape(-1)[self.offset:self.offset + n].reshape(self.shape)


def place(queue, array, offset):
    flat = np.zeros(array.size + offset + 16, array.dtype)
    flat[offset:offset + array.size] = array.reshape(-1)
    return OffsetView(pygdn.UsmArray.from_numpy(flat, queue), array.shape, offset)


def run(queue, dtype, layout, offset, state_dtype="f32"):
    rng = np.random.default_rng(44)
    meta = make_batch(rng, num_slots=SLOTS, prefill_lens=[70], num_decodes=2, spec_lens=[3, 2], num_spec=S,
                      order="random")
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype=dtype, ssm_layout=layout, conv_layout="time_major", conv_spec_layout="rolled",
                       conv_state_len=W - 1 + S, state_dtype=state_dtype)
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    act = lambda *shape: quantize(rng.standard_normal(shape), dtype)[0]  # noqa: E731
    x, a, b, w, bias = act(T, C), act(T, HV), act(T, HV), act(C, W), act(C)
    conv0 = act(SLOTS, C, W - 1 + S)
    ssm0 = (rng.standard_normal((SLOTS, HV, K, V)) * 0.5).astype(np.float32)
    A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
    views = dict(mixed_qkv=place(queue, x, offset), a=place(queue, a, offset), b=place(queue, b, offset),
                 conv_state=place(queue, conv_from_canonical(conv0, "time_major"), offset),
                 ssm_state=place(queue, quantize(ssm_from_canonical(ssm0, layout), state_dtype)[0], offset),
                 core_attn_out=place(queue, quantize(np.zeros((T, HV, V)), dtype)[0], offset))
    batch = to_device(meta, queue)
    # The caller's workspace, 4 bytes (its required alignment) past a 64-byte boundary: the call
    # aligns its scratch within the workspace's slack (the CPU chunk prep streams W, U and Aqk out
    # in 64-byte stores, which fault on a misaligned address).
    ws = place(queue, np.zeros(-(-pygdn.workspace_size(cfg, batch) // 4), np.float32), offset)
    if offset:
        for name, v in dict(views, workspace=ws).items():
            assert v.address % v.base.dtype.itemsize == 0 and v.address % 64 != 0, name
    pygdn.attention(queue, cfg, batch, workspace=ws, conv_weight=pygdn.UsmArray.from_numpy(w, queue),
                    conv_bias=pygdn.UsmArray.from_numpy(bias, queue), A_log=pygdn.UsmArray.from_numpy(A_log, queue),
                    dt_bias=pygdn.UsmArray.from_numpy(dt_bias, queue), **views)
    queue.wait()
    return {name: views[name].to_numpy() for name in ("core_attn_out", "conv_state", "ssm_state")}


@pytest.mark.parametrize("dtype,layout,state_dtype", [("f32", "vk", "f32"), ("f32", "kv", "f32"), ("bf16", "kv", "f32"),
                                                     ("f32", "vk", "bf16"), ("f32", "kv", "bf16")])
def test_element_aligned_views_equal_aligned_arrays(queue, dtype, layout, state_dtype):
    aligned = run(queue, dtype, layout, 0, state_dtype)
    shifted = run(queue, dtype, layout, 1, state_dtype)
    for name in aligned:
        assert np.array_equal(aligned[name], shifted[name]), f"{name}: a view one element in differs"
