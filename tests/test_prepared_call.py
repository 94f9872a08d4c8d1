"""pygdn.prepare(): arguments marshalled once, run many times with new contents written into the
same arrays (a serving loop). Each step is checked against the float64 reference, chaining the
states; errors are raised at prepare() time (arguments) or at run time (metadata contents)."""
import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from pygdn.batch import make_batch, to_device
from pygdn.batch import BATCH_ARRAYS
from helpers import assert_close, conv_from_canonical, conv_to_canonical, ssm_from_canonical, ssm_to_canonical, usm

H, HV, K, V, W, S, SLOTS = 1, 2, 16, 16, 4, 2, 32


def _config():
    return pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                        conv_state_len=W - 1 + S, act_dtype="f32", ssm_layout="vk", conv_layout="time_major",
                        conv_spec_layout="rolled")


def _step_meta(rng):
    # Same counts every step (what a prepared call requires), new slots / order / acceptance.
    return make_batch(rng, num_slots=SLOTS, prefill_lens=[5], num_decodes=2, spec_lens=[3, 2, 3], num_spec=S,
                      order="random", pad_non_spec=1, pad_len=1)


class Loop:
    def __init__(self, queue, rng):
        self.queue, self.cfg = queue, _config()
        C = self.cfg.conv_dim
        self.meta = _step_meta(rng)
        self.T = self.meta["num_actual_tokens"]
        self.w = (rng.standard_normal((C, W)) * 0.5).astype(np.float32)
        self.bias = (rng.standard_normal(C) * 0.1).astype(np.float32)
        self.A_log = np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32)
        self.dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
        conv0 = rng.standard_normal((SLOTS, C, self.cfg.state_len)).astype(np.float32)
        ssm0 = (rng.standard_normal((SLOTS, HV, K, V)) * 0.5).astype(np.float32)
        self.d = dict(mixed_qkv=usm(queue, np.zeros((self.T, C), np.float32)),
                      a=usm(queue, np.zeros((self.T, HV), np.float32)), b=usm(queue, np.zeros((self.T, HV), np.float32)),
                      conv_weight=usm(queue, self.w), conv_bias=usm(queue, self.bias), A_log=usm(queue, self.A_log),
                      dt_bias=usm(queue, self.dt_bias), conv_state=usm(queue, conv_from_canonical(conv0, "time_major")),
                      ssm_state=usm(queue, ssm_from_canonical(ssm0, "vk")),
                      core_attn_out=usm(queue, np.full((self.T + 1, HV, V), 5.0, np.float32)))
        self.batch = to_device(self.meta, queue)

    def states(self):
        conv = conv_to_canonical(self.d["conv_state"].to_numpy(), "time_major").astype(np.float64)
        return conv, ssm_to_canonical(self.d["ssm_state"].to_numpy(), "vk").astype(np.float64)

    def write_step(self, rng, meta):
        """This step's metadata and activations, written into the arrays the prepared call holds."""
        for field in BATCH_ARRAYS:
            if getattr(self.batch, field) is not None:  # (the state-cache arrays stay NULL here)
                getattr(self.batch, field).copy_from(meta[field])
        x = rng.standard_normal((self.T, self.cfg.conv_dim)).astype(np.float32)
        a = rng.standard_normal((self.T, HV)).astype(np.float32)
        b = rng.standard_normal((self.T, HV)).astype(np.float32)
        for name, v in (("mixed_qkv", x), ("a", a), ("b", b)):
            self.d[name].copy_from(v)
        return x, a, b


def test_prepared_loop_matches_reference_each_step(queue):
    rng = np.random.default_rng(5)
    loop = Loop(queue, rng)
    step = pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **loop.d)
    assert isinstance(step, pygdn.PreparedCall) and "attention" in repr(step)
    for i in range(4):
        meta = loop.meta if i == 0 else _step_meta(rng)
        x, a, b = loop.write_step(rng, meta)
        conv0, ssm0 = loop.states()
        step(wait=(i % 2 == 0))
        queue.wait()
        want_o, want_conv, want_ssm = ref.gdn_attention(x, a, b, loop.w.astype(np.float64), loop.bias.astype(np.float64),
                                                        loop.A_log, loop.dt_bias, conv0, ssm0, meta, H, HV, K, V,
                                                        spec_layout="rolled")
        got = loop.d["core_attn_out"].to_numpy().astype(np.float64)
        assert_close(got[:loop.T], want_o, 2e-4, f"step {i}: core_attn_out")
        assert np.all(got[loop.T] == 5.0), f"step {i}: canary row past num_actual_tokens was written"
        conv, ssm = loop.states()
        assert np.array_equal(conv, want_conv), f"step {i}: conv_state"
        assert_close(ssm, want_ssm, 2e-4, f"step {i}: ssm_state")
        for s in range(SLOTS):  # slots this step did not address: bit-for-bit unchanged
            if np.array_equal(want_ssm[s], ssm0[s]):
                assert np.array_equal(ssm[s], ssm0[s]), f"step {i}: slot {s} changed"


def test_prepared_call_binds_values_at_prepare_time(queue):
    rng = np.random.default_rng(6)
    loop = Loop(queue, rng)
    step = pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **loop.d)
    loop.write_step(rng, loop.meta)
    loop.cfg.num_slots = 1  # would reject every slot index if the prepared call re-read the Config
    loop.batch.validate = "bogus"
    step()


def test_prepared_call_argument_errors(queue):
    rng = np.random.default_rng(7)
    loop = Loop(queue, rng)
    with pytest.raises(TypeError, match="op: expected one of pygdn.attention"):
        pygdn.prepare(np.add, queue, loop.cfg, loop.batch, **loop.d)
    missing = {k: v for k, v in loop.d.items() if k != "ssm_state"}
    with pytest.raises(TypeError, match="ssm_state"):
        pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **missing)
    with pytest.raises(TypeError, match="unexpected keyword argument 'g'"):
        pygdn.prepare(pygdn.causal_conv1d, queue, loop.cfg, loop.batch, g=loop.d["a"], **{
            k: loop.d[k] for k in ("mixed_qkv", "conv_weight", "conv_state")}, conv_out=loop.d["mixed_qkv"])
    with pytest.raises(TypeError, match="wait: not an argument of prepare"):
        pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, wait=False, **loop.d)
    bad = dict(loop.d, a=usm(queue, np.zeros((loop.T, HV), np.float16)))
    with pytest.raises(TypeError, match="^a: dtype f16, expected f32"):
        pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **bad)


def test_prepared_call_rejects_bad_metadata_at_run_and_changes_nothing(queue):
    rng = np.random.default_rng(8)
    loop = Loop(queue, rng)
    step = pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **loop.d)
    loop.write_step(rng, loop.meta)
    bad = loop.meta["spec_state_indices"].copy()
    bad[1, 0] = SLOTS + 3
    loop.batch.spec_state_indices.copy_from(bad)
    conv0, ssm0 = loop.states()
    out0 = loop.d["core_attn_out"].to_numpy()
    with pytest.raises(pygdn.GdnError, match="spec_state_indices"):
        step()
    conv, ssm = loop.states()
    assert np.array_equal(conv, conv0) and np.array_equal(ssm, ssm0)
    assert np.array_equal(loop.d["core_attn_out"].to_numpy(), out0)
    loop.batch.spec_state_indices.copy_from(loop.meta["spec_state_indices"])
    step()  # mended in place: the same prepared call runs


def test_prepared_conv_and_delta_rule_equal_the_plain_calls(queue):
    """The two sub-ops prepared give bit-identical results to their plain calls."""
    results = []
    for prepared in (False, True):
        loop = Loop(queue, np.random.default_rng(9))
        loop.write_step(np.random.default_rng(10), loop.meta)
        conv_out = usm(queue, np.zeros((loop.T, loop.cfg.conv_dim), np.float32))
        conv_args = dict(mixed_qkv=loop.d["mixed_qkv"], conv_weight=loop.d["conv_weight"],
                         conv_state=loop.d["conv_state"], conv_out=conv_out, conv_bias=loop.d["conv_bias"])
        rule_args = dict(conv_out=conv_out, ssm_state=loop.d["ssm_state"], core_attn_out=loop.d["core_attn_out"],
                         a=loop.d["a"], b=loop.d["b"], A_log=loop.d["A_log"], dt_bias=loop.d["dt_bias"])
        if prepared:
            pygdn.prepare(pygdn.causal_conv1d, queue, loop.cfg, loop.batch, **conv_args)()
            pygdn.prepare(pygdn.gated_delta_rule, queue, loop.cfg, loop.batch, **rule_args).run()
        else:
            pygdn.causal_conv1d(queue, loop.cfg, loop.batch, **conv_args)
            pygdn.gated_delta_rule(queue, loop.cfg, loop.batch, **rule_args)
        results.append([conv_out.to_numpy(), loop.d["core_attn_out"].to_numpy()] + list(loop.states()))
    for plain, prep in zip(*results):
        assert np.array_equal(plain, prep)


def test_rebind_steps_of_changing_shape_match_reference(queue):
    """An engine's layer: weights and caches bound once, each step's batch (other counts) and token
    arrays (new objects) rebound; the rebound arrays' own addresses reach the C call, the others stay."""
    rng = np.random.default_rng(11)
    loop = Loop(queue, rng)
    first = pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **loop.d)
    bound = {k: getattr(first._c_t, k) for k in ("conv_weight", "conv_state", "ssm_state", "A_log")}
    address = lambda p: int(pygdn.ffi.cast("uintptr_t", p))  # noqa: E731
    shapes = [dict(num_decodes=1), dict(prefill_lens=[9, 3], num_decodes=2), dict(spec_lens=[3, 1], num_spec=S),
              dict(num_decodes=4, spec_lens=[2], num_spec=S, order="random")]
    C = loop.cfg.conv_dim
    for i, shape in enumerate(shapes):
        meta = make_batch(rng, num_slots=SLOTS, **shape)
        T = meta["num_actual_tokens"]
        x, a, b = (rng.standard_normal(s).astype(np.float32) for s in ((T, C), (T, HV), (T, HV)))
        step = dict(mixed_qkv=usm(queue, x), a=usm(queue, a), b=usm(queue, b),
                    core_attn_out=usm(queue, np.zeros((T, HV, V), np.float32)))
        conv0, ssm0 = loop.states()
        call = first.rebind(to_device(meta, queue, validate="counts"), **step)
        for name, arr in step.items():
            assert address(getattr(call._c_t, name)) == arr.memory._pointer, f"step {i}: {name}"
        for name, ptr in bound.items():
            assert getattr(call._c_t, name) == ptr, f"step {i}: {name} moved"
        call.run()
        want_o, want_conv, want_ssm = ref.gdn_attention(x, a, b, loop.w.astype(np.float64), loop.bias.astype(np.float64),
                                                        loop.A_log, loop.dt_bias, conv0, ssm0, meta, H, HV, K, V,
                                                        spec_layout="rolled")
        assert_close(step["core_attn_out"].to_numpy(), want_o, 2e-4, f"step {i}: core_attn_out")
        conv, ssm = loop.states()
        assert np.array_equal(conv, want_conv), f"step {i}: conv_state"
        assert_close(ssm, want_ssm, 2e-4, f"step {i}: ssm_state")
    assert address(first._c_t.mixed_qkv) == loop.d["mixed_qkv"].memory._pointer  # the prepared call unchanged


def test_rebind_errors(queue):
    rng = np.random.default_rng(12)
    loop = Loop(queue, rng)
    first = pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **loop.d)
    with pytest.raises(TypeError, match="rebind: z not bound by this call"):
        first.rebind(z=loop.d["core_attn_out"])
    with pytest.raises(TypeError, match=r"rebind: a=None"):
        first.rebind(a=None)
    with pytest.raises(TypeError, match="^a: dtype f16, expected f32"):
        first.rebind(a=usm(queue, np.zeros((loop.T, HV), np.float16)))
    more = to_device(make_batch(rng, num_slots=SLOTS, prefill_lens=[loop.T + 4]), queue)
    with pytest.raises(ValueError, match=rf"^\w+: bound with \d+ rows, the batch has num_actual_tokens={loop.T + 4}"):
        first.rebind(more, mixed_qkv=usm(queue, np.zeros((loop.T + 4, loop.cfg.conv_dim), np.float32)))
    with pytest.raises(ValueError, match=r"^b: shape \(2, 2\), expected \[>=\d+"):
        first.rebind(b=usm(queue, np.zeros((2, HV), np.float32)))
    fewer = to_device(make_batch(rng, num_slots=SLOTS, num_decodes=2), queue)
    first.rebind(fewer).run()  # the bound token arrays have rows enough


def test_a_rebound_call_holds_every_array_it_was_prepared_with(queue):
    """A rebound call keeps every array it did not replace alive: with the caller's references and
    the call it was rebound from gone, its arrays are still there and it still computes."""
    import gc
    import weakref
    rng = np.random.default_rng(11)
    loop = Loop(queue, rng)
    x, a, b = loop.write_step(rng, loop.meta)
    conv0, ssm0 = loop.states()
    step = pygdn.prepare(pygdn.attention, queue, loop.cfg, loop.batch, **loop.d)
    out = usm(queue, np.zeros((loop.T, HV, V), np.float32))
    again = step.rebind(core_attn_out=out)
    refs = {k: weakref.ref(v) for k, v in loop.d.items() if k != "core_attn_out"}  # (not rebound)
    del step
    loop.d.clear()
    gc.collect()
    alive = {k for k, r in refs.items() if r() is not None}
    assert alive == set(refs), f"arrays freed under the rebound call: {sorted(set(refs) - alive)}"
    again.run()
    want_o, _, _ = ref.gdn_attention(x, a, b, loop.w.astype(np.float64), loop.bias.astype(np.float64), loop.A_log,
                                     loop.dt_bias, conv0, ssm0, loop.meta, H, HV, K, V, spec_layout="rolled")
    assert_close(out.to_numpy().astype(np.float64), want_o, 2e-4, "core_attn_out of the rebound call")
