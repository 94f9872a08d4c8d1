"""Host memory and paged caches, as vLLM's CPU build hands them over: NumPy arrays (DLPack kDLCPU)
on a device with usm_system_allocations, passed by address; the conv and SSM caches as two strided
views of ONE allocation (a page per slot: conv state at byte 0, the SSM state after it, slot strides
in elements of each view); a and b rows of one wider row; int64 index arrays and a dt_bias of
neither f32 nor the activations' dtype refused by name.
Values against the float64 reference, addresses against the arrays' own."""
import numpy as np
import pytest

import pygdn
from pygdn import _lib, reference as ref
from pygdn.batch import make_batch
from helpers import assert_close, conv_from_canonical, conv_to_canonical, quantize

H, HV, K, V, W, S, SLOTS = 1, 2, 16, 16, 4, 2, 12
PAGE = 8192  # bytes per slot: conv [W-1+S, C] f32 (1280 B) at byte 0, ssm [HV, K, V] f32 (2048 B) at 1536
SSM_AT = 1536


@pytest.fixture(autouse=True)
def _host_capable(queue):
    if not queue.sycl_device.has_aspect_usm_system_allocations:
        pytest.skip("the device cannot address host memory (no usm_system_allocations)")


def paged_caches(conv, ssm):
    """conv [slots, W-1+S, C] and ssm [slots, HV, K, V] (f32) copied into one page-per-slot buffer;
    returns the buffer and the two strided NumPy views of it."""
    pages = np.zeros(SLOTS * PAGE, np.uint8)
    conv_v = np.lib.stride_tricks.as_strided(pages[:].view(np.float32), conv.shape,
                                             (PAGE,) + conv.strides[1:])
    ssm_v = np.lib.stride_tricks.as_strided(pages[SSM_AT:].view(np.float32), ssm.shape, (PAGE,) + ssm.strides[1:])
    conv_v[...] = conv
    ssm_v[...] = ssm
    return pages, conv_v, ssm_v


def case():
    rng = np.random.default_rng(43)
    meta = make_batch(rng, num_slots=SLOTS, prefill_lens=[70], num_decodes=2, spec_lens=[3, 2], num_spec=S,
                      order="random")
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype="f32", ssm_layout="kv", conv_layout="time_major", conv_spec_layout="rolled",
                       conv_state_len=W - 1 + S, conv_slot_stride=PAGE // 4, ssm_slot_stride=PAGE // 4)
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    ab = f32(T, 2 * HV + 3)  # a and b: columns of one wider row (vLLM's [b|a] split), row stride 2*HV+3
    arrays = dict(mixed_qkv=f32(T, C), a=ab[:, :HV], b=ab[:, HV:2 * HV], conv_weight=f32(C, W), conv_bias=f32(C),
                  A_log=np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32),
                  dt_bias=rng.uniform(-1, 1, HV).astype(np.float32), core_attn_out=np.zeros((T, HV, V), np.float32))
    conv0 = f32(SLOTS, C, W - 1 + S)
    ssm0 = (rng.standard_normal((SLOTS, HV, K, V)) * 0.5).astype(np.float32)
    batch = pygdn.Batch(**meta)  # the host arrays themselves
    return cfg, meta, batch, arrays, conv0, ssm0


def test_host_arrays_and_paged_caches_pass_by_address(queue):
    cfg, meta, batch, arrays, conv0, ssm0 = case()
    pages, conv, ssm = paged_caches(conv_from_canonical(conv0, "time_major"), ssm0)
    call = pygdn.prepare(pygdn.attention, queue, cfg, batch, conv_state=conv, ssm_state=ssm, **arrays)
    c_t = call._c_t
    address = lambda p: int(_lib.ffi.cast("uintptr_t", p))  # noqa: E731
    assert address(c_t.conv_state) == pages.ctypes.data and address(c_t.ssm_state) == pages.ctypes.data + SSM_AT
    for name, arr in arrays.items():
        assert address(getattr(c_t, name)) == arr.ctypes.data, f"{name} was copied"
    assert c_t.ab_stride == 2 * HV + 3 and call._c_cfg.conv_slot_stride == PAGE // 4
    assert address(call._c_batch.non_spec_state_indices) == meta["non_spec_state_indices"].ctypes.data
    call.run()

    T = meta["num_actual_tokens"]
    x = arrays["mixed_qkv"].astype(np.float64)
    want_o, want_conv, want_ssm = ref.gdn_attention(
        x, arrays["a"], arrays["b"], arrays["conv_weight"], arrays["conv_bias"], arrays["A_log"], arrays["dt_bias"],
        conv0.astype(np.float64), ssm0.astype(np.float64), meta, H, HV, K, V, spec_layout="rolled")
    assert_close(arrays["core_attn_out"][:T], want_o, 2e-4, "core_attn_out")
    assert np.array_equal(conv_to_canonical(conv, "time_major"), want_conv), "conv_state"
    assert_close(ssm, want_ssm, 2e-4, "ssm_state")
    gaps = pages.reshape(SLOTS, PAGE)[:, conv[0].nbytes:SSM_AT], pages.reshape(SLOTS, PAGE)[:, SSM_AT + ssm[0].nbytes:]
    assert not any(g.any() for g in gaps), "bytes of a page outside the two caches were written"


def test_cache_slot_stride_must_match_the_config(queue):
    cfg, meta, batch, arrays, conv0, ssm0 = case()
    pages, conv, ssm = paged_caches(conv_from_canonical(conv0, "time_major"), ssm0)
    cfg.ssm_slot_stride = 0
    with pytest.raises(ValueError, match=r"^ssm_state: slot stride 2048 elements, but cfg.ssm_slot_stride=0"):
        pygdn.attention(queue, cfg, batch, conv_state=conv, ssm_state=ssm, **arrays)
    with pytest.raises(ValueError, match=r"^conv_state: the dimensions after the first must be C-contiguous"):
        pygdn.attention(queue, cfg, batch, conv_state=conv.transpose(0, 2, 1), ssm_state=ssm, **arrays)
    assert not arrays["core_attn_out"].any(), "a refused call wrote its output"


def test_int64_index_array_is_refused_by_name(queue):
    cfg, meta, batch, arrays, conv0, ssm0 = case()
    pages, conv, ssm = paged_caches(conv_from_canonical(conv0, "time_major"), ssm0)
    batch.spec_token_indx = meta["spec_token_indx"].astype(np.int64)
    with pytest.raises(TypeError, match=r"^batch.spec_token_indx: dtype i64, expected i32 \(int64 index arrays are "
                                        r"not accepted: convert them to int32 once per step\)"):
        pygdn.attention(queue, cfg, batch, conv_state=conv, ssm_state=ssm, **arrays)



def test_dt_bias_of_another_dtype_is_refused_by_name(queue):
    """dt_bias is f32 or in the activations' dtype (gdn_tensors_t.dt_bias_dtype): a bf16 dt_bias
    with f32 activations is neither, and is refused by name, never converted per call."""
    cfg, meta, batch, arrays, conv0, ssm0 = case()
    pages, conv, ssm = paged_caches(conv_from_canonical(conv0, "time_major"), ssm0)
    arrays["dt_bias"] = pygdn.to_bf16_bits(arrays["dt_bias"])
    with pytest.raises(TypeError, match=r"^dt_bias: dtype bf16, expected f32 or act_dtype \('f32'\)"):
        pygdn.attention(queue, cfg, batch, conv_state=conv, ssm_state=ssm, **arrays)


def test_bound_batch_is_checked_once_per_field_change(queue):
    """Batch.bind(): host metadata arrays checked once, their checked struct reused by the next calls
    on the queue object (an engine's layers sharing a step's metadata) until a field is set."""
    cfg, meta, batch, arrays, conv0, ssm0 = case()
    pages, conv, ssm = paged_caches(conv_from_canonical(conv0, "time_major"), ssm0)
    assert batch.bind(queue) is batch
    kept = batch._views_cache
    assert kept is not None and kept[0] is queue
    pygdn.attention(queue, cfg, batch, conv_state=conv, ssm_state=ssm, **arrays)
    assert batch._views_cache is kept
    batch.spec_state_indices = meta["spec_state_indices"][:1]  # too short: checked again, refused by name
    with pytest.raises(ValueError, match="batch.spec_state_indices: .* elements, the counts need"):
        pygdn.attention(queue, cfg, batch, conv_state=conv, ssm_state=ssm, **arrays)
