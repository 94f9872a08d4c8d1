"""The pygdn layer's own caches: they must never serve a stale value."""
import numpy as np

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
