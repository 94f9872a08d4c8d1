"""The public functions: causal_conv1d, gated_delta_rule, attention (the whole GDN op).

Each checks shapes, dtypes, contiguity and queues in Python (ValueError / TypeError naming the
argument), then calls the C ABI, which validates the metadata contents and every array's extent
against its USM allocation (an array object describing more memory than its allocation holds is
refused there) and raises GdnError with the library's message on failure. Layouts: see
include/gdn_xpu.h and docs/op.md.

The queue: a dpctl.SyclQueue, a sycl::queue* as an int (torch.xpu.current_stream().sycl_queue)
or a "SyclQueueRef" capsule. Arrays: objects with __sycl_usm_array_interface__, or DLPack
producers of kDLOneAPI (USM) tensors, or, on a device that addresses host memory (the SYCL CPU
device: sycl::aspect::usm_system_allocations), of kDLCPU tensors (NumPy, torch CPU) as they are
(see _usm.py, _dlpack.py). Arrays are C-contiguous, except that the leading dimension of the token
arrays (rows) and of the caches (slots: Config.conv_slot_stride / ssm_slot_stride) may be strided.
"""
from __future__ import annotations

import dataclasses as _dc
import inspect as _inspect
import math as _math

from ._lib import ffi as _ffi, lib as _lib
from . import _dlpack
from ._c import (VOIDP as _VOIDP, TENSORS_P as _TENSORS_P, PREFILL_ENGINES as _PREFILL_ENGINES, new as _new,
                 check as _check, int32 as _int32)
from ._marshal import (TENSORS_INIT as _TENSORS_INIT, marshal as _marshal, marshal_arrays as _marshal_arrays,
                       view as _view)
from ._usm import as_queue as _as_queue
from .batch import Batch, counts_only as _counts_only
from .config import Config, _tensor_specs


def _call(fn, queue, cfg: Config, batch: Batch, arrays: dict, wait: bool = True):
    queue = _as_queue(queue)
    PreparedCall(fn, queue, cfg, _marshal(fn, queue, cfg, batch, arrays)).run(wait)


def causal_conv1d(queue, cfg: Config, batch: Batch, *, conv_weight, conv_state, conv_out, mixed_qkv=None, conv_bias=None,
                  qkvz=None, z_out=None, wait=True):
    """Depthwise causal conv (+SiLU) of mixed_qkv (cfg.packed_order != "none": of qkvz's q|k|v
    columns, copying its z columns to z_out if given) into conv_out; updates conv_state."""
    _call(_lib.gdn_causal_conv1d, queue, cfg, batch, dict(mixed_qkv=mixed_qkv, conv_weight=conv_weight,
                                                           conv_state=conv_state, conv_out=conv_out, conv_bias=conv_bias,
                                                           qkvz=qkvz, z_out=z_out), wait)


def gated_delta_rule(queue, cfg: Config, batch: Batch, *, conv_out, ssm_state, core_attn_out, a=None, b=None,
                     A_log=None, dt_bias=None, g=None, beta=None, workspace=None, ba=None, replay_ring=None,
                     replay_count=None, ssm_scale=None, wait=True):
    """Gated delta rule over q|k|v rows of conv_out; gates from a/b (packed: ba)/A_log/dt_bias or given g/beta.
    replay_ring / replay_count: the rings of replay mode (cfg.replay_tokens > 0); ssm_scale: the row
    scales of an 8-bit state (cfg.state_dtype "i8" / "f8e4m3", cfg.ssm_scale_shape)."""
    _call(_lib.gdn_gated_delta_rule, queue, cfg, batch, dict(conv_out=conv_out, ssm_state=ssm_state, ssm_scale=ssm_scale,
                                                              core_attn_out=core_attn_out, a=a, b=b, A_log=A_log,
                                                              dt_bias=dt_bias, g=g, beta=beta, workspace=workspace,
                                                              ba=ba, replay_ring=replay_ring,
                                                              replay_count=replay_count), wait)


def attention(queue, cfg: Config, batch: Batch, *, conv_weight, A_log, dt_bias, conv_state, ssm_state, core_attn_out,
              mixed_qkv=None, a=None, b=None, conv_bias=None, z=None, norm_weight=None, conv_out=None, workspace=None,
              qkvz=None, ba=None, z_out=None, replay_ring=None, replay_count=None, ssm_scale=None, wait=True):
    """The whole GDN op of one step: conv -> gates -> gated delta rule (-> gated RMSNorm with z).

    Unpacked (cfg.packed_order == "none"): mixed_qkv, a, b (and z for the norm). Packed: qkvz and
    ba as the in-projections produce them (include/gdn_xpu.h, gdn_packed_order_t); the norm runs
    with norm_weight on qkvz's z columns, and z_out, if given, receives those columns [rows, HV, V].
    replay_ring / replay_count: the rings of replay mode (cfg.replay_tokens > 0); ssm_scale: the row
    scales of an 8-bit state (cfg.state_dtype "i8" / "f8e4m3", cfg.ssm_scale_shape)."""
    _call(_lib.gdn_attention, queue, cfg, batch, dict(mixed_qkv=mixed_qkv, a=a, b=b, conv_weight=conv_weight,
                                                       A_log=A_log, dt_bias=dt_bias, conv_state=conv_state,
                                                       ssm_state=ssm_state, ssm_scale=ssm_scale, core_attn_out=core_attn_out,
                                                       conv_bias=conv_bias, z=z, norm_weight=norm_weight,
                                                       conv_out=conv_out, workspace=workspace, qkvz=qkvz, ba=ba,
                                                       z_out=z_out, replay_ring=replay_ring,
                                                       replay_count=replay_count), wait)


def flush_replay(queue, cfg: Config, slots, num_tokens, *, ssm_state, replay_ring, replay_count, wait=True):
    """Replay mode: replays the first num_tokens[i] ring entries of slot slots[i] onto its state and
    empties its ring (gdn_flush_replay): the slot then holds the per-token mode's state. slots and
    num_tokens: int32 arrays of one length (-1 in slots: skipped)."""
    queue = _as_queue(queue)
    # The caches get the checks of every call's arrays (dtype, shape, slot stride, writable).
    c_t, bound = _ffi.new(_TENSORS_P, _TENSORS_INIT[0]), {}
    _marshal_arrays(_lib.gdn_flush_replay, queue, cfg, 0,
                    dict(ssm_state=ssm_state, replay_ring=replay_ring, replay_count=replay_count), c_t, bound)
    keep, index, n = [hold for hold, *_ in bound.values()], [], None
    for name, obj in (("slots", slots), ("num_tokens", num_tokens)):
        address, shape, got, hold, _ = _view(obj, name, queue)
        if got != "i32":
            raise TypeError(f"{name}: dtype {got}, expected i32")
        if n is not None and _math.prod(shape) != n:
            raise ValueError(f"num_tokens: {_math.prod(shape)} elements, slots has {n}")
        n = _math.prod(shape)
        keep.append(hold)
        index.append(_ffi.cast(_VOIDP, address))
    c_cfg = cfg._to_c(_dlpack.host_memory_ok(queue))
    _check(_lib.gdn_flush_replay(_ffi.cast(_VOIDP, queue.addressof_ref()), c_cfg, _int32(n, "len(slots)"), *index,
                                 c_t.ssm_state, c_t.replay_ring, c_t.replay_count))
    if wait:
        queue.wait()


class PreparedCall:
    """One op with its arguments checked and marshalled once, to be run many times (the
    CUDA-graph pattern of a serving loop): made by prepare(). Each run costs the C call alone.

    What is bound: the config and batch VALUES at prepare() time (later changes to the Config or
    Batch objects do not reach it: prepare again) and every array by ADDRESS. Between runs
    write new contents into the same arrays — this step's tokens into mixed_qkv, its metadata
    into the batch's index arrays (the library validates their contents on every run unless
    batch.validate == "counts"). The arrays are kept alive by this object, so run(wait=False)
    is safe as long as it lives; wait on the queue before reading results on the host. DLPack
    arguments were consumed at prepare() time; their deleters run when this object goes.

    rebind(batch=..., **arrays) gives a call with another batch and/or other arrays in some
    fields and the rest as bound (an engine's layer: weights and caches bound once, each step's
    activations and metadata rebound).
    """

    __slots__ = ("_fn", "_q", "_queue", "_cfg", "_c_cfg", "_c_batch", "_c_t", "_keep", "_bound", "_rows",
                 "_row_fields", "_scratch", "_scratch_words", "_step", "op_name")

    def __init__(self, fn, queue, cfg, structs, op_name=""):
        self._fn, self._queue, self._cfg, self.op_name = fn, queue, cfg, op_name
        self._c_cfg, self._c_batch, self._c_t, self._keep, self._bound = structs
        self._rows = int(self._c_batch.num_actual_tokens)
        self._q = _ffi.cast(_VOIDP, queue.addressof_ref())
        self._row_fields = ()  # the bound arrays with a row per token (prepare() sets them)
        self._scratch = None   # _run_step's gdn_tensors_t (and its words: _scratch_words)
        self._step = None      # _run_step's last step: (rows, ((field, torch layout, pointer word), ...))

    def run(self, wait: bool = True) -> None:
        self._launch(self._c_batch, self._c_t, wait)

    def _launch(self, c_batch, c_t, wait):
        _check(self._fn(self._q, self._c_cfg, c_batch, c_t))
        if wait and not _lib.gdn_queue_recording(self._q):
            # The kernels run asynchronously; arrays nobody else keeps alive (a plain call's
            # temporaries) would be freed under them. wait=False relies on a living holder. (A
            # queue recording a graph ran nothing, and waiting on it is an error: the graph's
            # owner keeps the arrays alive, pygdn.Graph.)
            self._queue.wait()

    __call__ = run

    def rebind(self, batch: "Batch | None" = None, **arrays) -> "PreparedCall":
        """A new PreparedCall of the same op, config and queue, with batch (when given) and the given
        arrays in place of the bound ones; every other array stays bound as it is (not checked again:
        same address). Only arrays bound at prepare() can be rebound. The new batch and arrays get
        prepare()'s checks; a token array that stays bound must have rows for the new batch's
        num_actual_tokens. This object is unchanged (a call of it may still be running)."""
        keep, bound, c_t = [], dict(self._bound), _new(_TENSORS_P, self._c_t[0])
        c_batch, rows = self._bind_step(batch, arrays, keep, bound, c_t)
        out = PreparedCall.__new__(PreparedCall)
        out._fn, out._q, out._queue, out._cfg, out.op_name = self._fn, self._q, self._queue, self._cfg, self.op_name
        # (keep: the batch's arrays; bound holds every array's, prepare() made sure of it)
        out._c_cfg, out._c_batch, out._c_t, out._keep, out._bound, out._rows, out._row_fields = (
            self._c_cfg, c_batch, c_t, keep, bound, rows, self._row_fields)
        out._scratch = out._step = None
        return out

    def _run_step(self, batch, wait, arrays):
        """rebind(batch, **arrays).run(wait) without making the new call: the step's tensors are written
        into this call's scratch copy of its gdn_tensors_t. For pygdn's vLLM bindings, which run a
        layer's steps one at a time on one thread, as the engine calls them (not thread-safe); the
        step's arrays are the caller's to keep alive, as with a rebound call dropped after its run.

        A step of torch tensors under the same names, of the layouts (_dlpack.torch_layout) and row
        count the last step passed rebind's checks with, passes them again (the checks read nothing
        else): only the tensors' addresses are written, the scratch keeps the last step's stride
        fields. The batch's checks are the batch's (Batch.bind keeps them)."""
        step, rows = self._step, batch.num_actual_tokens
        if step is not None and step[0] == rows and len(arrays) == len(step[1]):
            words, layout = self._scratch_words, _dlpack.torch_layout
            for (field, obj), (seen_field, seen, word) in zip(arrays.items(), step[1]):
                if field != seen_field or layout(obj) != seen:
                    break
                words[word] = obj.data_ptr()
            else:
                self._launch(batch._to_c(self._queue, []), self._scratch, wait)
                return
        self._step = None  # (the scratch is rewritten below: valid again once the checks pass)
        c_t = self._scratch
        if c_t is None:
            c_t = self._scratch = _new(_TENSORS_P, self._c_t[0])
            self._scratch_words = _ffi.cast("uintptr_t *", c_t)
        else:
            c_t[0] = self._c_t[0]
        keep = []  # (the batch's arrays: the batch holds them too)
        c_batch, _ = self._bind_step(batch, arrays, keep, {}, c_t)
        layouts = tuple((field, _dlpack.torch_layout(obj), _POINTER_WORDS[field]) for field, obj in arrays.items())
        if all(seen is not None for _, seen, _ in layouts):
            self._step = (rows, layouts)
        self._launch(c_batch, c_t, wait)

    def _bind_step(self, batch, arrays, keep, bound, c_t):
        """rebind's checks of batch and arrays, their addresses written into c_t and their entries into
        bound (and the batch's arrays appended to keep): (the gdn_batch_t, the batch's rows)."""
        if not arrays.keys() <= self._bound.keys():
            unknown = sorted(arrays.keys() - self._bound.keys())
            raise TypeError(f"rebind: {', '.join(unknown)} not bound by this call (prepare() again to add arrays)")
        for obj in arrays.values():
            if obj is None:
                given = [f for f, obj in arrays.items() if obj is None]
                raise TypeError(f"rebind: {', '.join(given)}=None (prepare() again to drop arrays)")
        rows, c_batch = self._rows, self._c_batch
        if batch is not None:
            c_batch = batch._to_c(self._queue, keep)
            rows = batch.num_actual_tokens
        if rows != self._rows:
            for field in self._row_fields:
                entries = self._bound[field][1]
                if entries < rows and field not in arrays:
                    raise ValueError(f"{field}: bound with {entries} rows, the batch has num_actual_tokens={rows}: "
                                     "rebind it too")
        _marshal_arrays(self._fn, self._queue, self._cfg, rows, arrays, c_t, bound)
        return c_batch, rows

    def __repr__(self):
        return f"<pygdn.PreparedCall {self.op_name}: {len(self._bound)} arrays bound>"


def prepare(op, queue, cfg: Config, batch: Batch, **arrays) -> PreparedCall:
    """prepare(pygdn.attention, queue, cfg, batch, mixed_qkv=..., ...) -> PreparedCall.

    op is pygdn.attention, pygdn.causal_conv1d or pygdn.gated_delta_rule; the keyword arrays
    are that function's (same names, same required ones, same checks). The returned object's
    run(wait=True) performs the call: see PreparedCall for what stays bound."""
    name = getattr(op, "__name__", repr(op))
    if op not in _C_FUNCTIONS:
        raise TypeError(f"op: expected one of pygdn.{', pygdn.'.join(f.__name__ for f in _C_FUNCTIONS)}, got {name}")
    if "wait" in arrays:
        raise TypeError("wait: not an argument of prepare(); pass it to PreparedCall.run()")
    try:  # the op's own signature says which arrays exist and which are required
        bound = _inspect.signature(op).bind(queue, cfg, batch, **arrays)
    except TypeError as e:
        raise TypeError(f"prepare({name}): {e}") from None
    given = {k: v for k, v in bound.arguments.items() if k not in ("queue", "cfg", "batch")}
    queue = _as_queue(queue)
    fn = getattr(_lib, _C_FUNCTIONS[op])
    c_cfg, c_batch, c_t, keep, bound = _marshal(fn, queue, cfg, batch, given)
    # Every array's hold in bound, which a rebind keeps (arrays that the config's cache of a plain
    # call's arrays vouched for come without one: given them here, in a copy of that cache's dict).
    bound = {f: (given[f] if hold is None else hold, *rest) for f, (hold, *rest) in bound.items()}
    # (a copy of the config: rebind() checks against the values bound here)
    call = PreparedCall(fn, queue, _dc.replace(cfg), (c_cfg, c_batch, c_t, keep, bound), name)
    call._row_fields = tuple(f for f in bound if f in _row_arrays(cfg))
    return call


def _row_arrays(cfg: Config):
    """The array arguments with a row per token: their leading dimension is the batch's rows."""
    return {f for f, (_, lead, _) in _tensor_specs(cfg, -1).items() if lead == -1}


def warmup(queue, cfg: Config) -> None:
    """Compile (or load from cache) every kernel cfg needs, so later calls start at once."""
    q = _as_queue(queue)  # held through the call: an int or capsule queue becomes a dpctl copy, freed with it
    _check(_lib.gdn_warmup(_ffi.cast("void *", q.addressof_ref()), cfg._to_c()))


def prefill_path(queue, cfg: Config) -> tuple:
    """(engine, text): what runs a prefill's chunk products with cfg on the queue's device, decided as
    a call decides it (gdn_prefill_path). engine: "f32" (f32 FMAs), "xmx" or "amx" (bf16 operands on
    the matrix engine, joint_matrix), "bf16-emulated" (bf16 operands, f32 accumulators, on FMA units);
    text names it, its tile shape and why."""
    q = _as_queue(queue)
    engine, buf = _ffi.new("int32_t *"), _ffi.new("char[]", 512)
    _check(_lib.gdn_prefill_path(_ffi.cast("void *", q.addressof_ref()), cfg._to_c(), engine, buf, 512))
    return _PREFILL_ENGINES[engine[0]], _ffi.string(buf).decode()


def workspace_size(cfg: Config, batch: Batch) -> int:
    """Upper bound of the workspace bytes attention() needs for this batch's counts."""
    n = _ffi.new("size_t *")
    _check(_lib.gdn_attention_workspace_size(cfg._to_c(), _counts_only(batch), n))
    return int(n[0])


# gdn_tensors_t's pointer fields by their index in the struct read as uintptr_t words (_run_step
# writes a step's addresses there: an int stored, no pointer object made).
_POINTER_WORDS = {f: _ffi.offsetof("gdn_tensors_t", f) // _ffi.sizeof("uintptr_t")
                  for f, t in _ffi.typeof("gdn_tensors_t").fields if t.type.kind == "pointer"}

# The public ops and the C entry points they call (prepare() maps one to the other).
_C_FUNCTIONS = {attention: "gdn_attention", causal_conv1d: "gdn_causal_conv1d", gated_delta_rule: "gdn_gated_delta_rule"}
