"""Hypothesis fuzzing of gdn_attention's batch metadata.

Each example is a mixed batch (prefills, decodes, speculative sequences; ragged spec lengths,
every acceptance count, zero-length, pad_slot_id and negative-index padding, graph-padded arrays, any row
interleaving), optionally corrupted in one or two places (slots out of range or duplicated,
acceptance out of range, token rows out of range / duplicated / both index arrays NULL, start
locations perturbed, counts off by one, required arrays missing or too short, rolled conv state
too short), and in some cases one array's allocation one element short of what the call touches
while its __sycl_usm_array_interface__ claims the full shape (pygdn cannot tell; the library's
extent check must). `predict()` decides -- independently of the library, from the rules of
include/gdn_xpu.h -- whether the call is valid and, if not, which statuses may report it. Then:

  * predicted valid   -> the call succeeds; core_attn_out / conv_out rows match the float64
                         reference (rtol 2e-4 of max |ref|), the row past num_actual_tokens keeps
                         its canary, conv_state equals the reference exactly, every ssm slot the
                         call may write matches the reference and every other slot is bit-identical;
  * predicted invalid -> a clean ValueError/TypeError (Python layer) or GdnError whose status is
                         one the predictor expects, and ALL buffers are bit-identical.

Tiny shapes (H=1, HV=2, K=V=4, conv width 2..4, f32), one queue. GDN_FUZZ_EXAMPLES sets the
example count (default 2000, the CI run; tests/fuzz_nightly.sh runs 50000).

Semantics the predictor holds the library to (docs/op.md, "Errors and validation"):
  * A state index equal to pad_slot_id, or negative whatever pad_slot_id is, is padding.
  * A zero-length sequence is padding: it reads and writes nothing (its slot is still range
    checked, and a non-spec one still counts as its slot's writer, as
    src/validate/metadata.cpp does).
  * A spec sequence's slots cols[t], t < L, belong to it (one sequence may repeat a slot: last
    write wins). It reads cols[A-1] (ssm; snapshot conv) and cols[0] (rolled conv); a slot it
    reads must not be written by another sequence. Other columns are only range checked.
  * With num_actual_tokens == 0 nothing is read, so only the counts are checked.
  * State caches (gdn_batch_t version 2; gdn_xpu.h "State caches"), in about a third of the cases:
    read slots apart from the write slots (from a pool of extra slots, so several sequences share
    them; pad; or any slot), block checkpoints every 64 or 128 tokens from random start positions
    into pool slots. A read slot conflicts with another sequence's write slot (not read when
    has_initial_state is 0, nor when it is the sequence's own write slot); a checkpoint slot with
    any other use of its slot, except its own sequence's write slot at a boundary on the last token.
"""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import pygdn
from pygdn import reference as ref
from pygdn.batch import BATCH_ARRAYS, BATCH_COUNTS
from helpers import (EditedSUAI, assert_close, conv_from_canonical, conv_to_canonical, ssm_from_canonical,
                     ssm_to_canonical, usm)

H, HV, K, V, W = 1, 2, 4, 4, 4
C = 2 * H * K + HV * V
RTOL = 2e-4
I32_MAX = 2**31 - 1
OUT_CANARY, CONV_OUT_CANARY = 7.0, 5.0


BATCH_KEYS, COUNT_KEYS = tuple(BATCH_ARRAYS), BATCH_COUNTS  # gdn_batch_t's arrays and counts
REQUIRED = ("non_spec_query_start_loc", "non_spec_state_indices", "spec_query_start_loc", "spec_state_indices",
            "num_accepted_tokens")


def required_len(c, key):
    """Elements a call reads of metadata array `key` for valid counts, as include/gdn_xpu.h gives them
    (gdn_batch_t's comments, gdn_batch_array_elements): none of a group without sequences."""
    ns, sp, cols = c["num_prefills"] + c["num_decodes"], c["num_spec_decodes"], c["num_spec"] + 1
    per_ns = {"non_spec_query_start_loc": ns + 1, "non_spec_state_indices": ns, "has_initial_state": ns,
              "non_spec_token_indx": c["non_spec_token_count"], "non_spec_read_state_indices": ns,
              "non_spec_start_pos": ns,
              "checkpoint_state_indices": ns * c["checkpoint_cols"] if c["checkpoint_interval"] else 0}
    per_sp = {"spec_query_start_loc": sp + 1, "spec_state_indices": sp * cols, "num_accepted_tokens": sp,
              "spec_token_indx": c["spec_token_count"], "spec_read_state_indices": sp}
    return (per_ns[key] if ns > 0 else 0) if key in per_ns else (per_sp[key] if sp > 0 else 0)


# Arrays a case may give an allocation one element short of what the call touches.
UNDERSIZABLE = BATCH_KEYS + ("mixed_qkv", "a", "b", "conv_weight", "conv_bias", "A_log", "dt_bias", "conv_state",
                             "ssm_state", "core_attn_out", "z", "norm_weight", "conv_out")
SPEC_GROUP = ("spec_query_start_loc", "spec_state_indices", "num_accepted_tokens", "spec_token_indx",
              "spec_read_state_indices")


def extent_need(c, name):
    """Elements of array `name` gdn_attention may touch, by include/gdn_xpu.h (row arrays:
    num_actual_tokens rows; caches: every slot; weights: their shapes; metadata: the lengths the
    counts give, none for a group without sequences); 0 for an array the call does not use."""
    if name in BATCH_ARRAYS:
        group = c["num_spec_decodes"] if name in SPEC_GROUP else c["num_prefills"] + c["num_decodes"]
        unused = c["arrays"][name] is None or group <= 0 or name == "checkpoint_state_indices" and not c["checkpoint_interval"]
        return 0 if unused else required_len(c, name)
    if not {"conv_bias": c["bias"], "z": c["z"], "norm_weight": c["z"], "conv_out": c["conv_out"]}.get(name, True):
        return 0
    T, state_len = c["num_actual_tokens"], c["conv_state_len"] or c["conv_width"] - 1
    return {"mixed_qkv": T * C, "a": T * HV, "b": T * HV, "core_attn_out": T * HV * V, "z": T * HV * V,
            "conv_out": T * C, "conv_weight": C * c["conv_width"], "conv_bias": C, "A_log": HV, "dt_bias": HV,
            "conv_state": c["num_slots"] * C * state_len, "ssm_state": c["num_slots"] * HV * K * V, "norm_weight": V}[name]


def undersized(c):
    """(array, elements its allocation holds) when the case's undersized array is one the call
    touches and can be made short (a UsmArray holds at least one byte), else None."""
    name = c.get("undersized")
    n = extent_need(c, name) if name else 0
    if n <= 0 or n == 1 and name == "has_initial_state":
        return None
    return name, n - 1


# ----------------------------------------------------------------------------- generation
@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    num_spec = draw(st.integers(0, 3))
    cols = num_spec + 1

    # Non-spec sequences: mostly decodes, some prefills (a few cross the 64-token chunk), zero-length pads.
    ns_lens, ns_pad = [], []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["decode", "decode", "short", "short", "zero", "long"]))
        ns_lens.append({"decode": 1, "zero": 0}[kind] if kind in ("decode", "zero") else
                       draw(st.integers(2, 9)) if kind == "short" else draw(st.integers(60, 70)))
        ns_pad.append(draw(st.booleans()) and draw(st.booleans()))
    num_prefills = draw(st.integers(0, len(ns_lens)))  # the split does not matter to the library
    # Spec sequences: ragged lengths 0..1+S, acceptance 1..1+S, padded slots (whole row or some columns).
    s_lens, s_acc, s_pad = [], [], []
    for _ in range(draw(st.integers(0, 4))):
        s_lens.append(draw(st.integers(0, cols)) if draw(st.integers(0, 5)) else 0)
        s_acc.append(draw(st.integers(1, cols)))
        s_pad.append(draw(st.sampled_from(["none", "none", "none", "row", "some"])))

    state_caches = draw(st.integers(0, 2)) == 0  # read slots / checkpoints (gdn_batch_t version 2)
    n_pool = draw(st.integers(1, 6)) if state_caches else 0  # slots only read slots and checkpoints use
    need = len(ns_lens) + len(s_lens) * cols
    pad_kind = draw(st.sampled_from(["-1", "-1", "-1", "0", "last", "big"]))
    num_slots = max(1, need + n_pool + draw(st.integers(0, 3)) + (pad_kind in ("0", "last")))
    pad = {"-1": -1, "0": 0, "last": num_slots - 1, "big": 1000}[pad_kind]
    free = rng.permutation([s for s in range(num_slots) if s != pad]).astype(np.int32)
    ns_slots = free[:len(ns_lens)].copy()
    # a padded entry holds pad_slot_id or -1 (negative indices are padding too)
    alt = lambda: pad if pad == -1 or draw(st.booleans()) else -1  # noqa: E731
    for i in np.flatnonzero(ns_pad):
        ns_slots[i] = alt()
    s_slots = free[len(ns_lens):need].reshape(len(s_lens), cols).copy()
    pool = free[need:need + n_pool]
    for n, p in enumerate(s_pad):
        if p == "row":
            s_slots[n] = alt()
        elif p == "some":
            for t in np.flatnonzero(rng.random(cols) < 0.4):
                s_slots[n, t] = alt()
        # columns a sequence neither reads nor writes may hold any slot (even another sequence's)
        for t in range(s_lens[n], cols):
            if t != s_acc[n] - 1 and draw(st.integers(0, 3)) == 0:
                s_slots[n, t] = rng.integers(0, num_slots)

    ns_qsl = np.concatenate([[0], np.cumsum(ns_lens, dtype=np.int64)]).astype(np.int32)
    s_qsl = np.concatenate([[0], np.cumsum(s_lens, dtype=np.int64)]).astype(np.int32)
    t_ns, t_s = int(ns_qsl[-1]), int(s_qsl[-1])
    total = t_ns + t_s
    order = draw(st.sampled_from(["grouped", "spec_first", "random", "blocks"]))
    if order == "grouped":
        rows = np.arange(total)
    elif order == "spec_first":
        rows = np.concatenate([np.arange(t_s, total), np.arange(t_s)])
    elif order == "random":
        rows = rng.permutation(total)
    else:
        spans = [(ns_qsl[i], ns_qsl[i + 1]) for i in range(len(ns_lens))] + \
                [(t_ns + s_qsl[n], t_ns + s_qsl[n + 1]) for n in range(len(s_lens))]
        rows, at = np.empty(total, np.int64), 0
        for i in rng.permutation(len(spans)):
            lo, hi = spans[i]
            rows[lo:hi] = np.arange(at, at + hi - lo)
            at += hi - lo
    ns_tok, s_tok = rows[:t_ns].astype(np.int32), rows[t_ns:].astype(np.int32)
    if np.array_equal(ns_tok, np.arange(t_ns)) and draw(st.booleans()):
        ns_tok = None  # NULL = identity (vLLM passes none for a one-kind batch)
    if s_tok is not None and np.array_equal(s_tok, np.arange(t_s)) and draw(st.booleans()):
        s_tok = None
    his = None if draw(st.booleans()) else (rng.random(len(ns_lens)) < 0.6).astype(np.uint8)

    c = dict(seed=seed, num_slots=num_slots, pad_slot_id=pad, num_prefills=num_prefills,
             num_decodes=len(ns_lens) - num_prefills, num_spec_decodes=len(s_lens), num_spec=num_spec,
             num_actual_tokens=total, non_spec_token_count=t_ns, spec_token_count=t_s, rows_alloc=total + 1,
             ssm_layout=draw(st.sampled_from(["kv", "vk"])),
             conv_layout=draw(st.sampled_from(["dim_major", "time_major"])),
             conv_spec_layout=draw(st.sampled_from(["snapshot", "rolled"])),
             force_recurrent=draw(st.integers(0, 4)) == 0, z=draw(st.booleans()), bias=draw(st.booleans()),
             conv_out=draw(st.booleans()), counts_mode=draw(st.integers(0, 4)) == 0, corruptions=[],
             checkpoint_interval=0, checkpoint_cols=0)
    c["conv_width"] = draw(st.sampled_from([4, 4, 3, 2]))
    c["conv_state_len"] = c["conv_width"] - 1 + num_spec  # what "rolled" needs; "snapshot" ignores the rest
    c["arrays"] = dict(non_spec_query_start_loc=ns_qsl, non_spec_state_indices=ns_slots, has_initial_state=his,
                       non_spec_token_indx=ns_tok, spec_query_start_loc=s_qsl,
                       spec_state_indices=s_slots.reshape(-1), num_accepted_tokens=np.array(s_acc, np.int32),
                       spec_token_indx=s_tok)
    c["arrays"].update({k: None for k in BATCH_KEYS if k not in c["arrays"]})  # state-cache fields: defaults
    if state_caches:
        add_state_caches(draw, rng, c, pool, ns_lens, s_lens, s_slots)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        corrupt(draw, rng, c)
    if draw(st.integers(0, 3)) == 0:  # graph padding: arrays longer than the counts need, garbage tail
        for k, a in c["arrays"].items():
            if a is not None:
                tail = rng.integers(-3, num_slots + 3, size=draw(st.integers(1, 3))).astype(a.dtype)
                c["arrays"][k] = np.concatenate([a, tail])
        c["corruptions"].append("graph_padded_tail")
    c["undersized"] = draw(st.sampled_from(UNDERSIZABLE)) if draw(st.integers(0, 7)) == 0 else None
    if c["undersized"]:
        c["corruptions"].append("undersized")
    return c


def add_state_caches(draw, rng, c, pool, ns_lens, s_lens, s_slots):
    """Read slots and block checkpoints (mostly valid: pool slots, shared reads, pad; sometimes any slot)."""
    a, pad, n = c["arrays"], c["pad_slot_id"], c["num_slots"]

    def pick(own):
        kind = draw(st.sampled_from(["pool", "pool", "own", "pad", "any"]))
        return {"pool": lambda: int(rng.choice(pool)), "own": lambda: own, "pad": lambda: pad,
                "any": lambda: int(rng.integers(0, n))}[kind]()

    if ns_lens and draw(st.booleans()):
        a["non_spec_read_state_indices"] = np.array([pick(int(s)) for s in a["non_spec_state_indices"]], np.int32)
    if s_lens and draw(st.booleans()):
        a["spec_read_state_indices"] = np.array([pick(int(r[0])) for r in s_slots], np.int32)
    if ns_lens and draw(st.booleans()):
        c["checkpoint_interval"] = 64 * draw(st.integers(1, 2))
        c["checkpoint_cols"] = cols = draw(st.integers(0, 3))
        a["non_spec_start_pos"] = np.array([draw(st.sampled_from([0, 63, 64, 100, 127, 190])) + int(rng.integers(0, 3))
                                            for _ in ns_lens], np.int32)
        unused = [int(s) for s in pool]
        rng.shuffle(unused)
        ck = np.full(len(ns_lens) * cols, pad, np.int32)
        for e in range(ck.size):  # distinct pool slots while they last, then pad or any slot
            ck[e] = unused.pop() if unused and draw(st.integers(0, 3)) else pick(pad)
        a["checkpoint_state_indices"] = ck
    elif ns_lens and draw(st.booleans()):
        a["non_spec_start_pos"] = np.array([int(rng.integers(0, 300)) for _ in ns_lens], np.int32)


CORRUPTIONS = ["slot_oob", "slot_dup", "slot_dup", "accepted_bad", "accepted_shift", "tok_oob", "tok_dup",
               "tok_both_none", "tok_swap_groups", "qsl", "count", "null", "short", "rolled_short", "pad_change"]


def corrupt(draw, rng, c):
    kind = draw(st.sampled_from(CORRUPTIONS))
    a = c["arrays"]
    c["corruptions"].append(kind)
    slot_keys = [k for k in ("non_spec_state_indices", "spec_state_indices", "non_spec_read_state_indices",
                             "spec_read_state_indices", "checkpoint_state_indices") if a[k] is not None and a[k].size]
    if kind == "slot_oob" and slot_keys:
        k = draw(st.sampled_from(slot_keys))
        a[k][rng.integers(a[k].size)] = draw(st.sampled_from(
            [c["num_slots"], c["num_slots"] + 5, -2, c["pad_slot_id"] - 1, I32_MAX, -2**31]))
    elif kind == "slot_dup" and slot_keys:
        allv = np.concatenate([a[k] for k in slot_keys])
        k = draw(st.sampled_from(slot_keys))
        a[k][rng.integers(a[k].size)] = allv[rng.integers(allv.size)]
    elif kind in ("accepted_bad", "accepted_shift") and a["num_accepted_tokens"] is not None \
            and a["num_accepted_tokens"].size:
        cols = c["num_spec"] + 1
        v = (draw(st.sampled_from([0, cols + 1, -1, 64])) if kind == "accepted_bad"
             else draw(st.integers(1, max(cols, 1))))  # (num_spec may have been corrupted to -1)
        a["num_accepted_tokens"][rng.integers(a["num_accepted_tokens"].size)] = v
    elif kind in ("tok_oob", "tok_dup"):  # (earlier corruptions may have changed counts and sizes)
        k = draw(st.sampled_from(["non_spec_token_indx", "spec_token_indx"]))
        n = c["non_spec_token_count"] if k == "non_spec_token_indx" else c["spec_token_count"]
        if a[k] is None:
            a[k] = np.arange(max(n, 0), dtype=np.int32)
        if a[k].size == 0:
            return
        T = c["num_actual_tokens"]
        a[k][rng.integers(a[k].size)] = (draw(st.sampled_from([T, -1, T + 100, -2**31])) if kind == "tok_oob"
                                         else rng.integers(0, max(T, 1)))
    elif kind == "tok_both_none":
        a["non_spec_token_indx"] = a["spec_token_indx"] = None
    elif kind == "tok_swap_groups":
        for k, n, first in (("non_spec_token_indx", c["non_spec_token_count"], 0),
                            ("spec_token_indx", c["spec_token_count"], c["non_spec_token_count"])):
            if a[k] is None:
                a[k] = np.arange(first, first + max(n, 0), dtype=np.int32)
        ns, sp = a["non_spec_token_indx"], a["spec_token_indx"]
        if ns.size and sp.size:
            i, j = rng.integers(ns.size), rng.integers(sp.size)
            ns[i], sp[j] = sp[j], ns[i]
    elif kind == "qsl":
        k = draw(st.sampled_from(["non_spec_query_start_loc", "spec_query_start_loc"]))
        if a[k] is not None and a[k].size:
            i = rng.integers(a[k].size)
            a[k][i] = a[k][i] + draw(st.sampled_from([-2, -1, 1, 2]))
    elif kind == "count":
        k = draw(st.sampled_from(COUNT_KEYS))
        c[k] += draw(st.sampled_from([-1, 1]))
    elif kind == "null":
        a[draw(st.sampled_from(REQUIRED))] = None
    elif kind == "short":
        k = draw(st.sampled_from([k for k in BATCH_KEYS if a[k] is not None]))
        a[k] = a[k][:max(0, a[k].size - 1)]
    elif kind == "rolled_short":
        c["conv_spec_layout"] = "rolled"
        c["conv_state_len"] = c["conv_width"] - 2 + c["num_spec"]
    elif kind == "pad_change":
        c["pad_slot_id"] = draw(st.sampled_from([-1, 0, -5, c["num_slots"]]))


# ----------------------------------------------------------------------------- the predictor
def prefix(c, key):
    a = c["arrays"][key]
    return None if a is None else np.asarray(a[:max(required_len(c, key), 0)], np.int64)


def start_loc_ok(qsl, total):
    return qsl[0] == 0 and np.all(np.diff(qsl) >= 0) and qsl[-1] == total


def predict(c):
    """-> ("ok", None) | ("python", None) | ("gdn", {status names}): independent of the order of
    src/validate/'s checks, but stage by stage as documented (Python checks, counts, config vs counts, NULL arrays, contents)."""
    nns = c["num_prefills"] + c["num_decodes"]
    nsd, S, T = c["num_spec_decodes"], c["num_spec"], c["num_actual_tokens"]
    t_ns, t_s, slots, pad = c["non_spec_token_count"], c["spec_token_count"], c["num_slots"], c["pad_slot_id"]
    cols = S + 1
    counts_ok = (all(0 <= c[k] <= I32_MAX for k in COUNT_KEYS) and S <= 64 and t_ns + t_s == T
                 and (nns > 0 or t_ns == 0) and (nsd > 0 or t_s == 0) and t_s <= nsd * cols
                 and c["checkpoint_interval"] % 64 == 0)
    # Python layer: every given array holds at least what the counts need (counts the library
    # refuses: it says so, below); row tensors >= T rows.
    for k in BATCH_KEYS if counts_ok else ():
        if c["arrays"][k] is not None and c["arrays"][k].size < required_len(c, k):
            return "python", None
    if T > c["rows_alloc"]:
        return "python", None
    # Config (validated before the batch): at least W-1 history columns (pygdn.Config: 0 means W-1).
    state_len = c["conv_state_len"] or c["conv_width"] - 1
    if state_len < c["conv_width"] - 1:
        return "gdn", {"GDN_ERROR_BAD_LAYOUT"}
    # Counts.
    if not counts_ok:
        return "gdn", {"GDN_ERROR_BAD_COUNT"}
    if c["conv_spec_layout"] == "rolled" and nsd > 0 and state_len < c["conv_width"] - 1 + S:
        return "gdn", {"GDN_ERROR_BAD_LAYOUT"}
    if T == 0:
        return "ok", None  # nothing to read or write
    I, ck_cols = c["checkpoint_interval"], c["checkpoint_cols"]
    if any(c["arrays"][k] is None for k in REQUIRED[:2]) and nns > 0 or \
            any(c["arrays"][k] is None for k in REQUIRED[2:]) and nsd > 0 or \
            nns > 0 and I > 0 and ck_cols > 0 and c["arrays"]["checkpoint_state_indices"] is None:
        return "gdn", {"GDN_ERROR_NULL_POINTER"}
    # Extents: an array the call touches runs past its allocation.
    if undersized(c):
        return "gdn", {"GDN_ERROR_BAD_POINTER"}
    # Contents.
    ns_qsl, s_qsl = prefix(c, "non_spec_query_start_loc"), prefix(c, "spec_query_start_loc")
    if nns > 0 and not start_loc_ok(ns_qsl, t_ns) or nsd > 0 and not start_loc_ok(s_qsl, t_s):
        return "gdn", {"GDN_ERROR_BAD_START_LOC"}
    errs = set()
    is_pad = lambda s: s < 0 or s == pad  # noqa: E731  (gdn_xpu.h "State caches": padding)
    valid_slot = lambda s: is_pad(s) or s < slots  # noqa: E731
    writer = {}

    def write(slot, seq):
        if is_pad(slot):
            return
        if writer.setdefault(slot, seq) != seq:
            errs.add("GDN_ERROR_DUPLICATE_SLOT")

    ns_slots = prefix(c, "non_spec_state_indices")
    for i in range(nns):
        if not valid_slot(ns_slots[i]):
            errs.add("GDN_ERROR_BAD_STATE_INDEX")
        else:
            write(ns_slots[i], ("ns", i))
    s_slots, acc = prefix(c, "spec_state_indices"), prefix(c, "num_accepted_tokens")
    readers = []
    for n in range(nsd):
        L, A, row = s_qsl[n + 1] - s_qsl[n], acc[n], s_slots[n * cols:(n + 1) * cols]
        if L > cols:
            errs.add("GDN_ERROR_BAD_START_LOC")
        if not 1 <= A <= cols:
            errs.add("GDN_ERROR_BAD_ACCEPTED")
        if not all(valid_slot(s) for s in row):
            errs.add("GDN_ERROR_BAD_STATE_INDEX")
            continue
        for t in range(min(L, cols)):
            write(row[t], ("s", n))
        if 1 <= L and 1 <= A <= cols:
            readers += [(row[A - 1], ("s", n)), (row[0], ("s", n))]
    for slot, seq in readers:
        if not is_pad(slot) and writer.get(slot, seq) != seq:
            errs.add("GDN_ERROR_DUPLICATE_SLOT")
    errs |= predict_state_caches(c, ns_qsl, s_qsl, valid_slot)
    owned = set()
    for key, count in (("non_spec_token_indx", t_ns), ("spec_token_indx", t_s)):
        tok = prefix(c, key)
        for j in range(count):
            r = j if tok is None else tok[j]
            if not 0 <= r < T or r in owned:
                errs.add("GDN_ERROR_BAD_TOKEN_INDEX")
            owned.add(r)
    return ("gdn", errs) if errs else ("ok", None)


def predict_state_caches(c, ns_qsl, s_qsl, valid_slot):
    """The errors of the version-2 fields (read slots, checkpoints), by the rules of gdn_xpu.h."""
    errs = set()
    nns, nsd, cols, pad = c["num_prefills"] + c["num_decodes"], c["num_spec_decodes"], c["num_spec"] + 1, c["pad_slot_id"]
    I, ck_cols = c["checkpoint_interval"], c["checkpoint_cols"]
    ns_slots, s_slots, acc, his = (prefix(c, k) for k in ("non_spec_state_indices", "spec_state_indices",
                                                          "num_accepted_tokens", "has_initial_state"))
    ns_read, s_read, start = (prefix(c, k) if nseq else None for k, nseq in
                              (("non_spec_read_state_indices", nns), ("spec_read_state_indices", nsd),
                               ("non_spec_start_pos", nns)))
    ck = prefix(c, "checkpoint_state_indices") if nns and I > 0 and ck_cols > 0 else None
    for arr in (ns_read, s_read, ck):
        if arr is not None and not all(valid_slot(s) for s in arr):
            errs.add("GDN_ERROR_BAD_STATE_INDEX")
    if start is not None and np.any(start < 0):
        errs.add("GDN_ERROR_BAD_COUNT")
    uses = []  # (slot, sequence, "W" | "R" | "C", checkpoint on the sequence's last token)
    for i in range(nns):
        uses.append((int(ns_slots[i]), ("ns", i), "W", False))
    for n in range(nsd):
        for t in range(min(s_qsl[n + 1] - s_qsl[n], cols)):
            uses.append((int(s_slots[n * cols + t]), ("s", n), "W", False))
    for i in range(nns):
        L = ns_qsl[i + 1] - ns_qsl[i]
        if L == 0 or ns_slots[i] < 0 or ns_slots[i] == pad:
            continue
        if ns_read is not None and (his is None or his[i]) and ns_read[i] != ns_slots[i]:
            uses.append((int(ns_read[i]), ("ns", i), "R", False))
        if I > 0:
            p = int(start[i]) if start is not None else 0
            bounds = [j for j in range(L) if (p + j + 1) % I == 0]
            if len(bounds) > ck_cols:
                errs.add("GDN_ERROR_BAD_COUNT")
            for k, j in enumerate(bounds[:ck_cols]):
                uses.append((int(ck[i * ck_cols + k]), ("ns", i), "C", j == L - 1))
    for n in range(nsd):
        L, A = s_qsl[n + 1] - s_qsl[n], acc[n]
        if L >= 1 and s_read is not None:
            uses.append((int(s_read[n]), ("s", n), "R", False))
        elif L >= 1 and 1 <= A <= cols:
            uses.append((int(s_slots[n * cols + A - 1]), ("s", n), "R", False))
    uses = [u for u in uses if u[0] >= 0 and u[0] != pad]
    for x in range(len(uses)):
        for y in range(x + 1, len(uses)):
            (s1, q1, k1, last1), (s2, q2, k2, last2) = uses[x], uses[y]
            if s1 != s2 or {k1, k2} in ({"W"}, {"R"}) and q1 == q2 or k1 == k2 == "R":
                continue
            if "C" not in (k1, k2) and q1 == q2:  # a sequence's own read and write slot
                continue
            if {k1, k2} == {"W", "C"} and q1 == q2 and (last1 or last2):
                continue  # the checkpoint on the last token is the final state itself
            errs.add("GDN_ERROR_DUPLICATE_SLOT")
    return errs


def sequences(c):
    """(non-spec [(slot, rows, has_init, read slot, start_pos, checkpoint row)], spec [(cols, A, rows,
    read slot or None)]) of a valid call, zero-length ones dropped."""
    nns, nsd, cols = c["num_prefills"] + c["num_decodes"], c["num_spec_decodes"], c["num_spec"] + 1
    ck_cols = c["checkpoint_cols"] if c["checkpoint_interval"] else 0
    ns, sp = [], []
    if nns:
        qsl, sl, tok, his, rd, start, ck = (prefix(c, k) for k in (
            "non_spec_query_start_loc", "non_spec_state_indices", "non_spec_token_indx", "has_initial_state",
            "non_spec_read_state_indices", "non_spec_start_pos", "checkpoint_state_indices"))
        ns = [(int(sl[i]), rows, True if his is None else bool(his[i]), int(sl[i] if rd is None else rd[i]),
               0 if start is None else int(start[i]), [int(s) for s in ck[i * ck_cols:(i + 1) * ck_cols]] if ck_cols else [])
              for i, rows in sequence_rows(qsl, tok, nns)]
    if nsd:
        qsl, sl, acc, tok, rd = (prefix(c, k) for k in ("spec_query_start_loc", "spec_state_indices",
                                                         "num_accepted_tokens", "spec_token_indx", "spec_read_state_indices"))
        sp = [([int(s) for s in sl[n * cols:(n + 1) * cols]], int(acc[n]), rows, None if rd is None else int(rd[n]))
              for n, rows in sequence_rows(qsl, tok, nsd)]
    return ns, sp


def sequence_rows(qsl, tok, count):
    """(i, global rows) of each non-empty sequence i of a group (tok None: the NULL index, row = j)."""
    for i in range(count):
        rows = [int(tok[j]) if tok is not None else j for j in range(qsl[i], qsl[i + 1])]
        if rows:
            yield i, rows


def reference_meta(c):
    ns, sp = sequences(c)
    ns_rows = [r for n in ns for r in n[1]]
    sp_rows = [r for n in sp for r in n[2]]
    spec_read = None if not sp or sp[0][3] is None else [n[3] for n in sp]
    return dict(num_prefills=len(ns), num_decodes=0, num_spec_decodes=len(sp), num_spec=c["num_spec"],
                num_actual_tokens=c["num_actual_tokens"], pad_slot_id=c["pad_slot_id"],
                non_spec_query_start_loc=np.cumsum([0] + [len(n[1]) for n in ns]),
                non_spec_state_indices=[n[0] for n in ns], has_initial_state=[int(n[2]) for n in ns],
                non_spec_read_state_indices=[n[3] for n in ns], non_spec_start_pos=[n[4] for n in ns],
                checkpoint_interval=c["checkpoint_interval"], checkpoint_cols=c["checkpoint_cols"],
                checkpoint_state_indices=[s for n in ns for s in n[5]],
                non_spec_token_indx=ns_rows, spec_query_start_loc=np.cumsum([0] + [len(n[2]) for n in sp]),
                spec_state_indices=np.array([n[0] for n in sp], np.int64).reshape(len(sp), c["num_spec"] + 1),
                num_accepted_tokens=[n[1] for n in sp], spec_token_indx=sp_rows, spec_read_state_indices=spec_read)


# ----------------------------------------------------------------------------- running one case
def build(queue, c):
    rng = np.random.default_rng(c["seed"] ^ 0x5EED)
    R, slots = c["rows_alloc"], c["num_slots"]
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=slots,
                       conv_width=c["conv_width"],
                       act_dtype="f32", ssm_layout=c["ssm_layout"], conv_layout=c["conv_layout"],
                       conv_spec_layout=c["conv_spec_layout"], conv_state_len=c["conv_state_len"],
                       force_recurrent=c["force_recurrent"])
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    host = dict(x=f32(rng.standard_normal((R, C))), a=f32(rng.standard_normal((R, HV))),
                b=f32(rng.standard_normal((R, HV))), w=f32(rng.standard_normal((C, c["conv_width"])) * 0.5),
                bias=f32(rng.standard_normal(C) * 0.1) if c["bias"] else None,
                A_log=f32(np.log(rng.uniform(0.5, 8.0, HV))), dt_bias=f32(rng.uniform(-1.0, 1.0, HV)),
                conv=f32(rng.standard_normal((slots, C, cfg.state_len))),
                ssm=f32(rng.standard_normal((slots, HV, K, V)) * 0.5),
                z=f32(rng.standard_normal((R, HV * V))) if c["z"] else None,
                nw=f32(rng.uniform(0.5, 1.5, V)) if c["z"] else None)
    dev = dict(mixed_qkv=usm(queue, host["x"]), a=usm(queue, host["a"]), b=usm(queue, host["b"]),
               conv_weight=usm(queue, host["w"]), A_log=usm(queue, host["A_log"]), dt_bias=usm(queue, host["dt_bias"]),
               conv_state=usm(queue, conv_from_canonical(host["conv"], c["conv_layout"])),
               ssm_state=usm(queue, ssm_from_canonical(host["ssm"], c["ssm_layout"])),
               core_attn_out=usm(queue, np.full((R, HV, V), OUT_CANARY, np.float32)))
    if c["bias"]:
        dev["conv_bias"] = usm(queue, host["bias"])
    if c["z"]:
        dev["z"], dev["norm_weight"] = usm(queue, host["z"]), usm(queue, host["nw"])
    if c["conv_out"]:
        dev["conv_out"] = usm(queue, np.full((R, C), CONV_OUT_CANARY, np.float32))
    arrays = {k: None if v is None else usm(queue, v) for k, v in c["arrays"].items()}  # may be empty
    short = undersized(c)
    if short:  # its allocation one element short; its interface still claims the whole shape
        name, n = short
        whole = arrays if name in arrays else dev
        shape = whole[name].shape
        flat = whole[name].to_numpy().reshape(-1)[:n]
        whole[name] = EditedSUAI(pygdn.UsmArray.from_numpy(flat, queue), lambda d, shape=shape: d.update(shape=shape))
    batch = pygdn.Batch(validate="counts" if c["counts_mode"] else "full", pad_slot_id=c["pad_slot_id"],
                        **{k: c[k] for k in COUNT_KEYS}, **arrays)
    return cfg, batch, host, dev


def snapshot(dev):
    """The written arrays' contents (an undersized one's: what its allocation holds)."""
    return {k: getattr(dev[k], "base", dev[k]).to_numpy() for k in ("conv_state", "ssm_state", "core_attn_out", "conv_out")
            if k in dev}


def check_success(c, host, dev, before):
    T = c["num_actual_tokens"]
    if T == 0:  # no rows: nothing may change
        after = snapshot(dev)
        for k in before:
            assert np.array_equal(before[k], after[k]), f"a call with no tokens changed {k}"
        return
    meta = reference_meta(c)
    conv_ref, conv_state_ref = ref.causal_conv1d(host["x"][:T], host["w"], host["bias"], host["conv"], meta,
                                                 spec_layout=c["conv_spec_layout"])
    g, beta = ref.gates(host["a"][:T], host["b"][:T], host["A_log"], host["dt_bias"])
    o_ref, ssm_ref = ref.gated_delta_rule(conv_ref, g, beta, host["ssm"], meta, H, HV, K, V)
    if c["z"]:
        o_ref = ref.gated_rmsnorm(o_ref, host["z"][:T].reshape(T, HV, V), host["nw"])
    after = snapshot(dev)
    assert_close(after["core_attn_out"][:T], o_ref, RTOL, "core_attn_out")
    assert np.array_equal(after["core_attn_out"][T:], before["core_attn_out"][T:]), "canary row written"
    if c["conv_out"]:
        assert_close(after["conv_out"][:T], conv_ref, RTOL, "conv_out")
        assert np.array_equal(after["conv_out"][T:], before["conv_out"][T:]), "conv_out canary row written"
    got_conv = conv_to_canonical(after["conv_state"], c["conv_layout"]).astype(np.float64)
    bad = [s for s in range(c["num_slots"]) if not np.array_equal(got_conv[s], conv_state_ref[s])]
    assert not bad, f"conv_state slots {bad} differ from the reference (exact copies expected)"
    got_ssm = ssm_to_canonical(after["ssm_state"], c["ssm_layout"])
    # What the reference stores (write slots, spec write-backs, checkpoints) must match; every other slot is untouched.
    written = [s for s in range(c["num_slots"]) if not np.array_equal(ssm_ref[s], host["ssm"][s])]
    if written:
        assert_close(got_ssm[written], ssm_ref[written], RTOL, f"ssm_state slots {written}")
    untouched = [s for s in range(c["num_slots"]) if s not in written]
    changed = [s for s in untouched if not np.array_equal(got_ssm[s], host["ssm"][s])]
    assert not changed, f"ssm_state slots {changed} are not addressed by the call but changed"


def check_workspace_size(queue, cfg, batch, dev, before):
    """gdn_attention_workspace_size is exactly what the call uses: one byte less is refused
    (nothing written), and the call below then runs in a caller workspace of exactly that size."""
    n = pygdn.workspace_size(cfg, batch)
    short = pygdn.UsmArray((max(n - 1, 1),), np.uint8, queue, usm_type="device")
    with pytest.raises(pygdn.GdnError, match=f"< {n} needed") as e:
        pygdn.attention(queue, cfg, batch, workspace=short, **dev)
    assert e.value.status_name == "GDN_ERROR_OUT_OF_MEMORY"
    after = snapshot(dev)
    for k in before:
        assert np.array_equal(before[k], after[k]), f"a call refused for its workspace changed {k}"
    dev["workspace"] = pygdn.UsmArray((n,), np.uint8, queue, usm_type="device")


def run_case(queue, c):
    verdict, statuses = predict(c)
    if verdict != "ok":
        c["counts_mode"] = False  # counts mode is only for valid metadata (it trusts the contents)
    note(f"case: { {k: v for k, v in c.items() if k != 'arrays'} }")
    note(f"arrays: { {k: None if v is None else v.tolist() for k, v in c['arrays'].items()} }")
    note(f"prediction: {verdict} {statuses}")
    event(f"prediction: {verdict} {sorted(statuses) if statuses else ''}")
    a = c["arrays"]
    event("state caches: " + (", ".join(k for k in ("non_spec_read_state_indices", "spec_read_state_indices",
                                                    "checkpoint_state_indices") if a[k] is not None) or "none"))
    event(f"undersized allocation: {'yes' if undersized(c) else 'no'}")
    cfg, batch, host, dev = build(queue, c)
    before = snapshot(dev)
    if verdict == "ok" and not c["conv_out"] and c["num_actual_tokens"] > 0 and c["seed"] % 2 == 0:
        check_workspace_size(queue, cfg, batch, dev, before)
    try:
        pygdn.attention(queue, cfg, batch, **dev)
    except (pygdn.GdnError, ValueError, TypeError) as e:
        queue.wait()
        after = snapshot(dev)
        for k in before:
            assert np.array_equal(before[k], after[k]), f"failed call ({e}) changed {k}"
        assert verdict != "ok", f"FINDING: valid metadata rejected: {e}"
        if verdict == "python":
            assert not isinstance(e, pygdn.GdnError), f"expected a Python-layer error, got {e}"
        else:
            assert isinstance(e, pygdn.GdnError), f"expected a GdnError, got {type(e).__name__}: {e}"
            assert e.status_name in statuses, f"FINDING: status {e.status_name} ({e}), predicted one of {statuses}"
        return
    assert verdict == "ok", f"FINDING: invalid metadata accepted (predicted {verdict} {statuses})"
    check_success(c, host, dev, before)


FUZZ_SETTINGS = settings(max_examples=int(os.environ.get("GDN_FUZZ_EXAMPLES", "2000")), deadline=None,
                         derandomize=True, database=None, suppress_health_check=list(HealthCheck))


@FUZZ_SETTINGS
@given(c=cases())
def test_fuzz_metadata(queue, c):
    run_case(queue, c)


# ----------------------------------------------------------------------------- found by the fuzzer
def _case(**kw):
    """A hand-written case for run_case (valid unless the arrays say otherwise)."""
    c = dict(seed=1, num_slots=8, pad_slot_id=-1, num_prefills=0, num_decodes=0, num_spec_decodes=0, num_spec=0,
             num_actual_tokens=0, non_spec_token_count=0, spec_token_count=0, ssm_layout="kv", conv_layout="dim_major",
             conv_spec_layout="snapshot", force_recurrent=False, z=False, bias=True, conv_out=True, counts_mode=False,
             corruptions=[], conv_width=W, conv_state_len=W - 1, checkpoint_interval=0, checkpoint_cols=0,
             undersized=None)
    c.update(kw)
    c["rows_alloc"] = c["num_actual_tokens"] + 1
    arrays = {k: None for k in BATCH_KEYS}
    arrays.update({k: np.asarray(v, np.uint8 if k == "has_initial_state" else np.int32).reshape(-1)
                   for k, v in c.pop("arrays").items()})
    c["arrays"] = arrays
    return c


def test_regression_zero_length_non_spec_without_initial_state(queue):
    """Found by this fuzzer: a zero-length sequence with has_initial_state 0 zeroed its conv slot."""
    # A 0-token prefill (has_initial_state 0, slot 3) next to a decode (slot 5).
    c = _case(num_prefills=1, num_decodes=1, num_actual_tokens=1, non_spec_token_count=1,
              arrays=dict(non_spec_query_start_loc=[0, 0, 1], non_spec_state_indices=[3, 5], has_initial_state=[0, 1]))
    assert predict(c) == ("ok", None)
    cfg, batch, host, dev = build(queue, c)
    before = snapshot(dev)
    pygdn.attention(queue, cfg, batch, **dev)
    check_success(c, host, dev, before)


def test_regression_zero_length_rolled_spec_sequence(queue):
    """Found by this fuzzer: a zero-length ROLLED spec sequence shifted its (unclaimed) conv line."""
    # Row 0: a decode writing slot 2. Spec sequence 0 has no tokens but cols [2, 4]; spec sequence 1 one token.
    c = _case(num_decodes=1, num_spec_decodes=2, num_spec=1, num_actual_tokens=2, non_spec_token_count=1,
              spec_token_count=1, conv_spec_layout="rolled", conv_state_len=W,
              arrays=dict(non_spec_query_start_loc=[0, 1], non_spec_state_indices=[2], non_spec_token_indx=[0],
                          spec_query_start_loc=[0, 0, 1], spec_state_indices=[[2, 4], [5, 6]],
                          num_accepted_tokens=[1, 1], spec_token_indx=[1]))
    assert predict(c) == ("ok", None)
    cfg, batch, host, dev = build(queue, c)
    before = snapshot(dev)
    pygdn.attention(queue, cfg, batch, **dev)
    check_success(c, host, dev, before)
