"""Building mixed-batch metadata the way a serving engine's scheduler does (for the demo,
the benchmark and the tests): prefills, decodes and speculative sequences, their token rows
interleaved, graph padding, distinct state slots.

make_batch() returns host (numpy) metadata keyed like gdn_batch_t; to_device() uploads it.
"""
from __future__ import annotations

import numpy as _np

from ._usm import UsmArray as _UsmArray
from .ops import BATCH_ARRAYS as _BATCH_ARRAYS, BATCH_COUNTS as _BATCH_COUNTS, Batch as _Batch


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
    for k in _BATCH_ARRAYS:
        v = meta.get(k)
        if v is None:
            arrays[k] = None
            continue
        v = _np.ascontiguousarray(v)
        arrays[k] = _UsmArray.from_numpy(v if v.size else _np.zeros(1, v.dtype), queue)
    counts = {k: int(meta.get(k, 0) or 0) for k in _BATCH_COUNTS}
    counts["pad_slot_id"] = int(meta.get("pad_slot_id", -1))
    return _Batch(validate=validate, **counts, **arrays)
