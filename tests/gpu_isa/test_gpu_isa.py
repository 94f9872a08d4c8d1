"""The generic kernels compiled to Intel GPU ISA (isa_table.py) by a current Intel GPU compiler
(toolchain.py: Debian sid's ocloc, fetched into a cache folder on first use): every kernel of every
captured variant builds for bmg, lnl-m, pvc and dg2, keeps its data in registers and SLM (no spill,
no scratch; docs/gpu.md), and the matrix builds' products run on DPAS. Skipped, with the reason,
where the compiler cannot be fetched (a failure instead with GDN_GPU_ISA_REQUIRED=1, as in CI)."""
import os
import sys

import pytest

import isa_table
import toolchain

# Every kernel a warmup of the generic kernels builds (pygdn warmup compiles every kernel a config can launch).
EXPECTED = {"gdn_conv_non_spec", "gdn_conv_spec", "gdn_prep", "gdn_chunk_plan", "gdn_recurrent", "gdn_chunk_prep",
            "gdn_chunk_scan", "gdn_gated_rmsnorm", "gdn_replay_count"}
# No spill and no private/scratch memory, on every device: all but gdn_chunk_plan (one work-item's
# serial pass over the sequences) -- decode and spec decode (gdn_recurrent, also as replay mode's
# replay and walk), the conv, the prep, the chunked prefill and the gated norm.
HOT = EXPECTED - {"gdn_chunk_plan"}
# The kernels that must run their products on the matrix engines, per variant (a variant that is not
# one of isa_table.DEFAULT_VARIANTS is built as well), on every device the variant is compiled for
# (isa_table.variant_devices: a matrix tile's devices). Together the two tiles cover bmg, lnl-m, pvc, dg2.
DPAS: dict[str, set[str]] = {v: {"gdn_chunk_prep", "gdn_chunk_scan"}
                             for v in ("bf16/f32/128/vk/xmx16", "bf16/f32/128/vk/xmx8")}
VARIANTS = isa_table.DEFAULT_VARIANTS + tuple(v for v in DPAS if v not in isa_table.DEFAULT_VARIANTS)


@pytest.fixture(scope="module")
def tc():
    try:
        return toolchain.get()
    except toolchain.Unavailable as e:
        required = os.environ.get("GDN_GPU_ISA_REQUIRED") == "1"
        (pytest.fail if required else pytest.skip)(f"no current Intel GPU compiler: {e}")


@pytest.fixture(scope="module")
def results(tc, tmp_path_factory):
    res = isa_table.build(VARIANTS, isa_table.DEVICES, str(tmp_path_factory.mktemp("isa")), tc=tc)
    # The table in the test log (pytest -s, or CI's output of a failure).
    print(f"\n{tc.describe()}\n{isa_table.table(res)}", file=sys.stderr)
    return res


def kernels(results, variant):
    """(kernel short name, device, KernelIsa) of every kernel the variant builds."""
    for f in results:
        if variant in f.variants:
            for d in isa_table.variant_devices(variant):
                for name, k in f.isa.get(d, {}).items():
                    yield isa_table.short(name), d, k


def test_every_kernel_file_is_valid_spirv(results):
    assert results
    assert {f.spv: f.spirv_val_error for f in results if f.spirv_val_error} == {}


def test_every_expected_kernel_is_captured(results):
    for variant in VARIANTS:
        names = {isa_table.short(k) for f in results if variant in f.variants for k in f.kernels}
        assert names == EXPECTED, variant


def test_every_kernel_compiles_for_every_device(results):
    # A zero exit code is not enough: every kernel the SPIR-V declares must be in the zebin.
    for f in results:
        assert f.errors == {}, f.spv
        devices = {d for v in f.variants for d in isa_table.variant_devices(v)}
        assert devices and devices <= set(f.isa), f.spv
        for d in devices:
            assert set(f.kernels) <= set(f.isa[d]), (f.spv, d)  # (the zebin may add a symbol-table entry)
            for name in f.kernels:
                assert f.isa[d][name].simd in (8, 16, 32), (name, d)


def test_hot_kernels_have_no_spill_and_no_scratch(results):
    bad = [(n, d, v, k.spill, k.scratch) for v in VARIANTS for n, d, k in kernels(results, v)
           if n in HOT and (k.spill or k.scratch)]
    assert bad == []


@pytest.mark.parametrize("variant", sorted(DPAS))
def test_matrix_kernels_use_dpas(results, variant):
    have = {(n, d) for n, d, k in kernels(results, variant) if k.dpas}
    assert {(n, d) for n in DPAS[variant] for d in isa_table.variant_devices(variant)} - have == set()


def test_matrix_tiles_cover_every_device():
    assert {d for v in DPAS for d in isa_table.variant_devices(v)} == set(isa_table.DEVICES)
