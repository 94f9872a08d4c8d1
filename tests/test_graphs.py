"""Graphs (include/gdn_xpu.h "Graphs"): a step's calls recorded once into a SYCL command graph
(pygdn.Graph: gdn_graph_begin / gdn_graph_end) and replayed with new contents in every array --
inputs, metadata, caches -- at the addresses recorded. Each replay is compared bit for bit with
eager calls of the same step on a twin of the layer's caches, on both kernel families (the CPU
device's variants and, with GDN_XPU_GENERIC_KERNELS=1, the generic kernels).

Kernel builds: K = V = 16, f32 activations and states, the shapes of test_replay.py and test_kda.py
(their builds are shared)."""
import numpy as np
import pytest

import dpctl
import pygdn
from helpers import default_queue, usm

K = V = 16
W = 4
PAD = -1


def config(gate, num_slots, S=0, replay=False, ssm_layout="kv"):
    """A GDN layer (H = 1, HV = 2) or a KDA layer (H = HV = 2, Kimi Linear's gates)."""
    heads = dict(num_k_heads=1, num_v_heads=2) if gate == "gdn" else dict(
        num_k_heads=2, num_v_heads=2, gate_mode="channel", out_gate="sigmoid", gate_lower_bound=-5.0)
    return pygdn.Config(**heads, head_k_dim=K, head_v_dim=V, num_slots=num_slots, conv_width=W, act_dtype="f32",
                        ssm_layout=ssm_layout, conv_layout="time_major", conv_spec_layout="rolled",
                        conv_state_len=W - 1 + S, replay_tokens=1 + S if replay else 0)


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


class Layer:
    """One layer: weights, inputs and the batch (metadata arrays) shared by both runs; caches and
    outputs twice, [0] stepped by graph replays, [1] by eager calls."""

    def __init__(self, q, rng, cfg, rows, batch, norm=True):
        self.q, self.cfg, self.rows, self.batch = q, cfg, rows, batch
        C, HV, gk = cfg.conv_dim, cfg.num_v_heads, cfg.gate_k
        self.weights = dict(conv_weight=usm(q, f32(rng, C, W, scale=0.5)), conv_bias=usm(q, f32(rng, C, scale=0.1)),
                            A_log=usm(q, np.log(rng.uniform(0.5, 4.0, HV)).astype(np.float32)),
                            dt_bias=usm(q, rng.uniform(-1, 1, HV * gk).astype(np.float32)))
        if norm:
            self.weights["norm_weight"] = usm(q, rng.uniform(0.5, 1.5, V).astype(np.float32))
        shapes = dict(mixed_qkv=(rows, C), a=(rows, HV * gk), b=(rows, HV), z=(rows, HV, V))
        self.inputs = {k: pygdn.UsmArray(s, np.float32, q) for k, s in shapes.items() if norm or k != "z"}
        conv0, ssm0 = f32(rng, *cfg.conv_state_shape, scale=0.5), f32(rng, *cfg.ssm_state_shape, scale=0.3)
        self.caches = []
        for _ in range(2):
            c = dict(conv_state=usm(q, conv0), ssm_state=usm(q, ssm0),
                     core_attn_out=pygdn.UsmArray((rows, HV, V), np.float32, q))
            if cfg.replay_tokens:
                c.update(replay_ring=usm(q, np.zeros(cfg.replay_ring_shape, np.float32)),
                         replay_count=usm(q, np.zeros(cfg.replay_count_shape, np.int32)))
            self.caches.append(c)

    def new_inputs(self, rng):
        for name, arr in self.inputs.items():
            arr.copy_from(f32(rng, *arr.shape))

    def call(self, run, batch=None):
        pygdn.attention(self.q, self.cfg, self.batch if batch is None else batch, **self.weights, **self.inputs,
                        **self.caches[run])

    def warm_up(self):
        """An eager call (kernels built, the workspace grown before recording), then run [1]'s caches
        reset to run [0]'s."""
        self.call(1)
        for name, arr in self.caches[1].items():
            arr.copy_from(self.caches[0][name].to_numpy())

    def compare(self, what):
        """Every array the two runs wrote, bit for bit; returns the graph run's output."""
        for name in self.caches[0]:
            got, want = (c[name].to_numpy() for c in self.caches)
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what}: {name} differs from the eager call's"
        return self.caches[0]["core_attn_out"].to_numpy()


class Meta:
    """A batch's metadata arrays at fixed addresses (sized by the counts), rewritten per step."""

    NON_SPEC = ("non_spec_query_start_loc", "non_spec_state_indices", "has_initial_state", "non_spec_token_indx")
    SPEC = ("spec_query_start_loc", "spec_state_indices", "num_accepted_tokens", "spec_token_indx")

    def __init__(self, q, **counts):
        self.counts = dict({k: 0 for k in pygdn.batch.BATCH_COUNTS}, **counts)
        self.arrays = {}
        c, elements = self.counts, pygdn.batch.array_elements(self.counts)
        for names, seqs in ((self.NON_SPEC, c["num_prefills"] + c["num_decodes"]), (self.SPEC, c["num_spec_decodes"])):
            for name in names if seqs else ():
                dtype = pygdn.batch.BATCH_ARRAYS[name].dtype
                self.arrays[name] = pygdn.UsmArray((elements[name],), np.uint8 if dtype == "u8" else np.int32, q)
        self.batch = pygdn.Batch(validate="counts", **counts, **self.arrays)

    def write(self, **values):
        assert set(values) == set(self.arrays), sorted(set(values) ^ set(self.arrays))
        for name, v in values.items():
            self.arrays[name].copy_from(np.asarray(v).reshape(-1))


def record(q, calls):
    with pygdn.Graph(q) as graph:
        for call in calls:
            call()
    return graph


def step_and_compare(graph, layers, what):
    """A replay, then the same step eagerly; every array both wrote compared. The outputs."""
    graph.replay()
    for layer in layers:
        layer.call(1)
    return [layer.compare(what) for layer in layers]


# ----------------------------------------------------------------------------- a multi-layer decode step
def test_multi_layer_decode_step(queue, kernels):
    """Three GDN layers' decode step (five sequences, one of them graph padding; the fused gated
    RMSNorm) recorded once, replayed for five steps: each step new inputs, cache contents, slots,
    row order and padded sequence; then three replays in a row."""
    rng = np.random.default_rng(700)
    B, slots = 5, 12
    cfg = config("gdn", slots, ssm_layout="vk")
    meta = Meta(queue, num_decodes=B, num_actual_tokens=B, non_spec_token_count=B)
    layers = [Layer(queue, rng, cfg, B, meta.batch) for _ in range(3)]

    def write_step():
        slot = rng.permutation(slots)[:B].astype(np.int32)
        slot[rng.integers(B)] = PAD
        meta.write(non_spec_query_start_loc=np.arange(B + 1), non_spec_state_indices=slot,
                   has_initial_state=np.ones(B, np.uint8), non_spec_token_indx=rng.permutation(B))
        for layer in layers:
            layer.new_inputs(rng)

    write_step()
    for layer in layers:
        layer.warm_up()
    graph = record(queue, [lambda layer=layer: layer.call(0) for layer in layers])
    outs = []
    for step in range(5):
        write_step()
        if step == 2:  # new cache contents under both runs
            for layer in layers:
                conv, ssm = f32(rng, *cfg.conv_state_shape), f32(rng, *cfg.ssm_state_shape, scale=0.3)
                for c in layer.caches:
                    c["conv_state"].copy_from(conv), c["ssm_state"].copy_from(ssm)
        outs.append(step_and_compare(graph, layers, f"step {step}"))
    assert all(np.any(o != 0) and np.all(np.isfinite(o)) for s in outs for o in s)
    assert not np.array_equal(outs[0][0], outs[1][0])  # the replays computed new contents
    for _ in range(3):  # replays back to back, nothing waited for between them
        graph.replay(wait=False)
    for _ in range(3):
        for layer in layers:
            layer.call(1)
    for layer in layers:
        layer.compare("three replays in a row")


# ----------------------------------------------------------------------------- an 8-step MTP loop
@pytest.mark.parametrize("gate", ["gdn", "kda"])
@pytest.mark.parametrize("mode", ["per_token", "replay"])
def test_mtp_loop(queue, kernels, gate, mode):
    """An MTP step -- three spec sequences of 1 + S tokens (vLLM's uniform drafts) and a decode --
    recorded once and replayed for eight steps: each step new tokens, row order, accepted counts
    (all rejected, all accepted, random), a spec sequence padded on some steps; in replay mode one
    slot flushed between replays (gdn_flush_replay is not recordable, but runs between them)."""
    rng = np.random.default_rng(710 if gate == "gdn" else 711)
    R, S = 3, 3
    cols = S + 1
    slots = R * cols + 2
    cfg = config(gate, slots, S, replay=mode == "replay")
    T = R * cols + 1
    meta = Meta(queue, num_decodes=1, num_spec_decodes=R, num_spec=S, num_actual_tokens=T, non_spec_token_count=1,
                spec_token_count=R * cols)
    layer = Layer(queue, rng, cfg, T, meta.batch)
    blocks = np.arange(R * cols, dtype=np.int32).reshape(R, cols)
    decode_slot = R * cols

    def write_step(accepted, padded):
        rows = rng.permutation(T).astype(np.int32)
        spec = blocks.copy()
        if padded is not None:
            spec[padded] = PAD
        meta.write(non_spec_query_start_loc=[0, 1], non_spec_state_indices=[decode_slot], has_initial_state=[1],
                   non_spec_token_indx=rows[:1], spec_query_start_loc=np.arange(0, R * cols + 1, cols),
                   spec_state_indices=spec, num_accepted_tokens=accepted, spec_token_indx=rows[1:])
        layer.new_inputs(rng)

    accepted = np.ones(R, np.int32)
    write_step(accepted, None)
    layer.warm_up()
    graph = record(queue, [lambda: layer.call(0)])
    outs = []
    for step in range(8):
        padded = 1 if step in (3, 6) else None
        write_step(accepted, padded)
        outs.append(step_and_compare(graph, [layer], f"step {step}")[0])
        accepted = (np.full(R, cols) if step == 1 else np.ones(R) if step == 2
                    else rng.integers(1, cols + 1, R)).astype(np.int32)
        if mode == "replay" and step == 4:  # sequence 0's exact state, in both runs
            for c in layer.caches:
                pygdn.flush_replay(queue, cfg, usm(queue, blocks[:1, 0].copy()), usm(queue, accepted[:1].copy()),
                                   ssm_state=c["ssm_state"], replay_ring=c["replay_ring"], replay_count=c["replay_count"])
    assert all(np.all(np.isfinite(o)) and np.any(o != 0) for o in outs)


# ----------------------------------------------------------------------------- prefills
def test_mixed_step_with_prefills(queue, kernels):
    """Prefills are recordable (validate="counts" reads nothing back): a step of two prefills, two
    decodes and two spec sequences recorded once, replayed with other prefill lengths (the counts
    fixed: 150 prefill tokens in all), other spec lengths (6 tokens in all), has_initial_state,
    sequence and row orders. One prefill crosses chunks (the chunked form), the other is short or a
    single token."""
    rng = np.random.default_rng(720)
    S, slots = 3, 16
    cfg = config("gdn", slots, S)
    n_ns, T_ns, T_s = 4, 152, 6
    T = T_ns + T_s
    meta = Meta(queue, num_prefills=2, num_decodes=2, num_spec_decodes=2, num_spec=S, num_actual_tokens=T,
                non_spec_token_count=T_ns, spec_token_count=T_s)
    layer = Layer(queue, rng, cfg, T, meta.batch)

    def write_step(prefill, spec, order):
        lens = [prefill, T_ns - 2 - prefill, 1, 1]
        order = rng.permutation(n_ns) if order else np.arange(n_ns)  # the sequences in any order
        lens = [lens[i] for i in order]
        slot = rng.permutation(slots)[:n_ns + 2 * (S + 1)].astype(np.int32)
        rows = rng.permutation(T).astype(np.int32)
        meta.write(non_spec_query_start_loc=np.cumsum([0] + lens), non_spec_state_indices=slot[:n_ns],
                   has_initial_state=rng.integers(0, 2, n_ns).astype(np.uint8), non_spec_token_indx=rows[:T_ns],
                   spec_query_start_loc=[0, spec, T_s], spec_state_indices=slot[n_ns:],
                   num_accepted_tokens=rng.integers(1, S + 2, 2), spec_token_indx=rows[T_ns:])
        layer.new_inputs(rng)

    write_step(100, 3, False)
    layer.warm_up()
    graph = record(queue, [lambda: layer.call(0)])
    for step, (prefill, spec) in enumerate([(100, 3), (1, 2), (149, 4), (64, 3), (75, 2)]):
        write_step(prefill, spec, step > 0)
        step_and_compare(graph, [layer], f"step {step} (prefill of {prefill} tokens)")


# ----------------------------------------------------------------------------- the workspace
def test_library_workspace_outlives_growth(kernels):
    """A call recorded on a fresh queue (its workspace allocated while recording), then an eager
    call of a larger batch on that queue (the workspace grows): the recorded address stays valid
    (retired, not freed) and a replay still equals the eager call."""
    q = default_queue()  # a queue of its own: its workspace is made while recording
    rng = np.random.default_rng(730)
    cfg = config("gdn", 16)
    meta = Meta(q, num_decodes=2, num_actual_tokens=2, non_spec_token_count=2)
    small = Layer(q, rng, cfg, 2, meta.batch)
    meta.write(non_spec_query_start_loc=[0, 1, 2], non_spec_state_indices=[3, 5], has_initial_state=[1, 1],
               non_spec_token_indx=[1, 0])
    small.new_inputs(rng)
    graph = record(q, [lambda: small.call(0)])
    big_meta = Meta(q, num_prefills=1, num_actual_tokens=200, non_spec_token_count=200)
    big = Layer(q, rng, cfg, 200, big_meta.batch)  # a prefill: a larger workspace (chunk tables and matrices)
    big_meta.write(non_spec_query_start_loc=[0, 200], non_spec_state_indices=[7], has_initial_state=[1],
                   non_spec_token_indx=np.arange(200))
    big.new_inputs(rng)
    big.call(1)
    for _ in range(2):
        small.new_inputs(rng)
        step_and_compare(graph, [small], "replay after growth")


# ----------------------------------------------------------------------------- what cannot be recorded
def test_what_cannot_be_recorded(queue):
    rng = np.random.default_rng(740)
    cfg = config("gdn", 8, S=1, replay=True)
    meta = Meta(queue, num_decodes=1, num_actual_tokens=1, non_spec_token_count=1)
    layer = Layer(queue, rng, cfg, 1, meta.batch, norm=False)
    meta.write(non_spec_query_start_loc=[0, 1], non_spec_state_indices=[2], has_initial_state=[1],
               non_spec_token_indx=[0])
    layer.new_inputs(rng)
    before = {k: v.to_numpy() for k, v in layer.caches[0].items()}
    full = pygdn.Batch(validate="full", num_decodes=1, num_actual_tokens=1, non_spec_token_count=1, **meta.arrays)
    flush_slots, flush_tokens = usm(queue, np.array([2], np.int32)), usm(queue, np.array([1], np.int32))
    c = layer.caches[0]
    # (inside the recording nothing may wait on the queue: arrays are made before it)
    with pygdn.Graph(queue) as graph:
        assert pygdn.graph.recording(queue)
        with pytest.raises(pygdn.GdnError, match="GDN_VALIDATE_FULL reads the metadata back") as e:
            layer.call(0, full)
        assert e.value.status_name == "GDN_ERROR_UNSUPPORTED"
        with pytest.raises(pygdn.GdnError, match="gdn_flush_replay reads") as e:
            pygdn.flush_replay(queue, cfg, flush_slots, flush_tokens, ssm_state=c["ssm_state"],
                               replay_ring=c["replay_ring"], replay_count=c["replay_count"], wait=False)
        assert e.value.status_name == "GDN_ERROR_UNSUPPORTED"
        with pytest.raises(RuntimeError, match="nothing recorded yet"):
            graph.replay()
        qp = pygdn.ffi.cast("void *", queue.addressof_ref())
        assert pygdn.lib.gdn_queue_wait(qp) == pygdn.lib.GDN_ERROR_DEVICE  # (dpctl's queue.wait() would abort)
        assert "recording" in pygdn._lib.last_error()
    assert not pygdn.graph.recording(queue)
    graph.replay()  # nothing was recorded
    for k, v in layer.caches[0].items():
        assert np.array_equal(v.to_numpy(), before[k]), k
    ooo = dpctl.SyclQueue(queue.sycl_context, queue.sycl_device)  # out of order
    with pytest.raises(pygdn.GdnError, match="out of order") as e:
        with pygdn.Graph(ooo):
            pass
    assert e.value.status_name == "GDN_ERROR_UNSUPPORTED"
