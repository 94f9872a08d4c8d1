"""What pygdn's two vLLM bindings share: torch dtypes by pygdn name, the process's SYCL CPU queue
for torch CPU tensors, vLLM's conventions (its null block, its conv-state layout), a layer's prepared
call (weights and caches bound once, the step's arrays rebound at every call) and the bounded stores
of prepared layers and step batches. Imports torch nowhere: it works on the tensors it is given."""
from __future__ import annotations

_TORCH_DTYPES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16"}
_cpu_queue = []
_vllm = {}  # what the installed vLLM says, imported once (vllm_conventions)


def vllm_conventions():
    """(null block id, conv layout) of the installed vLLM: the pad value of its state indices
    (NULL_BLOCK_ID, vllm/v1/attention/backends/utils.py: the block its metadata builder writes into
    padded rows, gdn_attn.py) and pygdn's name of the conv-state layout it allocates now
    (is_conv_state_dim_first(), vllm/model_executor/layers/mamba/mamba_utils.py, which follows
    VLLM_SSM_CONV_STATE_LAYOUT: "DS" is "dim_major", "SD", its default, "time_major"). Without vLLM
    (or a vLLM without them): 0, vLLM 0.32's null block, and "time_major", vLLM's default layout and
    the one vllm-xpu-kernels takes."""
    if not _vllm:
        try:
            from vllm.v1.attention.backends.utils import NULL_BLOCK_ID as null
        except ImportError:
            null = 0
        try:
            from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first as dim_first
        except ImportError:
            dim_first = None
        _vllm.update(null=int(null), dim_first=dim_first)
    dim_first = _vllm["dim_first"]
    return _vllm["null"], "dim_major" if dim_first is not None and dim_first() else "time_major"


# Why the vLLM bindings take no 8-bit SSM cache (pygdn's own calls do: Config(state_dtype="i8" or "f8e4m3")).
STATE_8BIT_REFUSED = ("an 8-bit SSM cache needs one f32 scale per state row beside it (ssm_scale [slots, HV, V], "
                      "updated with the state), and vLLM passes none to this op (vLLM #52962 proposes such a cache): "
                      "serve with a float32, float16 or bfloat16 mamba_ssm_cache_dtype")


def state_8bit(dtype):
    """Whether a torch dtype is one of the 8-bit state dtypes the library has (int8, float8 e4m3)."""
    return str(dtype) in ("torch.int8", "torch.float8_e4m3fn")


def dtype_name(dtype):
    """pygdn's name of a torch dtype ("f32", "f16", "bf16"), None for the others."""
    return _TORCH_DTYPES.get(str(dtype))


def cpu_queue():
    """The process's one in-order queue on the SYCL CPU device for torch CPU tensors."""
    if not _cpu_queue:
        import dpctl
        _cpu_queue.append(dpctl.SyclQueue("cpu", property="in_order"))
    return _cpu_queue[0]


def prepare_layer(queue, cfg, step_arrays, **bound):
    """A layer's pygdn.attention call, prepared: bound's arrays (weights, caches; None for an absent
    one) by their memory (detached: parameters export through DLPack only without autograd), and
    step_arrays (the step's activations and outputs, each call rebinds them) as empty placeholders of
    their dtypes and widths, so nothing of a step is held. The batch is each call's too."""
    import pygdn
    empty = {name: t.detach().new_empty((0, *t.shape[1:])) for name, t in step_arrays.items()}
    held = {name: None if t is None else t.detach() for name, t in bound.items()}
    return pygdn.prepare(pygdn.attention, queue, cfg, pygdn.Batch(num_actual_tokens=0, validate="counts"),
                         **empty, **held)


def remember(store: dict, key, value, limit: int):
    """store[key] = value, the oldest entry dropped first when store holds limit of them. Returns value."""
    if len(store) >= limit:
        del store[next(iter(store))]
    store[key] = value
    return value
