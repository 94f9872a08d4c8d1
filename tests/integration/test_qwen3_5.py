"""Qwen3.5's text models, dense (Qwen3_5ForCausalLM) and MoE (Qwen3_5MoeForCausalLM), tiny (models.py:
layer_types 3 linear + 1 full attention, one MTP layer), served through the plugin with MTP k=2 and the
verifier's acceptance cycled through 1..3 tokens, every GDN core call checked against vLLM's own core on
the same inputs and cache contents (run_vllm.py --shadow, as test_vllm.py does for Qwen3-Next).
vLLM's Qwen3.5 layers hold their in-projections apart (qkv, z, b, a) where Qwen3-Next's pack them; the
core the plugin serves is the same op."""
import pytest

from conftest import run_vllm
from models import write_model
from test_vllm import OUT_BOUND, SERVES, shadow_max


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_mtp_k2_every_call_matches_vllm(name, tmp_path):
    model = write_model(tmp_path / name, name)
    got, log = run_vllm(tmp_path, model, f"plugin_{name}", True, "--mtp", 2, "--shadow", "--accept-cycle")
    assert SERVES in log, log[-3000:]
    assert [len(t) for t in got["tokens"]] == [64] * 4
    rows = got["shadow"]
    assert {a for row in rows for a in row[1]} == {1, 2, 3}
    assert any(row[1] for row in rows) and any(not row[1] for row in rows)  # spec and prefill calls
    calls, out, conv, ssm = shadow_max(got)
    assert out <= OUT_BOUND and conv == 0 and ssm <= OUT_BOUND, (out, conv, ssm)
