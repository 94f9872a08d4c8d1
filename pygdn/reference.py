"""Independent float64 NumPy reference of the Gated DeltaNet (GDN) attention op with
speculative decoding (MTP), written from the specification (docs/op.md) and include/gdn_xpu.h only.

Canonical layouts used here (tests convert to/from the library's other layouts):
  conv_state [num_slots, C, state_len]  ("dim-major"): conv_state[s, c, j] = history column j
             of channel c; columns 0..W-2 hold the W-1 most recent inputs of a non-spec
             sequence in time order (column W-2 the newest).
  ssm_state  [num_slots, HV, K, V]  (S[k, v]).
`batch` is a dict keyed like the fields of gdn_batch_t; missing keys mean 0 / None.
Every function returns fresh arrays and never mutates its inputs. Plain loops, float64.

State caches as engines keep them (gdn_xpu.h "State caches", docs/op.md "State caches as engines
keep them"): read slots (non_spec_read_state_indices, spec_read_state_indices), block checkpoints
(checkpoint_interval, checkpoint_cols, non_spec_start_pos, checkpoint_state_indices) and the SSM
state dtype: a stored state is rounded to state_dtype (round to nearest even; "i8" and "f8e4m3"
with a fresh scale per state row, round_state) once per store -- each spec write-back, each
checkpoint, the final state of a non-spec sequence -- while the computation of the call goes on
from the unrounded float64 state; a later call starts from the stored (rounded) value.
"""
import numpy as np


def _f64(x):
    return None if x is None else np.array(x, dtype=np.float64, copy=True)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softplus(x):
    """softplus with threshold 20: x if x > 20 else log1p(exp(x))."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _log_softplus(x):
    """log(softplus(x)) for any x, without overflow or underflow: log(x) above the threshold 20,
    x itself below -40 (softplus(x) = e^x (1 - e^x/2 + ...), exact to float64 there)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mid = np.log(np.log1p(np.exp(np.clip(x, -40.0, 20.0))))
        return np.where(x > 20.0, np.log(np.where(x > 20.0, x, 1.0)), np.where(x < -40.0, x, mid))


# ----------------------------------------------------------------------------- elementwise
def gates(a, b, A_log, dt_bias, lower_bound=0.0):
    """a, b [rows, HV]; A_log, dt_bias [HV] -> (g, beta) [rows, HV] (a gate per head, GDN).
    A gate per key channel (KDA): a [rows, HV*K] (or [rows, HV, K]), dt_bias [HV*K] -> g [rows, HV, K].
    g = -exp(A_log) * softplus(a + dt_bias) is the LOG decay; beta = sigmoid(b). With lower_bound
    lb < 0: g = lb * sigmoid(exp(A_log) * (a + dt_bias)) (in [lb, 0]; exp(A_log) * 0 is 0).

    Non-finite gates (docs/op.md "Non-finite gates"): g is the value of that product however large or
    small its factors are. Where both factors are normal numbers it is the product; elsewhere it
    is computed in log space, -exp(A_log + log softplus(x)), so that it is -inf only when the true
    value overflows (a = +inf, a >= ~1e38, A_log >= ~89 in f32: decay 0, the state is reset before
    the token's update) and 0 only when it underflows or a factor is exactly 0 (A_log = -inf or
    a + dt_bias = -inf): 0 * inf never happens (A_log = 100 with a = -200 is g = -e^-100, no decay).
    NaN in A_log or a + dt_bias gives NaN."""
    b, A_log = _f64(b), _f64(A_log).reshape(-1)
    HV = A_log.size
    a = _f64(a).reshape(len(b), HV, -1)
    x = a + _f64(dt_bias).reshape(1, HV, -1)
    lA = np.broadcast_to(A_log[None, :, None], x.shape)
    tiny = np.finfo(np.float64).tiny
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(lA)
        if lower_bound:
            g = lower_bound / (1.0 + np.exp(-np.where(x == 0.0, 0.0, e * x)))
        else:
            sp = _softplus(x)
            normal = np.isfinite(e) & (e >= tiny) & np.isfinite(sp) & (sp >= tiny)
            g = np.where(normal, -e * sp, -np.exp(lA + _log_softplus(x)))
            zero_factor = (np.isneginf(lA) | np.isneginf(x)) & ~np.isnan(lA) & ~np.isnan(x)
            g = np.where(zero_factor, 0.0, g)
    beta = 1.0 / (1.0 + np.exp(-b))
    return (g[:, :, 0] if g.shape[2] == 1 else g), beta


def l2norm(x, eps=1e-6, mode="rsqrt"):
    """L2-normalize over the last axis. "rsqrt": x / sqrt(sum x^2 + eps) (FLA);
    "div": x / (sqrt(sum x^2) + eps)."""
    x = _f64(x)
    ss = np.sum(x * x, axis=-1, keepdims=True)
    if mode == "rsqrt":
        return x / np.sqrt(ss + eps)
    if mode == "div":
        return x / (np.sqrt(ss) + eps)
    raise ValueError("l2norm mode must be 'rsqrt' or 'div'")


def gated_rmsnorm(o, z, w, eps=1e-6, act="silu"):
    """o, z [rows, HV, V]; w [V]: per (row, head) o / sqrt(mean_V(o^2) + eps) * w * act(z),
    act "silu" (Qwen3-Next) or "sigmoid" (Kimi Linear)."""
    o, z, w = _f64(o), _f64(z), _f64(w)
    r = 1.0 / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps)
    if act not in ("silu", "sigmoid"):
        raise ValueError("act must be 'silu' or 'sigmoid'")
    return o * r * w * (_silu(z) if act == "silu" else 1.0 / (1.0 + np.exp(-z)))


# ----------------------------------------------------------------------------- state dtype
_FORMATS = {"f32": (24, -125, 128), "bf16": (8, -125, 128), "f16": (11, -13, 16)}  # bits, min exponent, overflow
_QMAX = {"i8": 127.0, "f8e4m3": 448.0}  # the largest code magnitude of an 8-bit state


def _to_grid(x, bits, emin, rng=None):
    """x on the grid of a binary format with `bits` significant bits whose subnormals share the
    spacing of the smallest normal binade (x = m 2^e, 0.5 <= |m| < 1, e >= emin): round to nearest
    even, or with rng floor(x / ulp + u) * ulp, u ~ U[0, 1) (one of the two neighbours, unbiased).
    No overflow handling; non-finite x gives NaN."""
    _, e = np.frexp(x)
    ulp = np.ldexp(1.0, np.maximum(e, emin) - bits)
    with np.errstate(invalid="ignore", over="ignore"):
        if rng is None:
            return np.rint(x / ulp) * ulp
        return np.floor(x / ulp + rng.random(np.shape(x))) * ulp


def round_e4m3(y, rng=None):
    """y rounded to an OCP E4M3 ("fn") value as float64: 1 sign, 4 exponent bits (bias 7), 3 mantissa
    bits, subnormals spaced 2^-9 below 2^-6, largest finite 448, no inf. Round to nearest even
    (stochastic with rng: the lower or upper neighbour with probability proportional to the
    distance), then saturate to +-448. The sign of y is kept (-0.0 for small negative y)."""
    y = _f64(y)
    r = np.clip(_to_grid(y, 4, -5, rng), -448.0, 448.0)
    return np.copysign(r, y)


def e4m3_to_float(codes):
    """The float64 value of each OCP E4M3 bit pattern (uint8; all 256): sign bit 7, exponent bits
    6..3 (bias 7; 0 = subnormal m 2^-9), mantissa bits 2..0. 0x7F and 0xFF are NaN; 0x80 is -0.0."""
    c = np.asarray(codes).astype(np.int64)
    e, m = (c >> 3) & 15, (c & 7).astype(np.float64)
    mag = np.where(e == 0, np.ldexp(m, -9), np.ldexp(1.0 + m / 8.0, e - 7))
    mag = np.where((c & 0x7F) == 0x7F, np.nan, mag)
    return np.where(c & 0x80, -mag, mag)


def float_to_e4m3(y, rng=None):
    """The OCP E4M3 bit pattern (uint8) of round_e4m3(y, rng). NaN y is not encoded (ValueError)."""
    r = round_e4m3(y, rng)
    if np.isnan(r).any():
        raise ValueError("float_to_e4m3: NaN has no code here")
    a = np.abs(r)
    _, e = np.frexp(a)
    normal = a >= 2.0 ** -6
    exp_field = np.where(normal, e + 6, 0)
    mant = np.where(normal, np.ldexp(a, 4 - e) - 8.0, np.ldexp(a, 9))
    code = (np.signbit(r).astype(np.int64) << 7) | (exp_field.astype(np.int64) << 3) | mant.astype(np.int64)
    return code.astype(np.uint8)


def _quantize_rows(x, dtype, rng, scale_dtype):
    """(y rounded to the code grid as float64, scales): quantize_state without the encoding."""
    if dtype not in _QMAX:
        raise ValueError("quantize_state: dtype must be 'i8' or 'f8e4m3'")
    Q = _QMAX[dtype]
    if scale_dtype == np.float32:
        x32 = np.asarray(x, dtype=np.float32)
        amax = np.max(np.abs(x32), axis=-2)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scale = (amax / np.float32(Q)).astype(np.float32)
            inv = (np.float32(Q) / amax).astype(np.float32)
            y = (x32 * inv[..., None, :]).astype(np.float64)
    elif scale_dtype == np.float64:
        x = _f64(x)
        amax = np.max(np.abs(x), axis=-2)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = amax / Q
            y = x * (Q / amax)[..., None, :]
    else:
        raise ValueError("quantize_state: scale_dtype must be np.float64 or np.float32")
    bad = ~np.isfinite(amax)
    zero = (amax == 0) | bad
    y = np.where(zero[..., None, :], 0.0, y)
    scale = np.where(bad, np.nan, np.where(amax == 0, 0.0, scale)).astype(scale.dtype)
    if dtype == "i8":
        r = np.floor(y + rng.random(y.shape)) if rng is not None else np.rint(y)
        return np.clip(r, -Q, Q), scale
    return round_e4m3(y, rng), scale


def quantize_state(x, dtype, rng=None, scale_dtype=np.float64):
    """An 8-bit state with one scale per row: (codes, scales). x [..., K, V]: a row is the K values
    of one v (axis -2), so scales is [..., V]. dtype "i8" (codes int8) or "f8e4m3" (codes uint8,
    OCP E4M3 bit patterns). Per row: amax = max_k |x_k|, Q = 127 (i8) or 448 (f8e4m3),
    scale = amax / Q, y_k = x_k (Q / amax), code = y rounded to nearest even (i8: an integer,
    clamped to [-127, 127]; f8e4m3: round_e4m3, saturating at +-448); amax == 0: scale 0, codes 0.
    With rng (a numpy Generator) y is rounded stochastically (floor(y / spacing + u) * spacing).
    value = code * scale (dequantize_state).
    scale_dtype np.float32 does the arithmetic of the kernels, in f32: amax of f32(x),
    scale = f32(amax / Q), y = f32(f32(x) * f32(Q / amax)); the scales come back as float32 (a kernel
    input). A row holding inf or NaN gets scale NaN and codes 0."""
    r, scale = _quantize_rows(x, dtype, rng, scale_dtype)
    return (r.astype(np.int8) if dtype == "i8" else float_to_e4m3(r)), scale


def dequantize_state(codes, scales, dtype):
    """The float64 values of an 8-bit state: code * scale, codes [..., K, V], scales [..., V]
    (the kernels take the product in f32)."""
    if dtype == "i8":
        c = np.asarray(codes).astype(np.float64)
    elif dtype == "f8e4m3":
        c = e4m3_to_float(codes)
    else:
        raise ValueError("dequantize_state: dtype must be 'i8' or 'f8e4m3'")
    return c * np.asarray(scales, dtype=np.float64)[..., None, :]


def round_state(x, dtype, rng=None):
    """x as stored in `dtype`, as float64 (None = no rounding).
    "f32" | "bf16" | "f16": rounded to nearest even, exact from float64: x = m 2^e (0.5 <= |m| < 1)
    has `bits` significant bits, subnormals share the spacing of the smallest normal binade,
    magnitudes rounding to >= 2^overflow become inf.
    "i8" | "f8e4m3": x [..., K, V] quantized with one scale per row (axis -2, the K values of one v)
    and dequantized: dequantize_state(*quantize_state(x, dtype, rng), dtype).
    rng (a numpy Generator): stochastic rounding instead of round to nearest even."""
    x = _f64(x)
    if dtype is None:
        return x
    if dtype in _QMAX:  # the values of dequantize_state(*quantize_state(x, dtype, rng), dtype)
        r, scale = _quantize_rows(x, dtype, rng, np.float64)
        return r * scale[..., None, :]
    bits, emin, emax = _FORMATS[dtype]
    r = _to_grid(x, bits, emin, rng)
    with np.errstate(invalid="ignore"):
        r = np.where(np.abs(r) >= 2.0 ** emax, np.copysign(np.inf, x), r)
    return np.where(np.isfinite(x), r, x)


# ----------------------------------------------------------------------------- batch metadata
def _ints(batch, key):
    v = batch.get(key)
    return None if v is None else np.asarray(v, dtype=np.int64).reshape(-1)


def _non_spec_sequences(batch):
    """Yield (i, slot, read_slot, global_rows, has_initial_state, checkpoints) for each non-spec
    sequence; checkpoints = [(j, slot)]: after its token j (0-based in the step) the state goes to
    slot (pad entries included: the caller skips them)."""
    nseq = int(batch.get("num_prefills", 0) or 0) + int(batch.get("num_decodes", 0) or 0)
    if nseq == 0:
        return
    loc = _ints(batch, "non_spec_query_start_loc")
    slots = _ints(batch, "non_spec_state_indices")
    reads = _ints(batch, "non_spec_read_state_indices")
    his = _ints(batch, "has_initial_state")
    tok = _ints(batch, "non_spec_token_indx")
    interval = int(batch.get("checkpoint_interval", 0) or 0)
    ck_cols = int(batch.get("checkpoint_cols", 0) or 0)
    start = _ints(batch, "non_spec_start_pos")
    ck = _ints(batch, "checkpoint_state_indices") if interval and ck_cols else None
    for i in range(nseq):
        js = range(int(loc[i]), int(loc[i + 1]))
        rows = [int(tok[j]) if tok is not None else j for j in js]
        # None = every sequence has state; an array shorter than nseq is taken to cover the
        # leading entries, the rest have state.
        hs = True if his is None or i >= len(his) else bool(his[i])
        checkpoints = []
        if interval and not _padding(batch)(int(slots[i])):  # graph padding stores no checkpoints
            p = 0 if start is None else int(start[i])
            assert p >= 0, "non_spec_start_pos must be >= 0"
            bounds = [j for j in range(len(rows)) if (p + j + 1) % interval == 0]
            assert len(bounds) <= ck_cols, "more checkpoint boundaries than checkpoint_cols"
            checkpoints = [(j, int(ck[i * ck_cols + k])) for k, j in enumerate(bounds)]
        read = int(slots[i]) if reads is None else int(reads[i])
        yield i, int(slots[i]), read, rows, hs, checkpoints


def _spec_sequences(batch, num_spec=None):
    """Yield (n, cols[1+num_spec], A, global_rows, read_slot) for each spec sequence; read_slot is
    None when spec_read_state_indices is not given (each cache then has its default read slot)."""
    nspec = int(batch.get("num_spec_decodes", 0) or 0)
    if nspec == 0:
        return
    S = int(batch.get("num_spec", 0) or 0) if num_spec is None else int(num_spec)
    loc = _ints(batch, "spec_query_start_loc")
    cols_all = _ints(batch, "spec_state_indices").reshape(nspec, 1 + S)
    acc = _ints(batch, "num_accepted_tokens")
    tok = _ints(batch, "spec_token_indx")
    reads = _ints(batch, "spec_read_state_indices")
    for n in range(nspec):
        js = range(int(loc[n]), int(loc[n + 1]))
        rows = [int(tok[j]) if tok is not None else j for j in js]
        A = int(acc[n])
        assert 1 <= A <= 1 + S, "num_accepted_tokens out of [1, 1+num_spec]"
        assert len(rows) <= 1 + S, "spec sequence length out of [0, 1+num_spec] (0 = graph padding)"
        yield n, [int(c) for c in cols_all[n]], A, rows, None if reads is None else int(reads[n])


def _padding(batch):
    """The batch's test for padding state indices: pad_slot_id (default -1) and every negative index."""
    v = batch.get("pad_slot_id")
    pad = -1 if v is None else int(v)
    return lambda slot: slot < 0 or slot == pad


# ----------------------------------------------------------------------------- causal conv1d
def _conv_seq(hist, xs, weight, bias, silu):
    """hist [C, W-1] (oldest first), xs [L, C] -> (y [L, C], full [C, W-1+L]).
    y_t[c] = bias[c] + sum_i weight[c, i] * x_{t-W+1+i}[c]; full column W-1+t is x_t."""
    W = weight.shape[1]
    full = np.concatenate([hist, xs.T], axis=1)
    y = np.zeros_like(xs)
    for t in range(xs.shape[0]):
        acc = bias.copy()
        for i in range(W):
            acc = acc + weight[:, i] * full[:, t + i]
        y[t] = _silu(acc) if silu else acc
    return y, full


def causal_conv1d(x, weight, bias, conv_state, batch, spec_layout="snapshot", silu=True,
                  num_spec=None):
    """Depthwise causal conv1d (+SiLU) over the mixed batch.

    x [rows, C]; weight [C, W]; bias [C] or None; conv_state [num_slots, C, state_len].
    Returns (out [rows, C], new_conv_state). All history is read from the input conv_state
    (before any write of this call). Rows of padded / unaddressed sequences are zero.

    Non-spec: history = columns 0..W-2 of the read slot (zeros without initial state or when the
    read slot is pad); afterwards columns 0..W-2 of the write slot hold the last W-1 inputs of
    history ++ sequence, and those of each checkpoint slot the last W-1 up to its boundary token.
    Spec "snapshot": window from columns 0..W-2 of the read slot (default cols[A-1]; zeros if
    pad); the window after token t goes to columns 0..W-2 of cols[t] (skipped if pad).
    Spec "rolled": line s = cols[0] (pad: skip); window = columns A-1..A+W-3 of the read slot's
    line (default s; zeros if pad); afterwards line s has columns 0..W-3 = last W-2 entries of
    that window, column W-2+j = x_j (j < L).
    """
    x, weight = _f64(x), _f64(weight)
    C, W = weight.shape
    bias = np.zeros(C) if bias is None else _f64(bias)
    old = _f64(conv_state)
    new = old.copy()
    state_len = old.shape[2]
    assert state_len >= W - 1
    is_pad = _padding(batch)
    out = np.zeros_like(x)

    for _, slot, read, rows, hs, checkpoints in _non_spec_sequences(batch):
        if is_pad(slot) or not rows:
            continue
        hist = old[read][:, :W - 1].copy() if hs and not is_pad(read) else np.zeros((C, W - 1))
        y, full = _conv_seq(hist, x[rows], weight, bias, silu)
        out[rows] = y
        new[slot][:, :W - 1] = full[:, full.shape[1] - (W - 1):]
        for j, ck in checkpoints:  # full column W-1+j is x_j: the W-1 inputs ending there
            if not is_pad(ck):
                new[ck][:, :W - 1] = full[:, j + 1:j + W]

    for _, cols, A, rows, read in _spec_sequences(batch, num_spec):
        L = len(rows)
        if spec_layout == "snapshot":
            src = cols[A - 1] if read is None else read
            hist = old[src][:, :W - 1].copy() if not is_pad(src) else np.zeros((C, W - 1))
            y, full = _conv_seq(hist, x[rows], weight, bias, silu)
            out[rows] = y
            for t in range(L):
                if not is_pad(cols[t]):
                    new[cols[t]][:, :W - 1] = full[:, t + 1:t + W]
        elif spec_layout == "rolled":
            s = cols[0]
            if is_pad(s):
                continue
            assert A + W - 2 <= state_len and W - 2 + L <= state_len, "rolled: state_len too small"
            src = s if read is None else read
            hist = old[src][:, A - 1:A + W - 2].copy() if not is_pad(src) else np.zeros((C, W - 1))
            y, _ = _conv_seq(hist, x[rows], weight, bias, silu)
            out[rows] = y
            new[s][:, :W - 2] = hist[:, 1:]
            for j in range(L):
                new[s][:, W - 2 + j] = x[rows[j]]
        else:
            raise ValueError("spec_layout must be 'snapshot' or 'rolled'")
    return out, new


# ----------------------------------------------------------------------------- delta rule
def _delta_step(S, q, k, v, g, beta):
    """One token for one v-head, in place on S [K, V]; returns o [V]. g: the log-decay, a scalar
    (GDN), or [K] (KDA: row k of S decays by exp(g[k]))."""
    S *= np.exp(np.reshape(g, (-1, 1)))
    u = beta * (v - S.T @ k)
    S += np.outer(k, u)
    return S.T @ q


def gated_delta_rule(qkv, g, beta, ssm_state, batch, H, HV, K, V, scale=None, l2norm_qk=True,
                     l2_mode="rsqrt", eps=1e-6, state_dtype=None, state_rng=None):
    """Gated delta rule over the mixed batch (plain token recurrence everywhere).

    qkv [rows, 2*H*K + HV*V] (conv output); g, beta [rows, HV] (KDA: g [rows, HV, K], a decay per
    key channel); ssm_state [slots, HV, K, V].
    v-head h uses q/k head h // (HV // H). q, k l2-normalized if l2norm_qk; q *= scale
    (default K**-0.5) in all cases. Returns (o [rows, HV, V], new_ssm_state).
    Non-spec: state from the read slot (zeros without initial state or when the read slot is
    pad), to the write slot (pad: sequence skipped) and to each checkpoint slot after its
    boundary token. Spec: initial = ssm[read slot] if spec_read_state_indices is given (pad:
    zeros), else ssm[cols[A-1]] (pad: sequence skipped, outputs zero, no writes); the state after
    token t is written to cols[t] unless pad. Reads use the input ssm_state. Every stored state
    is round_state(S, state_dtype, state_rng) (S [HV, K, V]: an 8-bit state has a scale per
    (v-head, v)); the recurrence continues from the unrounded S. state_rng (a numpy Generator):
    stochastic rounding of the stores.
    """
    qkv, g, beta = _f64(qkv), _f64(g), _f64(beta)
    rows_n = qkv.shape[0]
    assert qkv.shape[1] == 2 * H * K + HV * V and HV % H == 0
    q = qkv[:, :H * K].reshape(rows_n, H, K)
    k = qkv[:, H * K:2 * H * K].reshape(rows_n, H, K)
    v = qkv[:, 2 * H * K:].reshape(rows_n, HV, V)
    if l2norm_qk:
        q, k = l2norm(q, eps, l2_mode), l2norm(k, eps, l2_mode)
    q = q * (K ** -0.5 if scale is None else scale)
    old = _f64(ssm_state)
    new = old.copy()
    is_pad = _padding(batch)
    o = np.zeros((rows_n, HV, V))
    grp = HV // H

    def token(S, r):
        for h in range(HV):
            o[r, h] = _delta_step(S[h], q[r, h // grp], k[r, h // grp], v[r, h], g[r, h],
                                  beta[r, h])

    store = lambda S: round_state(S, state_dtype, state_rng)  # noqa: E731
    for _, slot, read, rows, hs, checkpoints in _non_spec_sequences(batch):
        if is_pad(slot) or len(rows) == 0:  # graph padding / zero-length: nothing read, nothing written
            continue
        S = old[read].copy() if hs and not is_pad(read) else np.zeros((HV, K, V))
        at = dict(checkpoints)
        for j, r in enumerate(rows):
            token(S, r)
            if j in at and not is_pad(at[j]):
                new[at[j]] = store(S)
        new[slot] = store(S)

    for _, cols, A, rows, read in _spec_sequences(batch):
        if read is None:
            if is_pad(cols[A - 1]):
                continue
            S = old[cols[A - 1]].copy()
        else:
            S = old[read].copy() if not is_pad(read) else np.zeros((HV, K, V))
        for t, r in enumerate(rows):
            token(S, r)
            if not is_pad(cols[t]):
                new[cols[t]] = store(S)
    return o, new


def gdn_attention(mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, ssm_state,
                  batch, H, HV, K, V, spec_layout="snapshot", z=None, norm_weight=None,
                  norm_eps=1e-6, silu=True, scale=None, l2norm_qk=True, l2_mode="rsqrt",
                  l2_eps=1e-6, state_dtype=None, lower_bound=0.0, out_gate="silu", state_rng=None):
    """The whole op: causal_conv1d -> gates -> gated delta rule (-> gated RMSNorm if z given).
    z [rows, HV*V] or [rows, HV, V]; norm_weight [V]; state_dtype rounds the stored SSM states
    (state_rng: stochastically).
    KDA: a [rows, HV*K] and dt_bias [HV*K] (gates), out_gate "sigmoid".
    Returns (out [rows, HV, V], new_conv_state, new_ssm_state)."""
    conv_out, new_conv = causal_conv1d(mixed_qkv, conv_weight, conv_bias, conv_state, batch,
                                       spec_layout=spec_layout, silu=silu)
    g, beta = gates(a, b, A_log, dt_bias, lower_bound)
    o, new_ssm = gated_delta_rule(conv_out, g, beta, ssm_state, batch, H, HV, K, V, scale=scale,
                                  l2norm_qk=l2norm_qk, l2_mode=l2_mode, eps=l2_eps, state_dtype=state_dtype,
                                  state_rng=state_rng)
    if z is not None:
        o = gated_rmsnorm(o, _f64(z).reshape(o.shape), norm_weight, norm_eps, out_gate)
    return o, new_conv, new_ssm


# ----------------------------------------------------------------------------- single head
def recurrent_single(q, k, v, g, beta, S0):
    """Plain recurrence for one sequence / head pair. q, k [T, K] (already normalized and
    scaled), v [T, V], g, beta [T], S0 [K, V] -> (o [T, V], S_final)."""
    q, k, v, g, beta = _f64(q), _f64(k), _f64(v), _f64(g), _f64(beta)
    S = _f64(S0)
    o = np.zeros((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        o[t] = _delta_step(S, q[t], k[t], v[t], g[t], beta[t])
    return o, S


def _chunk_decays(g):
    """Decays of one chunk with resets (docs/op.md "Non-finite gates"). A token whose decay e^g is 0
    (g = -inf, or so negative that e^g underflows) resets the state: every product of decays across
    it is 0, and its g must not enter a cumulative sum (-inf - -inf = NaN; a huge finite g would
    absorb the gates after it). With P the cumulative g over the chunk's other tokens and R_i the
    last reset at or before i (-1: none):
      between(i, j) = prod_{t=j+1..i} e^{g_t} = 0 if R_i > j else e^{P_i - P_j}   (j <= i)
      start[i]      = prod_{t<=i} e^{g_t}     = 0 if R_i >= 0 else e^{P_i}
    Returns (between [n, n] lower-triangular incl. the diagonal, start [n])."""
    n = len(g)
    with np.errstate(over="ignore", invalid="ignore"):
        reset = np.exp(g) == 0.0
    P = np.cumsum(np.where(reset, 0.0, g))
    R = np.maximum.accumulate(np.where(reset, np.arange(n), -1))
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    with np.errstate(over="ignore", invalid="ignore"):
        between = np.where((j <= i) & (R[:, None] <= j), np.exp(np.where(j <= i, P[:, None] - P[None, :], 0.0)), 0.0)
        start = np.where(R >= 0, 0.0, np.exp(P))
    return between, start


def chunked_gated_delta_rule(q, k, v, g, beta, S0, chunk=64):
    """WY/UT chunked form of recurrent_single (same inputs/outputs). Per chunk, with
    D[i,j] = prod_{t=j+1..i} e^{g_t} and d_i = prod_{t<=i} e^{g_t} (_chunk_decays; e^{G_i-G_j} and
    e^{G_i} with G = cumsum(g) when no decay is 0): A[i,j] = beta_i D[i,j] k_i.k_j (j < i);
    T = (I + A)^-1; U = T (beta v); Wm = T (beta d k); u = U - Wm S;
    o = d (q S) + tril_incl(q k^T D) u;  S = d_last S + sum_j D[last,j] k_j u_j^T.
    """
    q, k, v, g, beta = _f64(q), _f64(k), _f64(v), _f64(g), _f64(beta)
    S = _f64(S0)
    T_len = q.shape[0]
    o = np.zeros((T_len, v.shape[1]))
    for c0 in range(0, T_len, chunk):
        sl = slice(c0, min(c0 + chunk, T_len))
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]
        D, d = _chunk_decays(g[sl])
        n = len(d)
        Amat = bc[:, None] * np.tril(D, -1) * (kc @ kc.T)
        Tm = np.linalg.inv(np.eye(n) + Amat)
        U = Tm @ (bc[:, None] * vc)
        Wm = Tm @ ((bc * d)[:, None] * kc)
        u = U - Wm @ S
        o[sl] = d[:, None] * (qc @ S) + ((qc @ kc.T) * D) @ u
        S = d[-1] * S + (D[-1][:, None] * kc).T @ u
    return o, S


def _bf16(x):
    """x rounded to bf16 (nearest even) as float64: a product's operand in prefill_precision "bf16"."""
    return round_state(x, "bf16")


def _channel_decays(g):
    """Per-channel decays of one chunk (KDA: g [n, K], log-decays): alpha = e^g and, as products in
    linear space (a zero alpha zeroes every product across it, on its channel only),
    between[i, j] = prod_{t=j+1..i} alpha_t (j <= i, else 0), start[i] = prod_{t<=i} alpha_t,
    end[j] = prod_{t=j+1..n-1} alpha_t. Returns (between [n, n, K], start [n, K], end [n, K])."""
    alpha = np.exp(_f64(g))
    n, K = alpha.shape
    between = np.zeros((n, n, K))
    for i in range(n):
        d = np.ones(K)
        for j in range(i, -1, -1):
            between[i, j] = d
            d = d * alpha[j]
    return between, np.cumprod(alpha, axis=0), between[n - 1]


def chunked_gated_delta_rule_bf16(q, k, v, g, beta, S0, chunk=64, first=None):
    """The chunked form as prefill_precision "bf16" computes it (docs/op.md "Prefill precision"), in
    float64 with every product's operands rounded to bf16 (r below) and nothing else rounded: a model
    of that path's rounding. Inputs as recurrent_single (g [T] per head, or [T, K] per key channel:
    KDA); first: the length of the first chunk (block checkpoints align chunks to the request's
    positions), the others `chunk` tokens. Per chunk, D and d the decays of _chunk_decays
    (_channel_decays for KDA):
      GDN  A = tril(beta_i D (r(k) r(k)^T), -1),  Aqk = tril(D (r(q) r(k)^T)),
           T = (I + A)^-1,  W = r(T diag(beta d)) r(k),  U = r(T diag(beta)) r(v)
      KDA  A[i, j] = beta_i sum_c k_i k_j D[i, j] (j < i),  Aqk[i, j] = sum_c q_i k_j D[i, j] (j <= i),
           T = (I + A)^-1,  W = r(T diag(beta)) r(k (.) d),  U = r(T diag(beta)) r(v)
      u = U - r(W) r(S),  o = r(q (.) d) r(S) + r(Aqk) r(u),  S = d_last S + r(k (.) d_end)^T r(u)
    (d_end[j]: the decay from token j to the chunk's last). Returns (o [T, V], S_final, ends): ends
    lists (index of a chunk's last token, the state after it) for every chunk."""
    q, k, v, beta = _f64(q), _f64(k), _f64(v), _f64(beta)
    g = _f64(g)
    per_channel = g.ndim == 2
    S = _f64(S0)
    T_len = q.shape[0]
    o = np.zeros((T_len, v.shape[1]))
    ends = []
    c0 = 0
    while c0 < T_len:
        n = min(first if (c0 == 0 and first) else chunk, T_len - c0)
        sl = slice(c0, c0 + n)
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]
        if per_channel:
            D, d, d_end = _channel_decays(g[sl])
            Amat = np.tril(bc[:, None] * np.einsum("ic,jc,ijc->ij", kc, kc, D), -1)
            Aqk = np.tril(np.einsum("ic,jc,ijc->ij", qc, kc, D))
            Tm = np.linalg.inv(np.eye(n) + Amat)
            W = _bf16(Tm * bc[None, :]) @ _bf16(kc * d)
            d_last = d[-1][:, None]
        else:
            D, dd = _chunk_decays(g[sl])
            kr = _bf16(kc)
            Amat = bc[:, None] * np.tril(D, -1) * (kr @ kr.T)
            Aqk = D * (_bf16(qc) @ kr.T)
            Tm = np.linalg.inv(np.eye(n) + Amat)
            W = _bf16(Tm * (bc * dd)[None, :]) @ kr
            d, d_end, d_last = dd[:, None], D[-1][:, None], dd[-1]
        U = _bf16(Tm * bc[None, :]) @ _bf16(vc)
        Sr = _bf16(S)
        u = U - _bf16(W) @ Sr
        ur = _bf16(u)
        o[sl] = _bf16(qc * d) @ Sr + _bf16(Aqk) @ ur
        S = d_last * S + _bf16(kc * d_end).T @ ur
        c0 += n
        ends.append((c0 - 1, S.copy()))
    return o, S, ends
