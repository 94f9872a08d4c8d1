"""Batch: one step's mixed batch (gdn_batch_t), with the one Python table of its fields
(BATCH_COUNTS, BATCH_ARRAYS); and make_batch() / to_device(), which build such metadata the way a
serving engine's scheduler does (for the demo, the benchmark and the tests): prefills, decodes and
speculative sequences, their token rows interleaved, graph padding, distinct state slots.
make_batch() returns host (numpy) metadata keyed like gdn_batch_t; to_device() uploads it.
"""
from __future__ import annotations

import dataclasses as _dc
import math as _math
import typing as _t

import numpy as _np

from ._lib import ffi as _ffi, lib as _lib
from ._c import (VOIDP as _VOIDP, BATCH_P as _BATCH_P, GdnError as _GdnError, check as _check, choice as _choice,
                 int32 as _int32)
from ._marshal import view as _view
from ._usm import UsmArray as _UsmArray, as_queue as _as_queue


# ---- gdn_batch_t's fields: the one table of them in Python (marshalling, batch.py, the tests) ----
# Read from the header through cffi: its int32 fields are the counts (and the two settings
# below), its pointer fields the metadata arrays, with their element type. How many elements the
# counts require of each array the library says (gdn_batch_array_elements: array_elements()).
_BATCH_SETTINGS = ("pad_slot_id", "validate")  # int32 fields of gdn_batch_t that are not counts
_C_ELEMENT_TYPES = {"int32_t": "i32", "uint8_t": "u8"}


class BatchArray(_t.NamedTuple):
    """One metadata array of gdn_batch_t: its element type (a pygdn dtype name)."""

    dtype: str


def _batch_table():
    counts, arrays = [], {}
    for name, field in _ffi.typeof("gdn_batch_t").fields:
        t = field.type
        if t.kind == "pointer":
            arrays[name] = BatchArray(_C_ELEMENT_TYPES[t.item.cname])
        elif t.cname == "int32_t" and name not in _BATCH_SETTINGS and not name.startswith("reserved"):
            counts.append(name)
    return tuple(counts), arrays


BATCH_COUNTS, BATCH_ARRAYS = _batch_table()  # in struct order


_COUNTS_CACHE = {}  # (counts, pad_slot_id, validate) -> Batch._counts_c() of them (read-only once made)


@_dc.dataclass
class Batch:
    """One step's mixed batch (gdn_batch_t). Arrays are SUAI objects or DLPack producers (int32;
    has_initial_state uint8/bool) or None. Arrays may be longer than needed (graph padding); only the prefix is read."""

    num_actual_tokens: int
    num_prefills: int = 0
    num_decodes: int = 0
    num_spec_decodes: int = 0
    num_spec: int = 0
    non_spec_token_count: int = 0
    spec_token_count: int = 0
    pad_slot_id: int = -1  # the padding slot index (vLLM: 0, its null block); negative indices are padding too
    validate: str = "full"  # "full" | "counts"
    non_spec_query_start_loc: object = None
    non_spec_state_indices: object = None
    has_initial_state: object = None
    non_spec_token_indx: object = None
    spec_query_start_loc: object = None
    spec_state_indices: object = None
    num_accepted_tokens: object = None
    spec_token_indx: object = None
    # State caches as engines keep them (read slots, block checkpoints): see gdn_xpu.h "State caches".
    checkpoint_interval: int = 0
    checkpoint_cols: int = 0
    non_spec_read_state_indices: object = None
    spec_read_state_indices: object = None
    non_spec_start_pos: object = None
    checkpoint_state_indices: object = None

    @property
    def num_non_spec_seqs(self) -> int:
        return self.num_prefills + self.num_decodes

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_views_cache", None)  # any field: the arrays' checks again
        if name not in BATCH_ARRAYS:  # a count or setting changed
            object.__setattr__(self, "_counts_cache", None)

    def _counts_c(self):
        """(gdn_batch_t with the counts and settings, arrays NULL; ((field, message name, dtype,
        elements the counts need), ...)), built once per set of count values like Config._to_c:
        the ints only change through setattr. The arrays are read on every call (_to_c)."""
        cached = getattr(self, "_counts_cache", None)
        if cached is None:
            # Batches of the same counts (an engine's steps) share one: a key of plain ints and the
            # validate string only (3.0 == 3 must still be refused by _int32).
            key = (*(getattr(self, f) for f in BATCH_COUNTS), self.pad_slot_id, self.validate)
            plain = all(type(v) is int for v in key[:-1])
            cached = _COUNTS_CACHE.get(key) if plain else None
        if cached is None:
            c = counts_only(self)
            c.pad_slot_id = _int32(self.pad_slot_id, "batch.pad_slot_id")
            c.validate = _choice({"full": _lib.GDN_VALIDATE_FULL, "counts": _lib.GDN_VALIDATE_COUNTS}, self.validate,
                                 "validate")
            try:
                elements = _array_elements(c)
            except _GdnError:  # (counts the library refuses: the call says which, naming the count)
                elements = dict.fromkeys(BATCH_ARRAYS, 0)
            needs = tuple((field, f"batch.{field}", dtype, elements[field])
                          for field, (dtype,) in BATCH_ARRAYS.items())
            cached = (c, needs)
            if plain:
                if len(_COUNTS_CACHE) >= 256:
                    _COUNTS_CACHE.clear()
                _COUNTS_CACHE[key] = cached
        object.__setattr__(self, "_counts_cache", cached)
        return cached

    def bind(self, queue) -> "Batch":
        """Check the metadata arrays now and keep their checked addresses for the following calls
        on this queue object, whatever kind of arrays they are (a batch of pygdn.UsmArrays keeps
        them anyway), until a field of the batch is set. For a step's metadata passed to several
        calls (an engine's layers): the arrays must go on describing the same memory (torch and
        NumPy arrays do unless resized in place). Returns the batch."""
        object.__setattr__(self, "_bound", True)
        self._to_c(_as_queue(queue), [])
        return self

    def _to_c(self, queue, keep):
        """gdn_batch_t with the arrays' addresses, after their checks (appends what must stay
        alive to keep). When every array is a pygdn.UsmArray, whose address, shape and dtype never
        change, or the batch is bound (bind()), the checked struct is kept for the next call on the
        same queue object: setting any field of the batch drops it (a serving loop's plain call
        saves ~1 us per array)."""
        views = self.__dict__.get("_views_cache")
        if views is not None and views[0] is queue:  # (the struct is read only: shared by the calls)
            keep.extend(views[2])
            return views[1]
        template, needs = self._counts_c()
        c = _ffi.new(_BATCH_P, template[0])  # (the template is shared by batches of these counts)
        holds, fixed = [], True
        for field, name, dtype, need in needs:
            obj = getattr(self, field)
            if obj is None:
                continue
            address, shape, got, hold, _ = _view(obj, name, queue)
            if got != dtype:
                raise TypeError(f"{name}: dtype {got}, expected {dtype}" + (
                    " (int64 index arrays are not accepted: convert them to int32 once per step)" if got == "i64" else ""))
            n = _math.prod(shape)
            if n < need:
                raise ValueError(f"{name}: {n} elements, the counts need {need}")
            holds.append(hold)
            fixed = fixed and type(obj) is _UsmArray
            setattr(c, field, _ffi.cast(_VOIDP, address))
        keep.extend(holds)
        if fixed or self.__dict__.get("_bound"):
            object.__setattr__(self, "_views_cache", (queue, c, tuple(holds)))
        return c


_missing = {f.name for f in _dc.fields(Batch)} ^ {*BATCH_COUNTS, *_BATCH_SETTINGS, *BATCH_ARRAYS}
if _missing:  # the dataclass is written out for its readers; the header decides what it must hold
    raise ImportError(f"pygdn.Batch and gdn_batch_t differ in {sorted(_missing)}")



def counts_only(counts):
    """gdn_batch_t with the counts only of a Batch, or of a mapping of count names (those it lacks: 0)."""
    get = counts.get if isinstance(counts, _t.Mapping) else lambda f, _: getattr(counts, f)
    c = _ffi.new(_BATCH_P)
    _lib.gdn_batch_init(c)
    for f in BATCH_COUNTS:
        setattr(c, f, _int32(get(f, 0), f"batch.{f}"))
    return c


def array_elements(counts) -> dict:
    """field -> how many elements a call reads of each metadata array for these counts (a Batch, or
    a mapping of count names), as the library reads them (gdn_batch_array_elements): 0 for an array
    of a group without sequences. GdnError if the library refuses the counts."""
    return _array_elements(counts_only(counts))


def _array_elements(c_batch) -> dict:
    n = _ffi.new("int64_t[]", len(BATCH_ARRAYS))
    _check(_lib.gdn_batch_array_elements(c_batch, n, len(BATCH_ARRAYS)))
    return dict(zip(BATCH_ARRAYS, n))


def make_batch(rng, *, num_slots, prefill_lens=(), num_decodes=0, spec_lens=(), num_spec=0, accepted=None,
               has_initial_state=None, order="random", pad_non_spec=0, pad_spec=0, pad_len=0, pad_slot_id=-1,
               identity_indices=False):
    """Metadata of one step.

    prefill_lens: tokens of each prefill; num_decodes: 1-token sequences; spec_lens: tokens
    (1..1+num_spec) of each speculative sequence; accepted: num_accepted_tokens per spec
    sequence (default random in [1, 1+num_spec]); has_initial_state: per non-spec sequence
    (default random for prefills, True for decodes, None = omit the array).
    order: "random" (a random permutation of rows), "blocks" (each sequence contiguous, the
    sequences shuffled), "grouped" (non-spec rows first, then spec, as vLLM's argsort).
    pad_non_spec / pad_spec: extra sequences whose slot is pad_slot_id, each pad_len tokens.
    """
    ns_lens = list(prefill_lens) + [1] * num_decodes + [pad_len] * pad_non_spec
    s_lens = list(spec_lens) + [max(pad_len, 0)] * pad_spec
    n_ns, n_s, cols = len(ns_lens), len(s_lens), num_spec + 1
    if any(not 0 <= L <= cols for L in s_lens):
        raise ValueError(f"spec lengths must be in [0, {cols}]")
    need = n_ns - pad_non_spec + (n_s - pad_spec) * cols
    if need > num_slots:
        raise ValueError(f"{need} slots needed, num_slots={num_slots}")
    slots = rng.permutation(num_slots)[:need].astype(_np.int32)
    ns_slots = _np.full(n_ns, pad_slot_id, _np.int32)
    ns_slots[: n_ns - pad_non_spec] = slots[: n_ns - pad_non_spec]
    s_slots = _np.full((n_s, cols), pad_slot_id, _np.int32)
    s_slots[: n_s - pad_spec] = slots[n_ns - pad_non_spec:].reshape(-1, cols)

    ns_qsl = _np.concatenate([[0], _np.cumsum(ns_lens)]).astype(_np.int32)
    s_qsl = _np.concatenate([[0], _np.cumsum(s_lens)]).astype(_np.int32)
    t_ns, t_s = int(ns_qsl[-1]), int(s_qsl[-1])
    total = t_ns + t_s

    # Global rows: which row each compact token occupies.
    if order == "grouped":
        rows = _np.arange(total)
    elif order == "blocks":
        blocks = [("n", i) for i in range(n_ns)] + [("s", n) for n in range(n_s)]
        perm = rng.permutation(len(blocks))
        rows, at = _np.empty(total, _np.int64), 0
        for b in perm:
            kind, i = blocks[b]
            lo, hi = (ns_qsl[i], ns_qsl[i + 1]) if kind == "n" else (t_ns + s_qsl[i], t_ns + s_qsl[i + 1])
            rows[lo:hi] = _np.arange(at, at + hi - lo)
            at += hi - lo
    elif order == "random":
        rows = rng.permutation(total)
    else:
        raise ValueError(f"order={order!r}")
    ns_tok, s_tok = rows[:t_ns].astype(_np.int32), rows[t_ns:].astype(_np.int32)

    if has_initial_state is None:
        init = _np.array([rng.random() < 0.6 if L > 1 else True for L in ns_lens], _np.uint8)
    elif has_initial_state is False:
        init = None
    else:
        init = _np.asarray(has_initial_state, _np.uint8)
    if accepted is None:
        accepted = rng.integers(1, cols + 1, size=n_s)
    accepted = _np.asarray(accepted, _np.int32)
    if len(accepted) < n_s:
        accepted = _np.concatenate([accepted, _np.ones(n_s - len(accepted), _np.int32)])

    meta = dict(num_prefills=len(prefill_lens), num_decodes=num_decodes + pad_non_spec, num_spec_decodes=n_s,
                num_spec=num_spec, num_actual_tokens=total, non_spec_token_count=t_ns, spec_token_count=t_s,
                pad_slot_id=pad_slot_id, non_spec_query_start_loc=ns_qsl, non_spec_state_indices=ns_slots,
                has_initial_state=init, spec_query_start_loc=s_qsl, spec_state_indices=s_slots,
                num_accepted_tokens=accepted, non_spec_token_indx=ns_tok, spec_token_indx=s_tok)
    if identity_indices and order == "grouped":
        # vLLM passes no index arrays for a batch of one kind; only valid when one group is empty.
        if t_s == 0:
            meta["non_spec_token_indx"] = None
        if t_ns == 0:
            meta["spec_token_indx"] = None
    return meta


def to_device(meta, queue, validate="full"):
    """Upload make_batch() metadata to USM arrays; returns a pygdn.Batch."""
    arrays = {}
    for k in BATCH_ARRAYS:
        v = meta.get(k)
        if v is None:
            arrays[k] = None
            continue
        v = _np.ascontiguousarray(v)
        arrays[k] = _UsmArray.from_numpy(v if v.size else _np.zeros(1, v.dtype), queue)
    counts = {k: int(meta.get(k, 0) or 0) for k in BATCH_COUNTS}
    counts["pad_slot_id"] = int(meta.get("pad_slot_id", -1))
    return Batch(validate=validate, **counts, **arrays)
