/*
 * gdn_xpu.h — public C ABI of libgdn_xpu.
 *
 * Gated DeltaNet (GDN) linear attention of Qwen3-Next / Qwen3.5 for SYCL devices (Intel GPUs via
 * Level Zero, the SYCL CPU device via OpenCL), with speculative decoding (MTP).
 *
 * Conventions used by every entry point
 * -------------------------------------
 *  - `queue` is a `sycl::queue *` passed as `void *` (what dpctl calls a DPCTLSyclQueueRef:
 *    `dpctl.SyclQueue.addressof_ref()`). The library copies the handle; it never owns it.
 *  - Every array argument is a USM pointer (device, shared or host) of that queue's context
 *    (device USM: of the queue's own device; system memory: see "Host memory"), aligned to its
 *    element size (int32 metadata 4, f32 4, f16/bf16 2, bytes 1; workspace 4); else
 *    GDN_ERROR_BAD_POINTER naming the field.
 *    Views into a larger allocation (a slot range of a cache, a dpnp slice) are fine, the
 *    kernels' wider accesses fall back.
 *    Shapes below are outermost-first, C order; "rows" are token rows of the step.
 *  - Every array a call reads or writes lies inside its USM allocation: from the array's pointer
 *    to the end of the allocation holding it there are at least the bytes its shape gives, else
 *    GDN_ERROR_BAD_POINTER naming the field, the bytes it needs and the bytes its allocation has
 *    from that pointer on (GDN_VALIDATE_FULL and GDN_VALIDATE_COUNTS alike). The bytes: row
 *    arrays, num_actual_tokens rows at their row stride ((rows-1)*stride + the row's elements);
 *    caches, every slot, addressed or not ((num_slots-1)*slot stride + one slot's elements);
 *    metadata arrays, the lengths the counts give (none for a group without sequences); weights,
 *    their shapes; workspace, workspace_bytes. Arrays the entry point does not read or write
 *    (each lists its own) are not measured. The extent is the runtime's: clGetMemAllocInfoINTEL
 *    on OpenCL, zeMemGetAddressRange on Level Zero, asked on every call (an allocation freed and
 *    another made at its address is measured afresh). A backend that cannot report extents
 *    (another backend, the entry point absent) gets no extent check: the caller's sizes are
 *    trusted there, as they are for memory without a runtime allocation (host memory of a system
 *    allocator, see "Host memory"; pygdn's shape checks are the guard then).
 *  - Host memory (opt-in: GDN_FLAG_HOST_MEMORY in cfg->flags). With the flag, on a device with
 *    sycl::aspect::usm_system_allocations (the SYCL CPU device), an array may also be system
 *    memory: malloc'ed, a NumPy array, a torch CPU tensor. A pointer that is not USM of the
 *    queue's context is then taken as such (same alignment rule; no extent check: the runtime
 *    knows no allocation). Without the flag, or on other devices, such a pointer is refused
 *    (GDN_ERROR_BAD_POINTER), so a freed or foreign pointer never passes by default. The caller
 *    guarantees that it is live host memory until the call's kernels finish: the runtime cannot
 *    tell it from freed USM (bindings check where an array lives before they pass it and set the
 *    flag; pygdn does).
 *  - Metadata arrays are int32 (`has_initial_state` is one byte per entry, 0 or 1).
 *  - Calls enqueue their kernels and return. On an in-order queue they return without waiting
 *    for the device; on an out-of-order queue they wait, so the results are visible when the
 *    call returns. Validation (GDN_VALIDATE_FULL) reads the metadata arrays back to the host,
 *    which waits for the work already on the queue.
 *  - Every function that can fail returns a gdn_status_t (the others: version and size queries,
 *    *_init, gdn_queue_destroy, gdn_free, gdn_release_caches). On failure nothing was written to
 *    any array, and gdn_last_error() returns a message naming the offending field and value
 *    (thread-local, valid until the next gdn_* call on the same thread).
 *  - The chunk plan of prefills is built on the device: no call reads metadata back to plan it.
 *    Under GDN_VALIDATE_COUNTS no call reads anything back or waits, whatever its batch (so any
 *    batch can be recorded into a graph: "Graphs" below). The kernels clamp each sequence's start
 *    locations into [0, its group's token count] (the end not before the start) and a spec
 *    sequence's tokens to 1 + num_spec: whatever the start locations hold, no sequence walks
 *    outside its group's token rows or a spec sequence outside its row of spec_state_indices.
 *  - Batch invariance and graphs: see "Batch invariance" and "Graphs" below.
 *  - Structs are versioned by their first field `struct_size` = sizeof(struct) of the caller's
 *    header. Fill them with the gdn_*_init() functions, which set defaults and struct_size.
 *    The structs only grow, by fields appended at the end: a caller built against an older
 *    header passes its smaller struct_size and gets the defaults (gdn_*_init) for every field
 *    its header did not have; a caller built against a newer header may pass a larger struct
 *    whose fields unknown to this library are all zero. Versions of gdn_batch_t: 1 (0.1.0, ends
 *    after spec_token_indx), 2 (0.2.0: adds the state-cache fields from non_spec_read_state_indices on).
 *    Versions of gdn_config_t and gdn_tensors_t: 1 (0.1.0, ending after flags / workspace_bytes),
 *    2 (adds the packed projections -- packed_order; qkvz through z_out_stride -- and replay mode
 *    -- replay_tokens; replay_ring, replay_count: "Replay mode" below), 3 (adds the gate modes --
 *    gate_mode, out_gate, gate_lower_bound; b_stride). gdn_tensors_t version 4 adds dt_bias_dtype;
 *    gdn_config_t version 4 adds prefill_precision (and reserved1). Version 5 of both adds the 8-bit
 *    SSM state: gdn_config_t ssm_scale_slot_stride, state_rounding (and reserved2); gdn_tensors_t
 *    ssm_scale.
 *
 * Python (pygdn) reads the text between GDN_CDEF_BEGIN and GDN_CDEF_END with cffi, so that
 * region holds plain C declarations only: no #if, no function-like macros.
 */
#ifndef GDN_XPU_H
#define GDN_XPU_H

#include <stddef.h>
#include <stdint.h>

/* GDN_BUILDING is defined only while the library itself is compiled (meson.build): it exports
 * the entry points; a consumer imports them (Windows) or needs no attribute (ELF). */
#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(GDN_BUILDING)
#    define GDN_API __declspec(dllexport)
#  else
#    define GDN_API __declspec(dllimport)
#  endif
#elif defined(GDN_BUILDING)
#  define GDN_API __attribute__((visibility("default")))
#else
#  define GDN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* GDN_CDEF_BEGIN */

/* Library version (semantic). meson.build checks these against the project version. */
#define GDN_VERSION_MAJOR 0
#define GDN_VERSION_MINOR 4
#define GDN_VERSION_PATCH 0
/* Bumped whenever a struct layout or a function signature changes incompatibly (appending a
 * field to a struct does not: see "Structs are versioned" above). */
#define GDN_ABI_VERSION 1

/* Status codes. Values are pinned: never renumbered, never reused. */
typedef enum gdn_status {
  GDN_SUCCESS = 0,
  GDN_ERROR_NULL_POINTER = 1,       /* an array the counts require is NULL              */
  GDN_ERROR_BAD_COUNT = 2,          /* a count is negative or counts are inconsistent    */
  GDN_ERROR_BAD_SHAPE = 3,          /* model dims unsupported or inconsistent            */
  GDN_ERROR_BAD_DTYPE = 4,          /* unknown or unsupported dtype                      */
  GDN_ERROR_BAD_LAYOUT = 5,         /* unknown layout value, or a stride too small       */
  GDN_ERROR_BAD_START_LOC = 6,      /* *_query_start_loc not monotonic / not matching    */
  GDN_ERROR_BAD_STATE_INDEX = 7,    /* a state index >= slots that is not pad_slot_id    */
  GDN_ERROR_DUPLICATE_SLOT = 8,     /* two writers of one slot, or a writer and a reader */
  GDN_ERROR_BAD_ACCEPTED = 9,       /* num_accepted_tokens outside [1, 1 + num_spec]     */
  GDN_ERROR_BAD_TOKEN_INDEX = 10,   /* a token row out of range, or two owners of a row  */
  GDN_ERROR_BAD_STRUCT_SIZE = 11,   /* struct_size of no known version (older than v1)   */
  GDN_ERROR_BAD_POINTER = 12,       /* not USM of the queue's context/device, misaligned,
                                       or past the end of its allocation                 */
  GDN_ERROR_BAD_QUEUE = 13,         /* NULL queue                                        */
  GDN_ERROR_UNSUPPORTED = 14,       /* valid request this build/device cannot run        */
  GDN_ERROR_COMPILE = 15,           /* run-time kernel compilation failed (log in message) */
  GDN_ERROR_DEVICE = 16,            /* the SYCL runtime reported an error                */
  GDN_ERROR_OUT_OF_MEMORY = 17,     /* workspace allocation failed                       */
  GDN_ERROR_INTERNAL = 18           /* a bug in libgdn_xpu                               */
} gdn_status_t;

/* Element types of activations (act_dtype) and of the SSM state cache (state_dtype). */
typedef enum gdn_dtype {
  GDN_DTYPE_F32 = 1,
  GDN_DTYPE_F16 = 2,
  GDN_DTYPE_BF16 = 3,
  /* 8-bit SSM states (state_dtype only), one f32 scale per state row in tensors->ssm_scale
   * ("State dtype" below): */
  GDN_DTYPE_I8 = 4,      /* int8, symmetric: codes -127..127                                  */
  GDN_DTYPE_F8E4M3 = 5   /* OCP FP8 E4M3 (finite, saturating: |value| <= 448 x scale), bytes  */
} gdn_dtype_t;

/* How an 8-bit state is rounded when stored (gdn_config_t.state_rounding). */
typedef enum gdn_state_rounding {
  GDN_ROUND_NEAREST = 0,    /* round to nearest even (the default)                             */
  GDN_ROUND_STOCHASTIC = 1  /* down or up with probability by distance; the random bits a pure
                               function of (v-head, state row, element, the row's new scale):
                               deterministic, batch invariant, the same in graph replays     */
} gdn_state_rounding_t;

/* ssm_state layout, per slot and v-head. */
typedef enum gdn_ssm_layout {
  GDN_SSM_KV = 0, /* [num_slots, HV, K, V]: FLA, vLLM < 0.34                  */
  GDN_SSM_VK = 1  /* [num_slots, HV, V, K]: vLLM >= 0.34, vllm-xpu-kernels    */
} gdn_ssm_layout_t;

/* conv_state layout, per slot. state_len = gdn_config_t.conv_state_len columns of history. */
typedef enum gdn_conv_layout {
  GDN_CONV_DIM_MAJOR = 0, /* [num_slots, conv_dim, state_len]: vLLM CUDA logical order    */
  GDN_CONV_TIME_MAJOR = 1 /* [num_slots, state_len, conv_dim]: vllm-xpu-kernels           */
} gdn_conv_layout_t;

/* How speculative sequences keep their conv history (docs/op.md "Conv state in MTP").
 *  SNAPSHOT: the W-1 input window before token 0 is read from slot spec_state_indices[n][A-1]
 *            (or spec_read_state_indices[n]) and the window after token t is written to slot
 *            spec_state_indices[n][t] (vllm-xpu-kernels #368). Needs conv_state_len >= W-1.
 *  ROLLED:   one line, slot spec_state_indices[n][0], holds W-1+num_spec columns; this step's
 *            window is columns A-1 .. A+W-3 of the read slot's line (that line, or
 *            spec_read_state_indices[n]); afterwards the line [n][0] holds the last W-2 inputs
 *            before token 0 in columns 0..W-3 and token j in column W-2+j (vLLM CUDA
 *            causal_conv1d_update). Needs conv_state_len >= W-1+num_spec. Prefill/decode and
 *            checkpoints write columns 0..W-2 (the A = 1 window). */
typedef enum gdn_conv_spec_layout {
  GDN_CONV_SPEC_SNAPSHOT = 0,
  GDN_CONV_SPEC_ROLLED = 1
} gdn_conv_spec_layout_t;

/* Bits of gdn_config_t.flags. */
enum {
  GDN_FLAG_NO_SILU = 1,          /* conv output without SiLU                                  */
  GDN_FLAG_NO_QK_L2NORM = 2,     /* q/k not l2-normalized (caller did it); q is still scaled  */
  GDN_FLAG_FORCE_RECURRENT = 4,  /* prefill through the token recurrence, not the chunk form  */
  GDN_FLAG_L2NORM_DIV = 8,       /* l2norm as x/(|x|+eps) instead of x*rsqrt(sum x^2 + eps)   */
  GDN_FLAG_HOST_MEMORY = 16,     /* arrays may be host (system) memory: see "Host memory"     */
  GDN_FLAG_ALL = 31              /* every bit this version knows; others are rejected         */
};

/* Order of the columns of packed projections (gdn_config_t.packed_order; docs/op.md "Packed
 * projections"): the rows of the in-projections as vLLM's Qwen3-Next / Qwen3.5 layers produce them,
 * read by the kernels in place (tensors qkvz, ba) instead of mixed_qkv, a, b and z. With
 * g = HV/H v-heads per k-head:
 *  GROUPED:    qkvz row = H groups [q_h (K) | k_h (K) | v_h (g*V) | z_h (g*V)], k-head h's group;
 *              ba row   = H groups [b_h (g) | a_h (g)]. Qwen3-Next (vllm-xpu-kernels reorder_input=false).
 *  CONTIGUOUS: qkvz row = [q (H*K) | k (H*K) | v (HV*V) | z (HV*V)];
 *              ba row   = [b (HV) | a (HV)]. Qwen3.5 (vllm-xpu-kernels reorder_input=true).
 * Within each part heads are head-major as in mixed_qkv. Head counts are those of the rank (a
 * tensor-parallel rank's projections hold its own heads in the same order). */
typedef enum gdn_packed_order {
  GDN_PACKED_NONE = 0,
  GDN_PACKED_GROUPED = 1,
  GDN_PACKED_CONTIGUOUS = 2
} gdn_packed_order_t;

/* How the state decays (gdn_config_t.gate_mode; docs/op.md "Gate modes"). With x the raw gate
 * plus dt_bias and e = exp(A_log[head]), the log-decay is g = -e*softplus(x), or with
 * cfg->gate_lower_bound = lb < 0, g = lb*sigmoid(e*x) (in [lb, 0]: the decay never reaches 0).
 *  HEAD:    the gated delta rule of Qwen3-Next / Qwen3.5 (GDN): one g per v-head and token;
 *           a, b [rows, HV], dt_bias [HV], g [rows, HV].
 *  CHANNEL: Kimi Delta Attention (KDA, Kimi Linear): one g per key channel, v-head and token,
 *           S = Diag(exp(g)) S before each update; needs num_v_heads == num_k_heads and unpacked
 *           inputs. a [rows, HV*K] (the raw gate, head-major), b [rows, HV], dt_bias [HV*K],
 *           g [rows, HV*K]; A_log [HV] in both modes. */
typedef enum gdn_gate_mode {
  GDN_GATE_HEAD = 0,
  GDN_GATE_CHANNEL = 1
} gdn_gate_mode_t;

/* The fused gated RMSNorm's gate (gdn_config_t.out_gate): o = rmsnorm(o)*w*act(z). */
typedef enum gdn_out_gate {
  GDN_OUT_GATE_SILU = 0,    /* Qwen3-Next / Qwen3.5 */
  GDN_OUT_GATE_SIGMOID = 1  /* Kimi Linear          */
} gdn_out_gate_t;

/* Tokens per chunk of the chunked (WY/UT) prefill form; checkpoint_interval is a multiple of it. */
#define GDN_CHUNK_SIZE 64

/* How the chunked prefill computes its dense products (gdn_config_t.prefill_precision; docs/op.md
 * "Prefill precision" says what each setting rounds). The products are those of the chunk form:
 * k k^T, q k^T, W and U (the triangular solve's result times k and v), W S, q S, Aqk u and
 * K^T u (the state update). Decodes, spec decodes and token-recurrent prefills are f32 in every
 * setting.
 *  AUTO: BF16 for bf16 and f16 activations on a device whose matrix engine the library can use
 *        (an Intel GPU's XMX: joint_matrix with the tile shape the device reports); F32 otherwise:
 *        f32 activations, the CPU device (its AMX would take the generic kernels' matrix form; the
 *        CPU kernels have no matrix form), a device without a matrix engine. The default.
 *  F32:  every product in f32 on FMA units.
 *  BF16: every product with bf16 operands and f32 accumulators (FLA's chunk kernels round alike):
 *        A = k k^T and Aqk accumulate in f32, the triangular solve and the carried state are f32,
 *        the state and the solve's result are rounded to bf16 only as operands. Runs on the matrix
 *        engine where the library can use one (XMX; AMX on a CPU device whose compiler targets an
 *        AMX CPU, docs/usage.md), else on FMA units with the same operand rounding. Needs K and V
 *        multiples of 16; other dims take F32.
 * Whether a matrix engine can be used is decided before anything is built, from what the device
 * reports and, on the CPU device, the host CPU (CPUID, XCR0) and the JIT's target
 * (CL_CONFIG_CPU_TARGET_ARCH): a device that cannot take it gets the FMA form, never a failed build.
 * gdn_prefill_path says which form a config takes on a queue. */
typedef enum gdn_prefill_precision {
  GDN_PREFILL_AUTO = 0,
  GDN_PREFILL_F32 = 1,
  GDN_PREFILL_BF16 = 2
} gdn_prefill_precision_t;

/* What runs a prefill's chunk products (gdn_prefill_path). */
typedef enum gdn_prefill_engine {
  GDN_PREFILL_ENGINE_F32 = 0,      /* f32 products on FMA units (GDN_PREFILL_F32, or AUTO resolved so) */
  GDN_PREFILL_ENGINE_XMX = 1,      /* bf16 products on an Intel GPU's XMX (joint_matrix)              */
  GDN_PREFILL_ENGINE_AMX = 2,      /* bf16 products on the CPU's AMX (joint_matrix)                   */
  GDN_PREFILL_ENGINE_EMULATED = 3  /* bf16 operands, f32 accumulators, on FMA units                   */
} gdn_prefill_engine_t;

/* gdn_batch_t.validate */
enum {
  GDN_VALIDATE_FULL = 0,  /* default: also read metadata arrays to the host and check them  */
  GDN_VALIDATE_COUNTS = 1 /* check counts, pointers and config; trust array contents (start   */
                          /* locations clamped, see above); read nothing back, never wait     */
};

/* State caches (ssm_state, conv_state) as engines keep them
 * ----------------------------------------------------------
 * Read and write slots. A sequence reads its initial SSM state and conv history from one slot
 * (its read slot) and writes its states to its write slots, in both caches alike:
 *   non-spec sequence i reads non_spec_read_state_indices[i] (NULL array: non_spec_state_indices[i])
 *     and writes the state after its last token to non_spec_state_indices[i];
 *   spec sequence n (A = num_accepted_tokens[n]) reads spec_read_state_indices[n] (NULL array:
 *     spec_state_indices[n][A-1] for the SSM state and the SNAPSHOT conv window, the line
 *     spec_state_indices[n][0] for the ROLLED conv window) and writes the state after token t to
 *     spec_state_indices[n][t] (ROLLED conv: to its line spec_state_indices[n][0]; the window is
 *     read from columns A-1 .. A+W-3 of the read slot's line, see gdn_conv_spec_layout_t).
 * A read slot is left as it was unless it is also a write slot of the same sequence. Several
 * sequences may read one slot; a slot read by one sequence and written by another in the same call
 * is rejected (GDN_ERROR_DUPLICATE_SLOT: the result would depend on kernel order). With
 * has_initial_state[i] == 0 nothing is read: the sequence starts from zeros.
 * Padding: a state index that equals pad_slot_id or is negative (any value below 0, whatever
 * pad_slot_id is) is padding in every index array -- write, read and checkpoint slots -- under
 * either validation mode: the kernels never read or write a slot for it. So an engine that keeps a
 * null block (vLLM: block 0, NULL_BLOCK_ID, in its padded rows) passes pad_slot_id = 0 and both 0
 * and -1 stay untouched ("pad" below means either).
 * A pad as a non-spec sequence's write slot non_spec_state_indices[i] makes the sequence
 * graph padding: zero outputs, nothing read, nothing written, no checkpoint. A spec sequence's
 * columns are slots of their own: a pad [n][t] is not written, and the ROLLED line [n][0] being
 * pad means zero conv outputs and no conv read or write for the sequence (its SSM state follows
 * the rules here on its own). As an explicitly given read slot a pad means "nothing to
 * read": the sequence starts from zeros and writes as usual. (With spec_read_state_indices NULL a
 * padded spec_state_indices[n][A-1] keeps its version-1 meaning: no SSM state read or written,
 * zero delta-rule outputs.)
 *
 * Block checkpoints (non-spec sequences, when checkpoint_interval = I > 0): token j (0-based within
 * this step) of non-spec sequence i is a boundary when (non_spec_start_pos[i] + j + 1) % I == 0,
 * i.e. the request then holds a multiple of I tokens. At its k-th boundary of the step (k = 0, 1,
 * ...) the sequence stores the SSM state after token j and the conv history after it (the last
 * W-1 inputs up to token j, history before the step included, in columns 0..W-2 as a prefill
 * leaves them) to slot checkpoint_state_indices[i][k]; a pad there = not stored. More
 * boundaries than checkpoint_cols is an error (GDN_ERROR_BAD_COUNT). A checkpoint slot has one
 * writer and one purpose: it may not be another checkpoint, another sequence's read or write
 * slot, or the sequence's own read slot; it may be the sequence's own write slot only when the
 * boundary is the sequence's last token (both then hold the same state). Resuming from a
 * checkpoint (read slot = that slot, start_pos = its position; a spec continuation with A = 1)
 * continues exactly as the unbroken run. Spec sequences store no checkpoints.
 *
 * State dtype (gdn_config_t.state_dtype: F32, BF16, F16, I8 or F8E4M3 for ssm_state; conv_state is
 * always in act_dtype). The math is f32: a state is widened when loaded and rounded to nearest even
 * when stored, once per stored state (each spec write-back, each checkpoint, the final state of a
 * decode or prefill), never per chunk or per token inside a call. F16 states overflow to inf
 * above 65504; BF16 keeps f32's range with 8 significant bits.
 * 8-bit states (I8, F8E4M3) hold codes with one f32 scale per state ROW -- the K values of one v
 * index: a row S[v, :] of the vk layout, a column S[:, v] of kv -- in tensors->ssm_scale,
 * [num_slots, HV, V] f32 with slot stride cfg->ssm_scale_slot_stride (0 = HV*V); value = code x
 * scale. Each store of a row takes a fresh scale from that row's largest magnitude m: scale =
 * m / 127 (I8) or m / 448 (F8E4M3), codes = the row x (127 or 448) / m rounded to int8 or to E4M3
 * (cfg->state_rounding: nearest even, or stochastic), m = 0: scale 0 and zero codes. A row's scale
 * is written with its codes and read with them: a pad slot's neither. Replay mode
 * (cfg->replay_tokens > 0) takes no 8-bit state (GDN_ERROR_UNSUPPORTED). */

/* Replay mode ("lazy commit" spec decoding: cfg->replay_tokens > 0; docs/op.md "Replay mode")
 * -------------------------------------------------------------------------------------------
 * A spec sequence keeps ONE ssm slot, c = spec_state_indices[n][0], holding its COMMITTED state
 * (the state before the tokens of its last step), and in that slot's ring the inputs of the last
 * step's tokens. A step writes the state once instead of once per token:
 *   1. the read slot r (spec_read_state_indices[n], NULL array: c) holds R = replay_count[r] ring
 *      entries. R > 0: the first A = num_accepted_tokens[n] of them (A <= R, else
 *      GDN_ERROR_BAD_ACCEPTED under GDN_VALIDATE_FULL) are replayed onto r's state, with the
 *      arithmetic of the per-token mode's walk over R tokens, and the result -- exactly the state
 *      the per-token mode stores to its column A-1 -- is written to c. R = 0: r's state is current
 *      (A is checked as in the per-token mode but not used); it is copied to c when r != c (zeros
 *      when r is a pad).
 *   2. this step's tokens walk from c's state in registers: outputs only, no state stored; their
 *      inputs go to c's ring, entries 0 .. len-1, and replay_count[c] = len.
 * Columns [n][1..] of spec_state_indices are neither read nor written by the delta rule (they are
 * still range- and conflict-checked); a pad c makes the sequence padding (zero outputs,
 * nothing read or written). The conv is unchanged: GDN_CONV_SPEC_ROLLED keeps its meaning, and
 * replay mode requires it (GDN_CONV_SPEC_SNAPSHOT: GDN_ERROR_UNSUPPORTED).
 * Non-spec sequences run as in the per-token mode and set replay_count of their write slot (and
 * of every checkpoint slot they store) to 0. Their read slot must hold no ring entries: checked
 * under GDN_VALIDATE_FULL (GDN_ERROR_BAD_STATE_INDEX, "flush it first"), trusted under COUNTS.
 * The ring entry of one token is gdn_replay_token_floats(cfg) f32 values, in this order:
 * normalized k [H, K], v [HV, V] (the conv output's v, widened to f32), g [HV] (GDN_GATE_CHANNEL:
 * [HV, K]), beta [HV].
 * replay_count is owned by the library: the engine zero-fills it with its caches and never writes
 * it otherwise. A slot's exact state (for a prefix-cache checkpoint, a preemption, or to go back
 * to the per-token mode) is taken with gdn_flush_replay. Spec sequences store no block
 * checkpoints in either mode. */

/* Batch invariance
 * ----------------
 * A sequence's outputs and the states it stores (SSM and conv slots, checkpoints, replay ring)
 * depend on its own tokens, metadata and cache contents, the config and the entry point, and on
 * nothing else in the call: not on the other sequences (how many, which kinds, their lengths and
 * slots), the order of the sequences or of the token rows, graph padding, or the validation mode.
 * Alone or inside any batch it gets the same bits, from the same kernels (the same device and
 * GDN_XPU_GENERIC_KERNELS / GDN_XPU_SOFT_BF16 settings). The one condition: num_prefills counts
 * every non-spec sequence longer than one token (as engines count prefills); a longer "decode"
 * beyond that count takes the token recurrence, which agrees with the chunked form to rounding. */

/* Model dimensions, dtypes and cache layouts: constant for a layer. */
typedef struct gdn_config {
  size_t struct_size;       /* = sizeof(gdn_config_t)                                         */
  int32_t num_k_heads;      /* H: q/k heads (per tensor-parallel rank), 1..1024               */
  int32_t num_v_heads;      /* HV: v heads, 1..4096, a multiple of H (GVA: v-head i uses k-head i/(HV/H)) */
  int32_t head_k_dim;       /* K: 1..256                                                      */
  int32_t head_v_dim;       /* V: 1..256                                                      */
  int32_t conv_width;       /* W: 2..8. conv_dim = 2*H*K + HV*V                               */
  int32_t act_dtype;        /* gdn_dtype_t of mixed_qkv, a, b, z, conv weight/bias/state, out */
  int32_t state_dtype;      /* gdn_dtype_t of ssm_state: F32 (default), BF16, F16, I8, F8E4M3 */
  int32_t ssm_layout;       /* gdn_ssm_layout_t                                               */
  int32_t conv_layout;      /* gdn_conv_layout_t                                              */
  int32_t conv_spec_layout; /* gdn_conv_spec_layout_t                                         */
  int32_t conv_state_len;   /* history columns per conv slot (W-1 .. 2^20; ROLLED: >= W-1+num_spec) */
  int32_t num_slots;        /* slots in conv_state and ssm_state                              */
  int64_t conv_slot_stride; /* elements between conv slots; 0 = conv_dim*conv_state_len       */
  int64_t ssm_slot_stride;  /* elements between ssm slots; 0 = HV*K*V                         */
  float scale;              /* q scale; 0 = 1/sqrt(K)                                         */
  float l2norm_eps;         /* default 1e-6                                                   */
  float norm_eps;           /* eps of the fused gated RMSNorm; default 1e-6                   */
  int32_t flags;            /* GDN_FLAG_* bits                                                */
  /* ---- version 2: packed projections (a version-1 caller gets GDN_PACKED_NONE) ---- */
  int32_t packed_order;     /* gdn_packed_order_t: NONE (default) reads mixed_qkv, a, b, z; else
                               the op reads qkvz and ba in that order (gdn_tensors_t, version 2) */
  /* version 2, replay mode ("Replay mode" above); a version-1 caller gets 0 */
  int32_t replay_tokens;    /* 0: per-token mode. > 0: replay mode, ring entries per slot
                               (>= 1 + batch->num_spec of every call; at most 65)             */
  /* ---- version 3: gate modes (a version-2 caller gets GDN_GATE_HEAD, SILU, 0) ---- */
  int32_t gate_mode;        /* gdn_gate_mode_t                                                */
  int32_t out_gate;         /* gdn_out_gate_t of the fused gated RMSNorm                      */
  float gate_lower_bound;   /* 0: g = -exp(A_log)*softplus(x); < 0 (finite): the lower-bound form
                               g = lb*sigmoid(exp(A_log)*x) (Kimi Linear: -5)                 */
  /* ---- version 4: prefill precision (a version-3 caller gets GDN_PREFILL_AUTO) ---- */
  int32_t prefill_precision; /* gdn_prefill_precision_t of the chunked prefill's products      */
  int32_t reserved1;        /* 0 (version 4 ends past version 3's padded size, 112 bytes on LP64) */
  /* ---- version 5: 8-bit SSM states ("State dtype" above; a version-4 caller gets 0, NEAREST) ---- */
  int64_t ssm_scale_slot_stride; /* f32 elements between ssm_scale slots; 0 = HV*V             */
  int32_t state_rounding;   /* gdn_state_rounding_t of 8-bit state stores (others: NEAREST only) */
  int32_t reserved2;        /* 0                                                              */
} gdn_config_t;

/* One step's mixed batch: prefills + plain decodes (the "non-spec" sequences) and speculative
 * sequences, their tokens packed into num_actual_tokens rows in any interleaving. */
typedef struct gdn_batch {
  size_t struct_size;           /* = sizeof(gdn_batch_t)                                      */
  int32_t num_prefills;         /* non-spec sequences are num_prefills + num_decodes, in any  */
  int32_t num_decodes;          /*   order; a sequence's length comes from its start_loc      */
  int32_t num_spec_decodes;     /* speculative sequences                                      */
  int32_t num_spec;             /* draft tokens per spec sequence at most (S, 0..64); a spec
                                   sequence has 1..1+S tokens                                    */
  int32_t num_actual_tokens;    /* rows of this step (outputs beyond it are never touched)    */
  int32_t non_spec_token_count; /* = non_spec_query_start_loc[num_prefills+num_decodes]       */
  int32_t spec_token_count;     /* = spec_query_start_loc[num_spec_decodes]                   */
  int32_t pad_slot_id;          /* state index meaning "padding: skip" (default -1; any
                                   negative index is padding too: "State caches")           */
  int32_t validate;             /* GDN_VALIDATE_*                                             */
  int32_t reserved0;
  /* [num_prefills+num_decodes+1], int32: compact non-spec token offsets, [0] = 0 */
  const int32_t *non_spec_query_start_loc;
  /* [num_prefills+num_decodes], int32: the one state slot of each non-spec sequence */
  const int32_t *non_spec_state_indices;
  /* [num_prefills+num_decodes], bytes 0/1, or NULL = every sequence has an initial state */
  const uint8_t *has_initial_state;
  /* [non_spec_token_count], int32: global row of the j-th non-spec token; NULL = row j */
  const int32_t *non_spec_token_indx;
  /* [num_spec_decodes+1], int32: compact spec token offsets, [0] = 0 */
  const int32_t *spec_query_start_loc;
  /* [num_spec_decodes, 1+num_spec], int32, row-major: state slot after token t = [n][t] */
  const int32_t *spec_state_indices;
  /* [num_spec_decodes], int32 in [1, 1+num_spec]: tokens accepted last step (incl. bonus).
   * GDN_VALIDATE_FULL refuses other values (GDN_ERROR_BAD_ACCEPTED). Under GDN_VALIDATE_COUNTS
   * every reader -- the conv, the recurrence, the replay -- uses A = the value clamped to
   * [1, 1+num_spec] (0 reads as 1, as vllm-xpu-kernels does), so a bad or padded count indexes
   * its own row of spec_state_indices only and can change nothing but its own sequence's
   * outputs and slots. That value is the A of "State caches" and "Replay mode". */
  const int32_t *num_accepted_tokens;
  /* [spec_token_count], int32: global row of the j-th spec token; NULL = row j */
  const int32_t *spec_token_indx;
  /* ---- version 2: state caches as engines keep them ("State caches" above). A version-1 caller
   *      (struct_size ending after spec_token_indx) gets the defaults: NULL / 0. ---- */
  /* [num_prefills+num_decodes], int32, or NULL = non_spec_state_indices: each non-spec sequence's
   * read slot (initial SSM state and conv history) */
  const int32_t *non_spec_read_state_indices;
  /* [num_spec_decodes], int32, or NULL = spec_state_indices[n][A-1] (SSM, SNAPSHOT conv) and
   * spec_state_indices[n][0] (ROLLED conv line): each spec sequence's read slot */
  const int32_t *spec_read_state_indices;
  /* tokens between checkpoints: 0 = none (default; checkpoint_cols and checkpoint_state_indices
   * are then not read), else a positive multiple of GDN_CHUNK_SIZE */
  int32_t checkpoint_interval;
  /* columns of checkpoint_state_indices, >= 0: the most boundaries a sequence may cross in a call */
  int32_t checkpoint_cols;
  /* [num_prefills+num_decodes], int32 >= 0, or NULL = all 0: tokens of each non-spec sequence's
   * request already in its state before this step (its first token's position in the request).
   * Used only to place block checkpoints, but checked whenever given. */
  const int32_t *non_spec_start_pos;
  /* [num_prefills+num_decodes, checkpoint_cols], int32, row-major: slot of the k-th checkpoint of
   * non-spec sequence i in this step (a pad = not stored); needed when checkpoint_interval
   * > 0 and checkpoint_cols > 0 */
  const int32_t *checkpoint_state_indices;
} gdn_batch_t;

/* Arrays of one call. Row strides are in elements; 0 means dense. Which fields an entry point
 * reads or writes is listed at the entry point. */
typedef struct gdn_tensors {
  size_t struct_size;          /* = sizeof(gdn_tensors_t)                                    */
  const void *mixed_qkv;       /* [rows, conv_dim] act: q|k|v columns, k-head-major in each   */
  int64_t mixed_qkv_stride;    /*   row stride (0 = conv_dim)                                 */
  const void *conv_weight;     /* [conv_dim, W] act                                           */
  const void *conv_bias;       /* [conv_dim] act, or NULL                                     */
  void *conv_state;            /* conv cache, layout gdn_config_t.conv_layout, act dtype       */
  void *conv_out;              /* [rows, conv_dim] act: conv output (q|k|v after conv+SiLU)    */
  int64_t conv_out_stride;     /*   row stride (0 = conv_dim)                                 */
  const void *a;               /* [rows, HV] act: dt logits (GDN_GATE_CHANNEL: [rows, HV*K])   */
  const void *b;               /* [rows, HV] act: beta logits                                 */
  int64_t ab_stride;           /*   row stride of a, and of b unless b_stride (0 = a's width) */
  const float *A_log;          /* [HV] f32                                                    */
  const void *dt_bias;         /* [HV] (GDN_GATE_CHANNEL: [HV*K]), f32 or act: dt_bias_dtype  */
  const float *g;              /* [rows, HV] f32 log-decay (GDN_GATE_CHANNEL: [rows, HV*K]); with
                                  beta replaces a/b/A_log/dt_bias                              */
  const float *beta;           /* [rows, HV] f32 in [0,1]                                     */
  void *ssm_state;             /* state_dtype, layout gdn_config_t.ssm_layout                 */
  void *core_attn_out;         /* [rows, HV, V] act                                           */
  int64_t out_stride;          /*   row stride (0 = HV*V)                                     */
  const void *z;               /* [rows, HV, V] act, or NULL: fused o = rmsnorm(o)*w*act(z), act
                                  cfg->out_gate (silu by default)                              */
  int64_t z_stride;            /*   row stride (0 = HV*V)                                     */
  const void *norm_weight;     /* [V] act, needed with z                                      */
  void *workspace;             /* device USM scratch or NULL (library allocates and caches)   */
  size_t workspace_bytes;      /*   size of workspace; see gdn_attention_workspace_size        */
  /* ---- version 2: packed projections, read when cfg->packed_order != GDN_PACKED_NONE (then
   *      mixed_qkv, a, b and z must be NULL: GDN_ERROR_BAD_LAYOUT naming them); with
   *      GDN_PACKED_NONE qkvz, ba and z_out must be NULL. A version-1 caller gets NULL / 0. ---- */
  const void *qkvz;            /* [rows, 2*H*K + 2*HV*V] act: q|k|v|z in cfg->packed_order; the
                                  conv reads its q|k|v columns, the fused norm (norm_weight given)
                                  its z columns                                                 */
  int64_t qkvz_stride;         /*   row stride (0 = 2*H*K + 2*HV*V)                             */
  const void *ba;              /* [rows, 2*HV] act: b|a in cfg->packed_order (gates; unless g/beta) */
  int64_t ba_stride;           /*   row stride (0 = 2*HV)                                       */
  void *z_out;                 /* [rows, HV, V] act, or NULL: the conv copies each addressed row's
                                  z columns here (the caller's gated norm: vllm-xpu-kernels' z)  */
  int64_t z_out_stride;        /*   row stride (0 = HV*V)                                       */
  /* version 2, replay mode ("Replay mode" above): needed by the delta rule when
   * cfg->replay_tokens > 0, not read otherwise */
  float *replay_ring;          /* [num_slots, replay_tokens, gdn_replay_token_floats] f32     */
  int32_t *replay_count;       /* [num_slots] int32: ring entries each slot holds (library-owned) */
  /* ---- version 3 (a version-2 caller gets 0) ---- */
  int64_t b_stride;            /* row stride of b; 0 = ab_stride as given (HV when that is 0 too):
                                  with GDN_GATE_CHANNEL a is HV*K wide and b HV wide           */
  /* ---- version 4 (a version-3 caller gets 0) ---- */
  int32_t dt_bias_dtype;       /* gdn_dtype_t of dt_bias: 0 or GDN_DTYPE_F32 (f32), or cfg->act_dtype
                                  (vLLM keeps dt_bias in the model's dtype, as vllm-xpu-kernels
                                  takes it); any other value: GDN_ERROR_BAD_DTYPE. The kernels read
                                  it where they read the gates: no conversion launch             */
  /* ---- version 5 (a version-4 caller gets NULL) ---- */
  float *ssm_scale;            /* [num_slots, HV, V] f32, slot stride cfg->ssm_scale_slot_stride:
                                  the scales of an I8 / F8E4M3 ssm_state (read and written with
                                  it); NULL with other state dtypes                            */
} gdn_tensors_t;

/* ---- library information ---- */
GDN_API const char *gdn_version(void);          /* "MAJOR.MINOR.PATCH"                     */
GDN_API int32_t gdn_abi_version(void);          /* GDN_ABI_VERSION the library was built with */
GDN_API const char *gdn_status_string(gdn_status_t status); /* static text; "unknown status" else */
GDN_API const char *gdn_last_error(void);       /* thread-local detail of the last failure  */
GDN_API size_t gdn_sizeof_config(void);         /* the library's sizeof(gdn_config_t) etc.:  */
GDN_API size_t gdn_sizeof_batch(void);          /*   lets bindings check their struct layout */
GDN_API size_t gdn_sizeof_tensors(void);

/* Defaults: struct_size set, pad_slot_id = -1, layouts 0, l2norm_eps = norm_eps = 1e-6,
 * state_dtype = F32, act_dtype = BF16, everything else 0/NULL. Layouts 0 are GDN_SSM_KV,
 * GDN_CONV_DIM_MAJOR and GDN_CONV_SPEC_SNAPSHOT; pygdn.Config defaults to vk / time_major /
 * rolled instead (vLLM >= 0.34's caches): set them explicitly when moving between the two. */
GDN_API void gdn_config_init(gdn_config_t *cfg);
GDN_API void gdn_batch_init(gdn_batch_t *batch);
GDN_API void gdn_tensors_init(gdn_tensors_t *t);

/* Compile (or fetch from the caches) every kernel the config needs on the queue's device, so
 * the first real call does not pay for it. Optional. Here and in a call that compiles, the builds
 * run side by side on threads the library starts and joins before returning (up to the CPUs the
 * process may use, at most 4). */
GDN_API gdn_status_t gdn_warmup(void *queue, const gdn_config_t *cfg);

/* ---- causal_conv1d: depthwise causal conv over time + optional SiLU ----
 * Reads  mixed_qkv (packed: qkvz), conv_weight, conv_bias, conv_state (initial windows).
 * Writes conv_out at each addressed row (zeros for rows of padded sequences), conv_state; packed,
 *        z_out if given (every addressed row, padded sequences' too: a copy of its z columns).
 * Non-spec sequence i: history = columns 0..W-2 of its read slot (zeros when has_initial_state[i]
 * == 0); afterwards its write slot non_spec_state_indices[i] holds its last W-1 inputs (older
 * history shifted in when the sequence is shorter than W-1), and each checkpoint slot the history
 * at its boundary. Spec sequences: see gdn_conv_spec_layout_t and "State caches". */
GDN_API gdn_status_t gdn_causal_conv1d(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch,
                                       const gdn_tensors_t *t);

/* ---- gated delta rule on conv output ----
 * Reads  conv_out (q|k|v per row), a/b (packed: ba) + A_log/dt_bias (or g/beta), ssm_state.
 * Writes core_attn_out at each addressed row (zeros for padded sequences), ssm_state.
 * Per v-head with state S [K,V] f32:  S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q
 * (GDN_GATE_CHANNEL: S = Diag(exp(g)) S, g [K] per v-head and token)
 * with q,k l2-normalized (unless GDN_FLAG_NO_QK_L2NORM) and q scaled by cfg->scale (always; set
 * scale = 1 for none). Non-spec sequences of length > 1 use the chunked (GDN_CHUNK_SIZE) form,
 * up to num_prefills of them (the first in sequence order; any others, and all of them with
 * GDN_FLAG_FORCE_RECURRENT, run the token recurrence, which agrees to rounding). Initial
 * states come from the read slots, final states go to the write slots, spec sequence n writes
 * the state after token t to spec_state_indices[n][t], checkpoints as in "State caches".
 * Non-finite gates (docs/op.md "Non-finite gates"): g = -exp(A_log)*softplus(a + dt_bias) is the value
 * of that product however large or small its factors (taken in log space when one is not a normal
 * f32 number): -inf when it overflows (a = +inf, a >= ~1e38, A_log >= ~89), 0 when a factor is
 * exactly 0 (A_log = -inf or a + dt_bias = -inf) -- never 0*inf. A token whose decay exp(g) is 0
 * (g = -inf, given or computed) resets the state before its update: S = 0*S, on every path (the
 * chunked form gives the recurrence's finite result). NaN inputs make NaN only in their own
 * sequence and its slots. */
GDN_API gdn_status_t gdn_gated_delta_rule(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch,
                                          const gdn_tensors_t *t);

/* ---- the whole op: causal_conv1d -> gated delta rule (-> gated RMSNorm when z != NULL) ----
 * Reads mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, z, norm_weight, caches.
 * Writes core_attn_out, conv_state, ssm_state; conv_out if given (else it lives in workspace).
 * Packed (cfg->packed_order != NONE): reads qkvz and ba instead of mixed_qkv, a, b; the gated
 * RMSNorm runs when norm_weight is given, on qkvz's z columns; z_out as in gdn_causal_conv1d. */
GDN_API gdn_status_t gdn_attention(void *queue, const gdn_config_t *cfg, const gdn_batch_t *batch,
                                   const gdn_tensors_t *t);

/* Bytes of workspace a gdn_attention call with this config and these batch counts uses when it
 * is given no conv_out (the most any of the three ops uses). Computed by the same plan the call
 * runs, from the counts alone (checkpoint_interval > 0 counts: its prefill chunks are aligned to
 * the request's positions, one more chunk per prefill): the metadata arrays are not read. It
 * includes some slack: the call aligns its scratch arrays within any workspace (which itself need
 * only be 4-byte aligned). */
GDN_API gdn_status_t gdn_attention_workspace_size(const gdn_config_t *cfg, const gdn_batch_t *batch,
                                                  size_t *bytes);

/* How many elements a call reads of each metadata array of gdn_batch_t, from batch's counts alone
 * (the arrays are not read; the counts are checked as a call checks them): elements[i] for the
 * i-th pointer field of gdn_batch_t in declaration order (non_spec_query_start_loc first), for the
 * first min(capacity, the library's number of such fields) of them. An array of a group without
 * sequences, or checkpoint_state_indices without checkpoints, reads 0. A call refuses a given
 * array whose allocation holds fewer elements (GDN_ERROR_BAD_POINTER, naming it). */
GDN_API gdn_status_t gdn_batch_array_elements(const gdn_batch_t *batch, int64_t *elements, int32_t capacity);

/* ---- helpers for C programs that have no SYCL runtime of their own ----
 * gdn_queue_create: a new in-order sycl::queue on "default", "cpu" or "gpu"; free it with
 * gdn_queue_destroy. gdn_malloc_shared / gdn_free: USM shared memory of that queue. */
GDN_API gdn_status_t gdn_queue_create(const char *device, void **queue);
GDN_API void gdn_queue_destroy(void *queue);
GDN_API gdn_status_t gdn_queue_wait(void *queue);
GDN_API gdn_status_t gdn_malloc_shared(void *queue, size_t bytes, void **ptr);
GDN_API void gdn_free(void *queue, void *ptr);
/* Name of the queue's device, written into buf (truncated to len-1 characters). */
GDN_API gdn_status_t gdn_device_name(void *queue, char *buf, size_t len);

/* The path a prefill with this config takes on the queue's device, decided as a call decides it
 * (cfg->prefill_precision, the activation dtype, K and V, the device's matrix engine and whether
 * the library can use it; GDN_XPU_GENERIC_KERNELS): *engine gets a gdn_prefill_engine_t, buf a
 * text naming the path and why (e.g. "bf16 operands on XMX (joint_matrix 8x16x16, sub-group 16)";
 * truncated to len-1 characters). engine or buf may be NULL (len is then not read). Builds and
 * runs nothing. GDN_FLAG_FORCE_RECURRENT configs report the f32 path (no chunk kernels). */
GDN_API gdn_status_t gdn_prefill_path(void *queue, const gdn_config_t *cfg, int32_t *engine, char *buf, size_t len);

/* ---- replay mode ("Replay mode" above) ----
 * gdn_replay_token_floats: f32 values of one ring entry, H*K + HV*V + HV*G + HV (G = 1, or K
 * with GDN_GATE_CHANNEL), from the dims and gate mode alone
 * (0 when one is outside its range or cfg is NULL). A slot's ring is replay_tokens of them.
 * gdn_flush_replay: for i < num_flush, replays the first num_tokens[i] ring entries of slot
 * slots[i] onto its state (0 <= num_tokens[i] <= replay_count[slots[i]]: typically the accepted
 * count of the slot's last step; with replay_count[slots[i]] = 0 the state is current and
 * num_tokens[i] >= 0 is not used) and sets replay_count[slots[i]] = 0; -1 entries are skipped.
 * The slot then holds the state the per-token mode would have stored to column num_tokens[i]-1
 * (num_tokens[i] = 0: the committed state, the ring dropped). Reads and writes
 * ssm_state, replay_ring and replay_count only (slots and num_tokens int32 [num_flush]); always
 * reads slots, num_tokens and the addressed counts back to check them (slots in range, distinct).
 * Needs cfg->replay_tokens > 0. */
GDN_API int32_t gdn_replay_token_floats(const gdn_config_t *cfg);
GDN_API gdn_status_t gdn_flush_replay(void *queue, const gdn_config_t *cfg, int32_t num_flush, const int32_t *slots,
                                      const int32_t *num_tokens, void *ssm_state, float *replay_ring,
                                      int32_t *replay_count);

/* Graphs: a step recorded once, replayed
 * --------------------------------------
 * A step's calls can be recorded into a SYCL command graph (sycl_ext_oneapi_graph, queue
 * recording; Level Zero GPUs report sycl::aspect::ext_oneapi_graph, the SYCL CPU device
 * ext_oneapi_limited_graph) and the graph replayed: the recorded kernels run again, with no host
 * work. Record with gdn_graph_begin / gdn_graph_end below, with the caller's own command_graph
 * (begin_recording on the queue), or with torch-XPU's graph capture (pygdn's calls on torch's
 * stream with DLPack tensors, docs/usage.md "Graphs").
 * Recordable: gdn_attention, gdn_causal_conv1d and gdn_gated_delta_rule with batch->validate =
 *   GDN_VALIDATE_COUNTS on an in-order queue, whatever the batch holds (prefills, decodes, spec
 *   sequences, graph padding, read slots, checkpoints, replay mode): such a call reads nothing back
 *   and waits for nothing. gdn_warmup and gdn_attention_workspace_size submit nothing.
 * Fixed by the recording: the config; the batch's counts and settings (its int fields) and which
 *   of its arrays are given; every array's address and stride (tensors, metadata arrays,
 *   workspace); the kernels (built for the device and GDN_XPU_GENERIC_KERNELS / GDN_XPU_SOFT_BF16
 *   as read while recording). The caller keeps every array allocated at its address as long as
 *   the graph may be replayed.
 * Free to change between replays: the contents of every array -- inputs, weights, caches, ring
 *   counts, and the metadata arrays (start locations, slots, token rows, num_accepted_tokens,
 *   has_initial_state, read and checkpoint slots, start positions) within the recorded counts. A
 *   replay computes bit for bit what an eager call with that config, those counts and the arrays'
 *   contents at the replay computes. Nothing checks the contents at a replay: they must be valid
 *   as under GDN_VALIDATE_COUNTS (start locations are clamped as in any such call). Graph
 *   padding: record at the padded counts and give padded sequences a pad (pad_slot_id or -1).
 * Workspace: a call given tensors->workspace records that buffer; keep it for the graph and out of
 *   other work that may run at the same time. Without it the call records the library's workspace
 *   of the queue, which then stays at its address: a later call that needs more gets another
 *   buffer beside it, and gdn_release_caches() frees both (destroy such graphs before it). Replay
 *   such a graph on its recording queue (or while no call runs on that queue): replays and calls
 *   running at the same time would share that scratch.
 * Kernels are built (or loaded from the disk cache) when a call is recorded, never at a replay;
 *   gdn_warmup first keeps the recording short.
 * Not recordable, refused with GDN_ERROR_UNSUPPORTED before anything is recorded: a call with
 *   GDN_VALIDATE_FULL (it reads the metadata back at the call: recorded, it would have checked the
 *   contents at recording only); a call on an out-of-order queue (it waits for its last kernel);
 *   gdn_flush_replay (it reads its slots, num_tokens and replay_count back). gdn_queue_wait on a
 *   recording queue is a SYCL error (GDN_ERROR_DEVICE); GDN_XPU_PROFILE's waits are skipped.
 * Everything else submitted to a recording queue is recorded too: a copy from host memory, for
 * one, copies from that memory again at every replay.
 *
 * The gdn_graph_* functions are for callers without SYCL objects of their own (C programs,
 * Python with dpctl: pygdn.Graph); a SYCL program records with its own command_graph.
 * gdn_graph_begin: a new graph recording the in-order queue: from now on every command submitted
 *   to it -- the library's calls and anything else (copies of a step's inputs, ...) -- is recorded,
 *   not run, until gdn_graph_end. GDN_ERROR_UNSUPPORTED when the device has neither
 *   sycl::aspect::ext_oneapi_graph nor ext_oneapi_limited_graph, or the queue is out of order or
 *   recording already.
 * gdn_graph_end: ends the recording and makes the graph replayable (command_graph::finalize).
 * gdn_graph_replay: runs the recorded commands on the in-order queue (the recording queue, or
 *   another of its context and device) after the work already on it, and returns without waiting.
 * gdn_graph_destroy: frees the graph (ending its recording if still open); after its replays.
 * gdn_queue_recording: 1 when the queue records into a graph (any: gdn_graph_begin's, the caller's
 *   own, torch's), else 0 (also for NULL). A binding that waits after a call asks it first. */
typedef struct gdn_graph gdn_graph_t;
GDN_API gdn_status_t gdn_graph_begin(void *queue, gdn_graph_t **graph);
GDN_API gdn_status_t gdn_graph_end(gdn_graph_t *graph);
GDN_API gdn_status_t gdn_graph_replay(void *queue, const gdn_graph_t *graph);
GDN_API void gdn_graph_destroy(gdn_graph_t *graph);
GDN_API int32_t gdn_queue_recording(void *queue);

/* Drop cached kernels and workspaces (e.g. before unloading). Kernels on disk stay cached. The
 * library keeps one workspace per queue it was called on without tensors->workspace, grown to the
 * largest call (and the smaller buffers a recorded call holds, "Graphs"), until this is called.
 * Safe while calls run on other threads: a workspace in use is freed when its call returns, after
 * waiting for its kernels. */
GDN_API void gdn_release_caches(void);

/* GDN_CDEF_END */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GDN_XPU_H */
