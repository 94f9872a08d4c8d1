"""pygdn.vllm_xpu.gdn_attention as vLLM calls it (vllm/_xpu_ops.py: the first eight arguments by
position, the rest by keyword), on torch CPU tensors: its prepared layers and kept batches give bit for
bit the results of a plain pygdn.attention call of the same step (several steps, two layers sharing a
step's metadata, metadata changed in place between steps), in the rolled spec conv convention by default
(vllm-xpu-kernels #544) and in the snapshot one by GDN_XPU_XK_CONV; MTP steps across vLLM's block
transitions against the float64 reference; vLLM's null block as padding inside the counted rows, eager
and in recorded graphs; graph-padded steps as vLLM's GDN metadata builder pads a captured decode or spec
step; a mixed prefill + decode + MTP batch against the reference; both of vLLM's conv-state layouts;
dt_bias as vLLM's parameter (model dtype, requires grad); what is refused is refused by name with nothing
written. vllm-xpu-kernels' own tests run through it in tests/test_vllm_xpu_kernels.py. Needs torch
(tests/setup_and_run.sh integration runs this file)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")

import pygdn  # noqa: E402
from pygdn import reference as ref  # noqa: E402
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
    and its caches (the conv state of W - 1 + S rows, time-major, as vLLM allocates it with S drafts)."""

    def __init__(self, seed, dtype=torch.bfloat16, bias=True):
        g = torch.Generator().manual_seed(seed)
        rnd = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        self.weight = torch.nn.Parameter((rnd(CONV_DIM, 1, W) * 0.5).to(dtype))
        self.bias = torch.nn.Parameter((rnd(CONV_DIM) * 0.1).to(dtype)) if bias else None
        self.A_log = torch.nn.Parameter(torch.log(torch.rand(HV, generator=g) * 7.5 + 0.5))
        self.dt_bias = torch.nn.Parameter((torch.rand(HV, generator=g) * 2 - 1).to(dtype))
        self.conv_state = rnd(SLOTS, W - 1 + S, CONV_DIM).to(dtype)
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


def plain(layer, x, md, T, reorder=False, conv="rolled"):
    """The same step as one plain (unprepared) pygdn.attention call, counts as the drop-in documents them,
    vLLM's null block as the pad slot, spec conv history in the `conv` convention."""
    ns, sp = md["num_prefills"] + md["num_decodes"], md["num_spec_decodes"]
    tok, stok = md["non_spec_token_indx"], md["spec_token_indx"]
    ns_count = 0 if ns == 0 else len(tok) if tok is not None else md["num_decodes"] if not md["num_prefills"] and not sp else T
    sp_count = 0 if sp == 0 else len(stok) if stok is not None else T - ns_count
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       act_dtype=vllm_xpu.dtype_name(x["qkvz"].dtype), state_dtype="f32", ssm_layout="vk",
                       conv_layout="time_major", conv_spec_layout=conv, conv_state_len=layer.conv_state.shape[1],
                       packed_order="contiguous" if reorder else "grouped")
    batch = pygdn.Batch(
        num_actual_tokens=ns_count + sp_count, num_prefills=md["num_prefills"], num_decodes=md["num_decodes"],
        num_spec_decodes=sp, num_spec=md["spec_state_indices_tensor"].shape[1] - 1 if sp else 0,
        non_spec_token_count=ns_count, spec_token_count=sp_count, validate="counts", pad_slot_id=NULL_BLOCK_ID,
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


@pytest.mark.parametrize("conv", ["rolled", "snapshot"])
@pytest.mark.parametrize("reorder", [False, True])
def test_prepared_layers_match_plain_calls_bitwise(monkeypatch, reorder, conv):
    """Steps of two layers (a decode step, a spec step with counts 0 and 3, a mixed prefill + spec step,
    the decode step again with its slots changed in place): each layer's prepared call and the kept
    batches give the plain call's bits, outputs, z and caches. The drop-in's default is the library's
    rolled spec conv layout; GDN_XPU_XK_CONV=snapshot gives the snapshot one."""
    if conv == "snapshot":
        monkeypatch.setenv(vllm_xpu.XK_CONV_ENV, "snapshot")
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
            plain(twin, y, md, T, reorder, conv)
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
    (dict(ssm_state=torch.zeros(SLOTS, HV, V, K, dtype=torch.int8)), TypeError,
     r"^ssm_state: dtype torch.int8: an 8-bit SSM cache needs one f32 scale per state row"),
])
def test_refused_by_name_with_nothing_written(over, error, match):
    layer = Layer(9)
    before = layer.clone()
    x = step_tensors(9, 3)
    with pytest.raises(error, match=match):
        dropin(layer, x, decode_step([12, 13, 14]), 3, **over)
    same_state(layer, before, "a refused call")
    assert torch.all(x["out"] == 5.0) and torch.all(x["z"] == 7.0), "a refused call wrote its outputs"


# ----------------------------------------------------------------------------- against the float64 reference
def canonical(layer):
    """The layer's caches as the reference keeps them: conv [slots, C, state_len], ssm [slots, HV, K, V]."""
    return (layer.conv_state.transpose(1, 2).double().numpy().copy(),
            layer.ssm_state.transpose(2, 3).double().numpy().copy())


def unpacked(x, rows):
    """mixed_qkv, a, b of the given rows of a step's contiguous (reorder_input=True) projections."""
    qkvz, ba = x["qkvz"][rows].double().numpy(), x["ba"][rows].double().numpy()
    return qkvz[:, :CONV_DIM], ba[:, HV:], ba[:, :HV]


def reference_step(layer, x, rows, batch, conv, ssm, spec_layout="rolled"):
    """pygdn.reference's gdn_attention of the rows `rows` of step x on float64 caches (conv, ssm)."""
    qkv, a, b = unpacked(x, rows)
    w = layer.weight.detach().view(CONV_DIM, W).double().numpy()
    bias = None if layer.bias is None else layer.bias.detach().double().numpy()
    return ref.gdn_attention(qkv, a, b, w, bias, layer.A_log.detach().double().numpy(),
                             layer.dt_bias.detach().double().numpy(), conv, ssm, batch, H, HV, K, V,
                             spec_layout=spec_layout)


def assert_near(got, want, what, rtol=1e-4):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    assert err <= rtol, f"{what}: max error {err:.3g} of max |reference| > {rtol}"


class Truth:
    """A sequence's exact state (conv history, SSM) in float64, advanced by its accepted tokens only: the
    run without speculation or block moves that an MTP step must agree with."""

    def __init__(self):
        self.conv = np.zeros((1, CONV_DIM, W - 1))
        self.ssm = np.zeros((1, HV, K, V))

    def run(self, layer, x, rows, keep):
        """Outputs of the tokens in `rows` from this state, as one sequence; the state then advances by the
        first `keep` of them."""
        def prefill(n):
            batch = dict(num_prefills=1, non_spec_query_start_loc=[0, n], non_spec_state_indices=[0])
            return reference_step(layer, x, rows[:n], batch, self.conv, self.ssm)
        out = prefill(len(rows))[0]
        _, self.conv, self.ssm = prefill(keep)
        return out


@pytest.mark.parametrize("conv", ["rolled", "snapshot"])
def test_mtp_steps_across_vllm_block_transitions(monkeypatch, conv):
    """Two sequences: a prefill, then ten MTP steps of 1 + S tokens with every accepted count 1..1+S; after
    every other step the sequences move to new blocks as vLLM moves mamba state at a block boundary
    (vllm/v1/worker/mamba_utils.py: get_conv_copy_spec copies conv rows state[block[0], A-1:] to the new
    block's first rows, get_temporal_copy_spec the SSM state of block[A-1]; the next step reads with A = 1).
    Rolled (the default, vllm-xpu-kernels #544): every step's outputs are the exact run's, which sees the
    accepted tokens only (float64 reference). Snapshot (vllm-xpu-kernels up to 4543b580): the windows that
    copy migrates are wrong once a transition follows a step with A > 1 (vllm #53229)."""
    if conv == "snapshot":
        monkeypatch.setenv(vllm_xpu.XK_CONV_ENV, "snapshot")
    layer = Layer(21, dtype=torch.float32)
    truths = [Truth(), Truth()]
    fresh = iter(range(1, SLOTS))  # block 0: vLLM's null block
    blocks = [[next(fresh) for _ in range(S + 1)] for _ in truths]
    # the prefill: 9 and 5 tokens into the blocks of column 0
    x = step_tensors(100, 14, dtype=torch.float32)
    md = meta(num_prefills=2, has_initial_state=torch.tensor([False, False]), non_spec_query_start_loc=i32([0, 9, 14]),
              non_spec_state_indices_tensor=i32([blocks[0][0], blocks[1][0]]))
    dropin(layer, x, md, 14, reorder=True)
    for n, rows in enumerate([list(range(9)), list(range(9, 14))]):
        truths[n].run(layer, x, rows, len(rows))
    accepted = [1, 1]
    cycles = [[2, 3, 1, 3, 2, 1, 3, 3, 2, 1], [3, 1, 2, 2, 3, 1, 1, 3, 2, 3]]
    drift = 0.0
    for step in range(10):
        T = 2 * (S + 1)
        rows = torch.randperm(T, generator=torch.Generator().manual_seed(step)).to(torch.int32)
        md = spec_step(blocks, accepted, rows=rows.tolist())
        x = step_tensors(200 + step, T, dtype=torch.float32)
        dropin(layer, x, md, T, reorder=True)
        got = x["out"].double().numpy()
        nxt = [cycles[n][step] for n in range(2)]
        for n, truth in enumerate(truths):
            mine = [int(r) for r in rows[n * (S + 1):(n + 1) * (S + 1)]]
            want = truth.run(layer, x, mine, nxt[n])
            if conv == "rolled":
                assert_near(got[mine], want, f"step {step}, sequence {n}")
            else:
                drift = max(drift, np.abs(got[mine] - want).max() / np.abs(want).max())
        if step % 2 == 1:  # a block boundary: vLLM moves each sequence's state to new blocks
            for n in range(2):
                new = [next(fresh) for _ in range(S + 1)]
                bias = nxt[n] - 1
                rows_kept = layer.conv_state.shape[1] - bias
                layer.conv_state[new[0], :rows_kept] = layer.conv_state[blocks[n][0], bias:]
                layer.ssm_state[new[0]] = layer.ssm_state[blocks[n][bias]]
                blocks[n] = new
            accepted = [1, 1]
        else:
            accepted = nxt
    if conv == "snapshot":
        assert drift > 1e-2, "the snapshot convention under vLLM's block copy agreed with the exact run"


def test_mixed_prefill_decode_mtp_batch_against_the_reference():
    """One call with prefills (70 tokens from a state, 1 token from zeros), a decode and three MTP sequences
    (3, 2 and 1 tokens, accepted counts 2, 3 and 1), every row interleaved -- vllm-xpu-kernels before its
    #537 refused spec and non-spec tokens in one call -- against the float64 reference, caches included."""
    layer = Layer(31, dtype=torch.float32)
    conv0, ssm0 = canonical(layer)
    ns_lens, s_lens = [70, 1, 1], [3, 2, 1]
    T_ns, T = sum(ns_lens), sum(ns_lens) + sum(s_lens)
    rows = torch.randperm(T, generator=torch.Generator().manual_seed(5)).to(torch.int32)
    blocks = [[11, 12, 13], [14, 15, 16], [17, 18, 19]]
    md = meta(num_prefills=2, num_decodes=1, num_spec_decodes=3, has_initial_state=torch.tensor([True, False, True]),
              non_spec_query_start_loc=i32(np.cumsum([0] + ns_lens)), non_spec_token_indx=rows[:T_ns].contiguous(),
              non_spec_state_indices_tensor=i32([7, 8, 9]), spec_query_start_loc=i32(np.cumsum([0] + s_lens)),
              spec_token_indx=rows[T_ns:].contiguous(), spec_state_indices_tensor=i32(blocks),
              num_accepted_tokens=i32([2, 3, 1]))
    x = step_tensors(32, T, dtype=torch.float32)
    dropin(layer, x, md, T, reorder=True)
    batch = dict(num_prefills=2, num_decodes=1, num_spec_decodes=3, num_spec=S, pad_slot_id=NULL_BLOCK_ID,
                 **{k: md[k].numpy() for k in ("has_initial_state", "non_spec_query_start_loc", "non_spec_token_indx",
                                               "spec_query_start_loc", "spec_token_indx", "num_accepted_tokens")},
                 non_spec_state_indices=md["non_spec_state_indices_tensor"].numpy(),
                 spec_state_indices=md["spec_state_indices_tensor"].numpy())
    out, conv, ssm = reference_step(layer, x, list(range(T)), batch, conv0, ssm0)
    assert_near(x["out"].double().numpy(), out, "core_attn_out")
    assert torch.equal(x["z"], x["qkvz"][:, CONV_DIM:].reshape(T, HV, V)), "z: the rows' z columns"
    got_conv, got_ssm = canonical(layer)
    assert np.array_equal(got_conv, conv), "conv_state (exact copies of the inputs)"
    assert_near(got_ssm, ssm, "ssm_state")
    untouched = [s for s in range(SLOTS) if np.array_equal(ssm[s], ssm0[s])]
    assert np.array_equal(got_ssm[untouched], ssm0[untouched]), "a slot the step does not address changed"


# ----------------------------------------------------------------------------- vLLM's null block is padding
def grouped_z(qkvz):
    """The z columns [rows, HV, V] of Qwen3-Next's grouped projections (reorder_input=False): per k-head
    [q (K) | k (K) | v (g V) | z (g V)], g = HV / H."""
    g = HV // H
    groups = qkvz.reshape(qkvz.shape[0], H, 2 * K + 2 * g * V)
    return groups[:, :, 2 * K + g * V:].reshape(qkvz.shape[0], HV, V)


def block0_kept(layer, before, what):
    for name in ("conv_state", "ssm_state"):
        assert_bitwise(getattr(layer, name)[NULL_BLOCK_ID], getattr(before, name)[NULL_BLOCK_ID],
                       f"{what}: block 0 of {name} changed")


def padded_decode(seed):
    """Decodes counted as 6 with 3 real ones (slots from 30 on, rows 0, 2, 3): a stale row with a token and
    block 0 (row 1), then rows as vLLM's builder pads them (block 0 and -1, zero-length query ranges: rows
    4 and 5 belong to no sequence). Returns (padded metadata, the real rows, the stale rows, unpadded)."""
    slots = [30 + int(s) for s in torch.randperm(15, generator=torch.Generator().manual_seed(seed))[:3]]
    md = meta(num_decodes=6, non_spec_query_start_loc=i32([0, 1, 2, 3, 4, 4, 4]),
              non_spec_state_indices_tensor=i32([slots[0], NULL_BLOCK_ID, slots[1], slots[2], NULL_BLOCK_ID, -1]))
    return md, [0, 2, 3], [1], decode_step(slots)


def padded_spec(accepted):
    """Spec sequences counted as 5: real [33, 34, 35] (3 tokens) and [36, 37, 38] (2 tokens), a stale row of
    block 0 with 3 tokens and accepted count 0 between them, rows padded as vLLM's builder pads them (block 0
    and -1, zero-length, accepted 1); the 8 rows interleaved. Returns (padded metadata, real rows, stale
    rows, unpadded)."""
    rows = [5, 0, 7, 1, 6, 3, 2, 4]  # spec_token_indx: real 0 (3 tokens), stale (3), real 1 (2)
    md = meta(num_spec_decodes=5, spec_query_start_loc=i32([0, 3, 6, 8, 8, 8]), spec_token_indx=i32(rows),
              spec_state_indices_tensor=i32([[33, 34, 35], [NULL_BLOCK_ID] * 3, [36, 37, 38], [NULL_BLOCK_ID] * 3,
                                             [-1] * 3]),
              num_accepted_tokens=i32([accepted[0], 0, accepted[1], 1, 1]), non_spec_token_indx=torch.empty(0, dtype=torch.int32))
    real, stale = rows[:3] + rows[6:], rows[3:6]
    unpadded = meta(num_spec_decodes=2, spec_query_start_loc=i32([0, 3, 5]), spec_token_indx=i32(range(5)),
                    spec_state_indices_tensor=i32([[33, 34, 35], [36, 37, 38]]), num_accepted_tokens=i32(accepted),
                    non_spec_token_indx=torch.empty(0, dtype=torch.int32))
    return md, real, stale, unpadded


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_null_block_inside_the_counted_rows_is_padding(graph):
    """vLLM's index arrays hold its null block (0) in padded rows and in stale rows (vllm #51508): the drop-in
    passes NULL_BLOCK_ID as the pad slot, so such rows (and -1) read and write nothing, their outputs are
    zeros, block 0 stays as it was (intel/llm-scaler #711) and every real row is what the unpadded call gives,
    bit for bit. Decode and MTP steps, eager; and recorded once into a graph (pygdn.Graph on the drop-in's
    queue), replayed on new inputs with the stale rows moved."""
    layer = Layer(41)
    twin, before = layer.clone(), layer.clone()
    q = vllm_xpu.cpu_queue()
    for kind in ("decode", "spec"):
        make = (lambda i: padded_decode(i)) if kind == "decode" else (lambda i: padded_spec([2, 3] if i % 2 else [3, 1]))
        md, real, _, unpadded = make(0)
        T = 6 if kind == "decode" else 8
        x = step_tensors(50, T)
        if graph:
            dropin(layer, {k: v.clone() for k, v in x.items()}, md, T)  # (prepares the layer and the batch)
            dropin(twin, {k: v[real].clone() for k, v in x.items()}, unpadded, len(real))
            with pygdn.Graph(q) as recorded:
                dropin(layer, x, md, T)
        for i in range(1, 4):
            new, real, stale, unpadded = make(i)
            for k in md:  # the step's metadata contents, in the tensors the call (or the graph) reads
                if isinstance(md[k], torch.Tensor):
                    md[k].copy_(new[k])
            fresh = step_tensors(50 + i, T)
            for k in x:
                x[k].copy_(fresh[k])
            y = {k: v[real].clone() for k, v in x.items()}
            if graph:
                recorded.replay()
            else:
                dropin(layer, x, md, T)
            dropin(twin, y, unpadded, len(real))
            for k in ("out", "z"):
                assert_bitwise(x[k][real], y[k], f"{kind} {i}: {k} of the real rows")
            assert torch.all(x["out"][stale] == 0), f"{kind} {i}: the stale rows' outputs are zeros"
            assert torch.equal(x["z"][stale], grouped_z(x["qkvz"][stale])), f"{kind} {i}: the stale rows' z"
            nobody = [r for r in range(T) if r not in real + stale]  # rows of no sequence: untouched
            assert torch.all(x["out"][nobody] == 5.0) and torch.all(x["z"][nobody] == 7.0), f"{kind} {i}: rows of no sequence"
            same_state(layer, twin, f"{kind} {i}")
            block0_kept(layer, before, f"{kind} {i}")


def test_full_graph_mtp_batch_replayed_with_fewer_sequences():
    """An MTP step recorded at a captured batch of 4 sequences (S + 1 = 3 tokens each, 12 rows) and
    replayed with 4, 2, 3 and 1 real ones, the metadata padded as vLLM's GDN builder pads a FULL-graph
    spec step (vllm/v1/attention/backends/gdn_attn.py: spec_state_indices rows past the real sequences
    NULL_BLOCK_ID, spec_query_start_loc repeated, num_accepted_tokens 1; the token index buffer keeps its
    entries): the real rows and caches are what the eager unpadded step gives, bit for bit, block 0 is
    untouched. (vllm-xpu-kernels refused such metadata in its checks: spec_query_start_loc must have size
    [num_spec_decodes + 1].)"""
    B, cols = 4, S + 1
    layer = Layer(61)
    twin, before = layer.clone(), layer.clone()
    blocks = [[10 + cols * n + t for t in range(cols)] for n in range(B)]
    md = spec_step(blocks, [1, 2, 3, 1])
    x = step_tensors(70, B * cols)
    dropin(layer, {k: v.clone() for k, v in x.items()}, md, B * cols)
    dropin(twin, {k: v.clone() for k, v in x.items()}, spec_step(blocks, [1, 2, 3, 1]), B * cols)
    with pygdn.Graph(vllm_xpu.cpu_queue()) as recorded:
        dropin(layer, x, md, B * cols)
    for i, real in enumerate([4, 2, 3, 1]):
        accepted = [(i + n) % cols + 1 for n in range(real)]
        md["spec_state_indices_tensor"][:real] = i32(blocks[:real])
        md["spec_state_indices_tensor"][real:] = NULL_BLOCK_ID
        md["spec_query_start_loc"][:] = i32([cols * min(n, real) for n in range(B + 1)])
        md["num_accepted_tokens"][:] = i32(accepted + [1] * (B - real))
        fresh = step_tensors(71 + i, B * cols)
        for k in x:
            x[k].copy_(fresh[k])
        y = {k: v[:real * cols].clone() for k, v in x.items()}
        recorded.replay()
        dropin(twin, y, spec_step(blocks[:real], accepted), real * cols)
        for k in ("out", "z"):
            assert_bitwise(x[k][:real * cols], y[k], f"replay {i} ({real} sequences): {k}")
        same_state(layer, twin, f"replay {i}")
        block0_kept(layer, before, f"replay {i}")


# ----------------------------------------------------------------------------- vLLM's conv-state layouts
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_conv_state_in_the_layout_vllm_allocates(monkeypatch, layout):
    """VLLM_SSM_CONV_STATE_LAYOUT=DS makes vLLM allocate the conv state [blocks, conv_dim, state_len]
    (is_conv_state_dim_first()), SD (its default) [blocks, state_len, conv_dim]: the drop-in reads the
    layout vLLM runs with. A decode, an MTP and a mixed step on a conv state of that layout give the bits of
    the time-major layer."""
    mamba_utils = pytest.importorskip("vllm.model_executor.layers.mamba.mamba_utils")
    monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", layout)
    mamba_utils.get_conv_state_layout.cache_clear()
    try:
        assert vllm_xpu.vllm_conventions() == (0, "dim_major" if layout == "DS" else "time_major")
        layer = Layer(81)
        twin = layer.clone()
        if layout == "DS":
            layer.conv_state = layer.conv_state.transpose(1, 2).contiguous()
        mixed, T_mixed = mixed_step([5, 9], [20, 21], [[3, 4, 5]], [2], seed=8)
        for i, (md, T) in enumerate([(decode_step([12, 13]), 2), (spec_step([[3, 4, 5], [6, 7, 8]], [1, 3]), 6),
                                     (mixed, T_mixed)]):
            x = step_tensors(90 + i, T)
            y = {k: v.clone() for k, v in x.items()}
            dropin(layer, x, md, T)
            plain(twin, y, md, T)
            for k in ("out", "z"):
                assert_bitwise(x[k], y[k], f"step {i}: {k}")
            conv = layer.conv_state.transpose(1, 2) if layout == "DS" else layer.conv_state
            assert_bitwise(conv.contiguous(), twin.conv_state, f"step {i}: conv_state")
            assert_bitwise(layer.ssm_state, twin.ssm_state, f"step {i}: ssm_state")
    finally:
        monkeypatch.undo()
        mamba_utils.get_conv_state_layout.cache_clear()


@pytest.mark.parametrize("over,match", [
    (dict(xk_conv="token"), r"xk_conv='token': 'rolled' \(vllm-xpu-kernels #544 and later\) or 'snapshot'"),
    (dict(env="window"), r"GDN_XPU_XK_CONV='window': 'rolled'"),
])
def test_unknown_xk_conv_refused_by_name(monkeypatch, over, match):
    layer = Layer(9)
    x = step_tensors(9, 3)
    if "env" in over:
        monkeypatch.setenv(vllm_xpu.XK_CONV_ENV, over.pop("env"))
    with pytest.raises(ValueError, match=match):
        dropin(layer, x, decode_step([12, 13, 14]), 3, **over)
