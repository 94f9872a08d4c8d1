"""The pygdn layer's own caches (they must never serve a stale value) and its conversion of
Config and Batch fields to the C structs."""
import numpy as np
import pytest

import pygdn
from pygdn import _usm


def test_config_struct_is_cached_and_rebuilt_on_change():
    cfg = pygdn.Config(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, num_slots=3)
    first = cfg._to_c()
    assert cfg._to_c() is first  # cached: no rebuild per call
    assert first.num_v_heads == 4
    cfg.num_v_heads = 8
    rebuilt = cfg._to_c()
    assert rebuilt is not first and rebuilt.num_v_heads == 8
    cfg.act_dtype = "f32"
    assert cfg._to_c().act_dtype == pygdn._lib.lib.GDN_DTYPE_F32
    specs = cfg._tensor_specs(5)
    assert cfg._tensor_specs(5) is specs and specs["ssm_state"] == ("f32", 3, 8 * 16 * 16)
    assert cfg._tensor_specs(6)["mixed_qkv"][1] == 6
    cfg.num_slots = 4
    assert cfg._tensor_specs(6)["ssm_state"][1] == 4
    assert cfg == pygdn.Config(num_k_heads=2, num_v_heads=8, head_k_dim=16, head_v_dim=16, num_slots=4, act_dtype="f32")


def test_typestr_memo_matches_numpy():
    for typestr in ("<f4", "|f4", "<f2", "<u2", "<i4", "|i4", "|u1", "|b1", ">f4", "<f8", "<i8"):
        name, itemsize = _usm._typestr_info(typestr)
        assert itemsize == np.dtype(typestr).itemsize
        assert name == _usm._typestr_info(typestr)[0] == _usm.dtype_name(typestr)
    assert _usm.dtype_name(">f4") is None and _usm.dtype_name("<f8") is None
    assert _usm.dtype_name("<f4") == "f32" and _usm.dtype_name("<u2") == "bf16"
    assert _usm.dtype_name("not a dtype") is None


def test_numeric_fields_are_checked_by_name():
    """A field that is not an int32 (or, for the float fields, a number) is an error naming it,
    never truncated (3.7 is not 3) and never an unnamed cffi OverflowError."""
    base = dict(num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4, num_slots=4)
    cases = [(dict(num_k_heads=2**31), ValueError, r"^cfg\.num_k_heads=2147483648: does not fit int32"),
             (dict(num_slots=3.7), TypeError, r"^cfg\.num_slots=3\.7: expected an integer"),
             (dict(head_k_dim="x"), TypeError, r"^cfg\.head_k_dim='x': expected an integer"),
             (dict(scale="x"), TypeError, r"^cfg\.scale='x': expected a number"),
             (dict(norm_eps="1e-6"), TypeError, r"^cfg\.norm_eps='1e-6': expected a number")]
    for over, exc, match in cases:
        with pytest.raises(exc, match=match):
            pygdn.Config(**dict(base, **over))._to_c()
    assert pygdn.Config(**dict(base, num_slots=np.int64(4)))._to_c().num_slots == 4  # int-like values pass
    batch = pygdn.Batch(num_decodes=1, num_actual_tokens=2.5, non_spec_token_count=1)
    with pytest.raises(TypeError, match=r"^batch\.num_actual_tokens=2\.5: expected an integer"):
        pygdn.workspace_size(pygdn.Config(**base), batch)
    batch = pygdn.Batch(num_decodes=1, num_actual_tokens=1, non_spec_token_count=1, pad_slot_id=2**33)
    with pytest.raises(ValueError, match=r"^batch\.pad_slot_id=8589934592: does not fit int32"):
        batch._counts_c()
