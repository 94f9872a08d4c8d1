"""pygdn.vllm_xpu.gdn_attention as vLLM calls it (vllm/_xpu_ops.py: the first eight arguments by
position, the rest by keyword), on torch CPU tensors: its prepared layers and kept batches give bit for
bit the results of a plain pygdn.attention call of the same step (several steps, two layers sharing a
step's metadata, metadata changed in place between steps); graph-padded steps as vLLM's GDN metadata
builder pads a captured decode or spec step; dt_bias as vLLM's parameter (model dtype, requires grad);
what is refused is refused by name with nothing written. vllm-xpu-kernels' own tests run through it in
tests/test_vllm_xpu_kernels.py. Needs torch (tests/setup_and_run.sh integration runs this file)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

import pygdn  # noqa: E402
from pygdn import vllm_xpu  # noqa: E402

H, HV, K, V, W, SLOTS, S = 2, 4, 16, 16, 4, 48, 2  # S: draft tokens (3 spec columns)
CONV_DIM = 2 * H * K + HV * V
NULL_BLOCK_ID = 0  # vLLM's padding slot in the metadata tensors (vllm/v1/attention/backends/utils.py)
i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731


@pytest.fixture(autouse=True)
def _forget_layers():
    vllm_xpu.release()
    yield
    vllm_xpu.release()


class Layer:
    """One GDN layer as vLLM's XPU layer holds it: parameters (dt_bias in the model's dtype, requiring
    grad, as nn.Parameter makes them), the conv weight as the [C, 1, W] parameter vLLM views as [C, W],
    and its caches."""

    def __init__(self, seed, dtype=torch.bfloat16, bias=True):
        g = torch.Generator().manual_seed(seed)
        rnd = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        self.weight = torch.nn.Parameter((rnd(CONV_DIM, 1, W) * 0.5).to(dtype))
        self.bias = torch.nn.Parameter((rnd(CONV_DIM) * 0.1).to(dtype)) if bias else None
        self.A_log = torch.nn.Parameter(torch.log(torch.rand(HV, generator=g) * 7.5 + 0.5))
        self.dt_bias = torch.nn.Parameter((torch.rand(HV, generator=g) * 2 - 1).to(dtype))
        self.conv_state = rnd(SLOTS, W - 1, CONV_DIM).to(dtype)
        self.ssm_state = rnd(SLOTS, HV, V, K) * 0.5

    def clone(self):
        other = object.__new__(Layer)
        other.__dict__.update(self.__dict__)
        other.conv_state, other.ssm_state = self.conv_state.clone(), self.ssm_state.clone()
        return other


def step_tensors(seed, T, dtype=torch.bfloat16, pad_rows=0):
    """A step's projections and outputs (pad_rows more rows, as vLLM's padded leading dims)."""
    g = torch.Generator().manual_seed(seed)
    rows = T + pad_rows
    return dict(qkvz=torch.randn(rows, CONV_DIM + HV * V, generator=g).to(dtype),
                ba=torch.randn(rows, 2 * HV, generator=g).to(dtype),
                out=torch.full((rows, HV, V), 5.0, dtype=dtype), z=torch.full((rows, HV, V), 7.0, dtype=dtype))


def dropin(layer, x, md, T, reorder=False, dt_bias=None, **over):
    """The call of vLLM's _gdn_attention_core_xpu_impl (md: the metadata tensors and counts)."""
    kw = dict(conv_state=layer.conv_state, ssm_state=layer.ssm_state,
              conv_weights=layer.weight.view(layer.weight.size(0), layer.weight.size(2)), conv_bias=layer.bias,
              activation="silu", A_log=layer.A_log, dt_bias=layer.dt_bias if dt_bias is None else dt_bias, **md,
              num_actual_tokens=T, tp_size=1, reorder_input=reorder)
    kw.update(over)
    vllm_xpu.gdn_attention(x["out"], x["z"], x["qkvz"], x["ba"], H, HV, K, V, **kw)


def plain(layer, x, md, T, reorder=False):
    """The same step as one plain (unprepared) pygdn.attention call, counts as the drop-in documents them."""
    ns, sp = md["num_prefills"] + md["num_decodes"], md["num_spec_decodes"]
    tok, stok = md["non_spec_token_indx"], md["spec_token_indx"]
    ns_count = 0 if ns == 0 else len(tok) if tok is not None else md["num_decodes"] if not md["num_prefills"] and not sp else T
    sp_count = 0 if sp == 0 else len(stok) if stok is not None else T - ns_count
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype=vllm_xpu.dtype_name(x["qkvz"].dtype), state_dtype="f32", ssm_layout="vk",
                       conv_layout="time_major", conv_spec_layout="snapshot", conv_state_len=W - 1,
                       packed_order="contiguous" if reorder else "grouped")
    batch = pygdn.Batch(
        num_actual_tokens=ns_count + sp_count, num_prefills=md["num_prefills"], num_decodes=md["num_decodes"],
        num_spec_decodes=sp, num_spec=md["spec_state_indices_tensor"].shape[1] - 1 if sp else 0,
        non_spec_token_count=ns_count, spec_token_count=sp_count, validate="counts",
        non_spec_query_start_loc=md["non_spec_query_start_loc"] if ns else None,
        non_spec_state_indices=md["non_spec_state_indices_tensor"] if ns else None,
        has_initial_state=md["has_initial_state"] if ns else None, non_spec_token_indx=tok if ns else None,
        spec_query_start_loc=md["spec_query_start_loc"] if sp else None,
        spec_state_indices=md["spec_state_indices_tensor"] if sp else None,
        num_accepted_tokens=md["num_accepted_tokens"] if sp else None, spec_token_indx=stok if sp else None)
    pygdn.attention(vllm_xpu.cpu_queue(), cfg, batch, qkvz=x["qkvz"], ba=x["ba"], z_out=x["z"],
                    conv_weight=layer.weight.detach().view(CONV_DIM, W),
                    conv_bias=None if layer.bias is None else layer.bias.detach(), A_log=layer.A_log.detach(),
                    dt_bias=layer.dt_bias.detach(), conv_state=layer.conv_state, ssm_state=layer.ssm_state,
                    core_attn_out=x["out"])


def meta(num_prefills=0, num_decodes=0, num_spec_decodes=0, has_initial_state=None, non_spec_query_start_loc=None,
         non_spec_token_indx=None, non_spec_state_indices_tensor=None, spec_query_start_loc=None,
         spec_token_indx=None, spec_state_indices_tensor=None, num_accepted_tokens=None):
    return dict(locals())


def decode_step(slots):
    return meta(num_decodes=len(slots), non_spec_query_start_loc=i32(range(len(slots) + 1)),
                non_spec_state_indices_tensor=i32(slots))


def spec_step(blocks, accepted, rows=None):
    n, cols = len(blocks), len(blocks[0])
    return meta(num_spec_decodes=n, spec_query_start_loc=i32([cols * i for i in range(n + 1)]),
                spec_token_indx=i32(range(n * cols) if rows is None else rows), spec_state_indices_tensor=i32(blocks),
                num_accepted_tokens=i32(accepted), non_spec_token_indx=torch.empty(0, dtype=torch.int32))


def mixed_step(prefill_lens, prefill_slots, blocks, accepted, seed):
    """Prefills and spec sequences, rows interleaved (vLLM's argsort), int32 index arrays."""
    cols, T_ns = len(blocks[0]), sum(prefill_lens)
    T = T_ns + cols * len(blocks)
    rows = torch.randperm(T, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    return meta(num_prefills=len(prefill_lens), num_spec_decodes=len(blocks),
                has_initial_state=torch.tensor([True, False][:len(prefill_lens)]),
                non_spec_query_start_loc=i32(np.concatenate([[0], np.cumsum(prefill_lens)])),
                non_spec_token_indx=rows[:T_ns].contiguous(), non_spec_state_indices_tensor=i32(prefill_slots),
                spec_query_start_loc=i32([cols * i for i in range(len(blocks) + 1)]),
                spec_token_indx=rows[T_ns:].contiguous(), spec_state_indices_tensor=i32(blocks),
                num_accepted_tokens=i32(accepted)), T


def assert_bitwise(got, want, what):
    assert torch.equal(got.view(torch.uint8) if got.dtype != torch.float32 else got.view(torch.int32),
                       want.view(torch.uint8) if want.dtype != torch.float32 else want.view(torch.int32)), what


def same_state(a, b, what):
    assert_bitwise(a.conv_state, b.conv_state, f"{what}: conv_state")
    assert_bitwise(a.ssm_state, b.ssm_state, f"{what}: ssm_state")


@pytest.mark.parametrize("reorder", [False, True])
def test_prepared_layers_match_plain_calls_bitwise(reorder):
    """Steps of two layers (a decode step, a spec step with counts 0 and 3, a mixed prefill + spec step,
    the decode step again with its slots changed in place): each layer's prepared call and the kept
    batches give the plain call's bits, outputs, z and caches."""
    layers = [Layer(1), Layer(2, bias=False)]
    twins = [layer.clone() for layer in layers]
    blocks = [[3, 4, 5], [6, 7, 8], [9, 10, 11]]
    mixed, T_mixed = mixed_step([5, 70], [20, 21], blocks[:2], [2, 1], seed=3)
    steps = [(decode_step([12, 13, 14]), 3), (spec_step(blocks, [0, 3, 2], rows=[4, 0, 8, 1, 7, 2, 6, 3, 5]), 9),
             (mixed, T_mixed), (decode_step([15, 16, 17]), 3)]
    for i, (md, T) in enumerate(steps):
        if i == 3:  # the first step's tensors, changed in place: kept batches read them at run time
            md = steps[0][0]
            md["non_spec_state_indices_tensor"].copy_(i32([15, 16, 17]))
        for n, (layer, twin) in enumerate(zip(layers, twins)):
            x = step_tensors(10 * i + n, T, pad_rows=1)
            y = {k: v.clone() for k, v in x.items()}
            dropin(layer, x, md, T, reorder)
            plain(twin, y, md, T, reorder)
            for k in ("out", "z"):
                assert_bitwise(x[k], y[k], f"step {i}, layer {n}: {k}")
            same_state(layer, twin, f"step {i}, layer {n}")
            assert torch.all(x["out"][T] == 5.0) and torch.all(x["z"][T] == 7.0), "a row past the step written"
    assert len(vllm_xpu._layers) == 2, "a layer prepared twice"
    assert len(vllm_xpu._steps) == 3, "a step's batch made per layer (the fourth reuses the first's tensors)"


def test_graph_padded_steps_as_vllm_sends_them():
    """vLLM's metadata builder pads a captured step: num_actual_tokens and the projections' rows padded,
    metadata tensors of the padded batch size whose entries past the real sequences are NULL_BLOCK_ID
    slots, repeated start locations and accepted counts of 1 (vllm/v1/attention/backends/gdn_attn.py).
    The real rows and every cache slot come out as from the unpadded step; padded rows are untouched."""
    layer = Layer(4)
    twin = layer.clone()
    # decodes: 3 real of a batch of 8, rows padded to 8
    md = meta(num_decodes=3, non_spec_query_start_loc=i32([0, 1, 2, 3, 3, 3, 3, 3, 3]),
              non_spec_state_indices_tensor=i32([30, 31, 32] + [NULL_BLOCK_ID] * 5))
    x = step_tensors(5, 3, pad_rows=5)
    y = {k: v[:3].clone() for k, v in x.items()}
    dropin(layer, x, md, 8)
    plain(twin, y, decode_step([30, 31, 32]), 3)
    for k, fill in (("out", 5.0), ("z", 7.0)):
        assert_bitwise(x[k][:3], y[k], f"decode: {k}")
        assert torch.all(x[k][3:] == fill), f"decode: padded rows of {k} written"
    same_state(layer, twin, "decode")
    # spec: 2 real sequences of a batch of 4, 6 real rows padded to 12
    blocks = [[33, 34, 35], [36, 37, 38]]
    md = spec_step(blocks + [[NULL_BLOCK_ID] * 3] * 2, [2, 0, 1, 1])
    md.update(num_spec_decodes=2, spec_query_start_loc=i32([0, 3, 6, 6, 6]), spec_token_indx=i32(range(6)))
    x = step_tensors(6, 6, pad_rows=6)
    y = {k: v[:6].clone() for k, v in x.items()}
    dropin(layer, x, md, 12)
    plain(twin, y, spec_step(blocks, [2, 0]), 6)
    for k, fill in (("out", 5.0), ("z", 7.0)):
        assert_bitwise(x[k][:6], y[k], f"spec: {k}")
        assert torch.all(x[k][6:] == fill), f"spec: padded rows of {k} written"
    same_state(layer, twin, "spec")


def test_steps_of_one_layout_then_of_others():
    """A layer's decode steps of one layout, as an engine's loop sends them (after the first, only the
    tensors' addresses are read), then steps of the same rows in other layouts: projections strided
    (rows of a wider buffer), contiguous again, z of another dtype (refused by name, nothing written),
    the first layout again. Each comes out as the plain call gives it, bit for bit."""
    layer = Layer(11)
    twin = layer.clone()
    md = decode_step([20, 21, 22])

    def step(x, what):
        y = {k: v.clone() for k, v in x.items()}
        dropin(layer, x, md, 3)
        plain(twin, y, md, 3)
        for k in ("out", "z"):
            assert_bitwise(x[k], y[k], f"{what}: {k}")
        same_state(layer, twin, what)

    for i in range(3):
        step(step_tensors(i, 3), f"step {i}")
    (call,) = [entry[0] for entry in vllm_xpu._layers.values()]
    assert call._step is not None, "the layout the steps repeat is not kept"
    x = step_tensors(3, 3)
    wide = torch.zeros(3, x["qkvz"].shape[1] + 24, dtype=x["qkvz"].dtype)
    wide[:, 8:8 + x["qkvz"].shape[1]] = x["qkvz"]
    x["qkvz"] = wide[:, 8:8 + x["qkvz"].shape[1]]
    step(x, "strided qkvz")
    step(step_tensors(4, 3), "contiguous again")
    x = step_tensors(5, 3)
    x["z"] = x["z"].half()
    before = layer.clone()
    with pytest.raises(TypeError, match=r"^z_out: dtype f16, expected bf16"):
        dropin(layer, x, md, 3)
    same_state(layer, before, "a refused step")
    assert torch.all(x["out"] == 5.0) and torch.all(x["z"] == 7.0), "a refused step wrote its outputs"
    step(step_tensors(6, 3), "after the refused step")
    step(step_tensors(7, 3), "the first layout again")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dt_bias_in_model_dtype_or_f32(dtype):
    """dt_bias as vLLM's parameter (the model's dtype) and widened to f32: the same bits."""
    layers = [Layer(7, dtype=dtype), Layer(7, dtype=dtype)]
    md = spec_step([[3, 4, 5], [6, 7, 8]], [1, 3])
    xs = [step_tensors(8, 6, dtype=dtype) for _ in layers]
    dropin(layers[0], xs[0], md, 6)
    dropin(layers[1], xs[1], md, 6, dt_bias=layers[1].dt_bias.detach().float())
    for k in ("out", "z"):
        assert_bitwise(xs[0][k], xs[1][k], k)
    same_state(layers[0], layers[1], "caches")


@pytest.mark.parametrize("over,error,match", [
    (dict(activation="gelu"), ValueError, r"activation='gelu': vllm-xpu-kernels' gdn_attention takes 'silu' or 'swish'"),
    (dict(tp_size=3), ValueError, r"tp_size=3: must divide num_k_heads=2 and num_v_heads=4"),
    (dict(dt_bias=torch.zeros(HV, dtype=torch.float16)), TypeError, r"^dt_bias: dtype f16, expected f32 or act_dtype"),
    (dict(non_spec_state_indices_tensor=torch.tensor([12, 13, 14])), TypeError,
     r"non_spec_state_indices: dtype i64, expected i32 \(int64 index arrays are not accepted"),
    (dict(ssm_state=torch.zeros(SLOTS, HV, V, K, dtype=torch.float64)), TypeError,
     r"^ssm_state: dtype torch.float64, expected float32, float16 or bfloat16"),
])
def test_refused_by_name_with_nothing_written(over, error, match):
    layer = Layer(9)
    before = layer.clone()
    x = step_tensors(9, 3)
    with pytest.raises(error, match=match):
        dropin(layer, x, decode_step([12, 13, 14]), 3, **over)
    same_state(layer, before, "a refused call")
    assert torch.all(x["out"] == 5.0) and torch.all(x["z"] == 7.0), "a refused call wrote its outputs"
