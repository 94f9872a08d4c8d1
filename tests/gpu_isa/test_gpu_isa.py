"""The generic kernels compiled to Intel GPU ISA (isa_table.py): every kernel of every captured
variant builds for dg2, pvc and tgllp, and the hot kernels keep their data in registers/SLM
(docs/gpu.md). Skipped without ocloc and spirv-val (apt-get install intel-opencl-icd spirv-tools)."""
import sys

import pytest

import isa_table

pytestmark = pytest.mark.skipif(not (isa_table.tool("ocloc") and isa_table.tool("spirv-val")),
                                reason="ocloc / spirv-val not installed (apt-get install intel-opencl-icd spirv-tools)")

# Every kernel a warmup of the generic kernels builds (pygdn warmup compiles every kernel a config can launch).
EXPECTED = {"gdn_conv_non_spec", "gdn_conv_spec", "gdn_prep", "gdn_chunk_plan", "gdn_recurrent", "gdn_chunk_prep",
            "gdn_chunk_scan", "gdn_gated_rmsnorm", "gdn_replay_count"}
# No spill and no private/scratch memory: the per-token kernels of decode and spec decode (gdn_recurrent
# also as replay mode's replay and walk).
NO_SCRATCH = {"gdn_recurrent", "gdn_conv_spec", "gdn_conv_non_spec", "gdn_replay_count"}
NO_SPILL = NO_SCRATCH | {"gdn_chunk_prep", "gdn_chunk_scan"}
JUDGED = ("dg2", "pvc")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    res = isa_table.build(isa_table.DEFAULT_VARIANTS, isa_table.DEVICES, str(tmp_path_factory.mktemp("isa")))
    # The table in the test log (pytest -s, or CI's output of a failure).
    print(f"\nocloc: {isa_table.ocloc_version()}\n{isa_table.table(res)}", file=sys.stderr)
    return res


def test_every_kernel_file_is_valid_spirv(results):
    assert results
    assert {f.spv: f.spirv_val_error for f in results if f.spirv_val_error} == {}


def test_every_expected_kernel_is_captured(results):
    for variant in isa_table.DEFAULT_VARIANTS:
        names = {isa_table.short(k) for f in results if variant in f.variants for k in f.kernels}
        assert names == EXPECTED, variant


def test_every_kernel_compiles_for_every_device(results):
    # A zero exit code is not enough: every kernel the SPIR-V declares must be in the zebin.
    for f in results:
        assert f.errors == {}, f.spv
        for d in isa_table.DEVICES:
            assert set(f.kernels) <= set(f.isa[d]), (f.spv, d)  # (the zebin may add a symbol-table entry)
            for name in f.kernels:
                assert f.isa[d][name].simd in (8, 16, 32), (name, d)


def test_hot_kernels_have_no_spill_and_no_scratch(results):
    bad = []
    for f in results:
        for d in JUDGED:
            for name, k in f.isa[d].items():
                n = isa_table.short(name)
                if (n in NO_SPILL and k.spill) or (n in NO_SCRATCH and k.scratch):
                    bad.append((n, d, ",".join(f.variants), k.spill, k.scratch))
    assert bad == []
