"""Frameworks that speak DLPack, not __sycl_usm_array_interface__ (torch XPU, JAX), and foreign
queues: a DLPack-only producer (made here with ctypes around pygdn.UsmArray memory, versioned and
legacy capsules, a deleter that counts its calls) gives bit-for-bit the results of the SUAI path;
each capsule's deleter runs exactly once, also when the call fails; a queue passed as a
sycl::queue* int or as a "SyclQueueRef" capsule works; host (kDLCPU) tensors are refused by name where the
device cannot address host memory.
Tiny f32 shapes (the kernels of test_prepared_call.py)."""
import ctypes
import gc
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import dpctl
import pygdn
from pygdn.batch import make_batch, to_device
from helpers import EditedSUAI, usm

H, HV, K, V, W, S, SLOTS = 1, 2, 16, 16, 4, 2, 16
KDL_CPU, KDL_ONEAPI = 1, 14


# ----------------------------------------------------------------------------- a DLPack-only producer
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


LIVE = {}           # struct address -> (capsule number, what the tensor keeps alive until its deleter runs)
DELETER_CALLS = {}  # capsule number -> calls of its deleter (addresses are reused once a tensor is freed)
DEAD_CALLS = []     # deleter calls on an address with no live tensor: a second call, a double free


@DELETER
def _deleter(address):
    entry = LIVE.pop(address, None)
    if entry is None:
        DEAD_CALLS.append(address)
    else:
        DELETER_CALLS[entry[0]] = DELETER_CALLS.get(entry[0], 0) + 1


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
CAPSULE_NUMBERS = itertools.count()
VERSIONED, LEGACY = b"dltensor_versioned", b"dltensor"  # (a capsule keeps a pointer to its name)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    """The protocol's producer side: a capsule nobody consumed frees its tensor itself."""
    name = _capsule_name(capsule)
    if name in (VERSIONED, LEGACY):
        _deleter(_capsule_pointer(capsule, name))


class DLPackOnly:
    """USM memory exported only through __dlpack__ / __dlpack_device__, like a torch XPU tensor.
    versioned: answers max_version=(1, 0) with a 'dltensor_versioned' capsule; else a producer
    from before DLPack 1.0 (no max_version argument, 'dltensor'). The data pointer is the
    allocation's start and byte_offset says where the array begins (a pad of `offset` elements).
    flags: the versioned capsule's flags (1 = READ_ONLY, 2 = IS_COPIED)."""

    def __init__(self, host, queue, versioned=True, offset=3, code=None, device_type=KDL_ONEAPI, strides=None,
                 flags=0):
        host = np.ascontiguousarray(host)
        flat = np.concatenate([np.zeros(offset, host.dtype), host.reshape(-1)])
        self.base = pygdn.UsmArray.from_numpy(flat, queue)
        self.shape, self.dtype, self.offset, self.versioned = host.shape, host.dtype, offset, versioned
        self.code = code if code is not None else {"f": 2, "i": 0, "u": 1, "b": 6}[host.dtype.kind]
        self.device = (device_type, queue.sycl_device.get_device_id())
        self.strides, self.flags = strides, flags
        self.capsules = []  # numbers of the capsules handed out

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if not self.versioned and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        versioned = max_version is not None and max_version[0] >= 1
        m = DLManagedTensorVersioned(major=1, minor=0, flags=self.flags) if versioned else DLManagedTensor()
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * len(self.strides))(*self.strides)
        t = m.dl_tensor
        t.data, t.device = self.base.memory._pointer, DLDevice(*self.device)
        t.ndim, t.dtype = len(self.shape), DLDataType(self.code, self.dtype.itemsize * 8, 1)
        t.shape = shape
        if strides is not None:
            t.strides = strides
        t.byte_offset = self.offset * self.dtype.itemsize
        m.deleter = _deleter
        address, number = ctypes.addressof(m), next(CAPSULE_NUMBERS)
        LIVE[address] = (number, m, shape, strides, self.base)
        self.capsules.append(number)
        return _capsule_new(address, VERSIONED if versioned else LEGACY,
                            ctypes.cast(_capsule_destructor, ctypes.c_void_p))

    def to_numpy(self):
        return self.base.to_numpy()[self.offset:].reshape(self.shape)


def assert_each_capsule_freed_once(producers):
    gc.collect()
    for p in producers:
        assert p.capsules, "pygdn never asked for a capsule"
        calls = [DELETER_CALLS.get(n, 0) for n in p.capsules]
        assert calls == [1] * len(calls), f"deleter calls per capsule: {calls}"
    assert not DEAD_CALLS, "a deleter ran twice"


# ----------------------------------------------------------------------------- one call, two ways
def make_call(seed):
    """Host data of one mixed step (prefill, decodes, spec sequences) and its config."""
    rng = np.random.default_rng(seed)
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=SLOTS, conv_width=W,
                       conv_state_len=W - 1 + S, act_dtype="f32", ssm_layout="vk", conv_layout="time_major",
                       conv_spec_layout="rolled")
    meta = make_batch(rng, num_slots=SLOTS, prefill_lens=[5], num_decodes=2, spec_lens=[3, 2], num_spec=S)
    T, C = meta["num_actual_tokens"], cfg.conv_dim
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    arrays = dict(mixed_qkv=f(T, C), a=f(T, HV), b=f(T, HV), conv_weight=f(C, W) * 0.5, conv_bias=f(C) * 0.1,
                  A_log=np.log(rng.uniform(0.5, 8.0, HV)).astype(np.float32), dt_bias=f(HV),
                  conv_state=f(*cfg.conv_state_shape), ssm_state=f(*cfg.ssm_state_shape) * 0.5,
                  core_attn_out=np.zeros((T, HV, V), np.float32), z=f(T, HV, V), norm_weight=f(V))
    return cfg, meta, arrays


def run(queue_arg, queue, cfg, meta, arrays, wrap=None):
    """pygdn.attention with every array (batch metadata too) made by wrap(host) (default: SUAI);
    returns the written arrays as numpy, and the producers."""
    wrap = wrap or (lambda host: usm(queue, host))
    dev = {k: wrap(v) for k, v in arrays.items()}
    batch = to_device(meta, queue)
    for field in pygdn.batch.BATCH_ARRAYS:
        if meta.get(field) is not None:
            setattr(batch, field, wrap(np.asarray(meta[field])))
    pygdn.attention(queue_arg, cfg, batch, **dev)
    out = {k: dev[k].to_numpy() for k in ("core_attn_out", "conv_state", "ssm_state")}
    producers = [p for p in list(dev.values()) + [getattr(batch, f) for f in pygdn.batch.BATCH_ARRAYS]
                 if isinstance(p, DLPackOnly)]
    return out, producers


@pytest.mark.parametrize("versioned", [True, False], ids=["dltensor_versioned", "dltensor"])
def test_dlpack_only_arrays_equal_the_suai_path(queue, versioned):
    cfg, meta, arrays = make_call(1)
    want, _ = run(queue, queue, cfg, meta, arrays)
    # Legacy producers give no strides (NULL = C order); versioned ones give them explicitly.
    wrap = lambda host: DLPackOnly(host, queue, versioned=versioned,  # noqa: E731
                                   strides=None if not versioned else np.array(host.strides) // host.itemsize)
    got, producers = run(queue, queue, cfg, meta, arrays, wrap)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    assert len(producers) == len(arrays) + sum(meta.get(f) is not None for f in pygdn.batch.BATCH_ARRAYS)
    assert_each_capsule_freed_once(producers)


@pytest.mark.parametrize("form", ["int", "numpy_int", "capsule"])
def test_foreign_queue_forms(queue, form):
    """The sycl::queue* as an int (torch.xpu.current_stream().sycl_queue) or as a SyclQueueRef
    capsule; the arrays say they belong to `queue` (SUAI), the same queue."""
    cfg, meta, arrays = make_call(2)
    want, _ = run(queue, queue, cfg, meta, arrays)
    queue_arg = {"int": queue.addressof_ref, "numpy_int": lambda: np.uint64(queue.addressof_ref()),
                 "capsule": queue._get_capsule}[form]()
    got, _ = run(queue_arg, queue, cfg, meta, arrays)
    for k in want:
        assert np.array_equal(got[k], want[k]), k


WARMUP_WITH_QUEUE_FORMS = """
import sys
import dpctl, pygdn
from helpers import default_queue
q = default_queue()
cfg = pygdn.Config(num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4, num_slots=4, act_dtype="f32")
for form in ("int", "capsule"):
    pygdn.warmup(q.addressof_ref() if form == "int" else q._get_capsule(), cfg)
print("warmed up")
"""


def test_warmup_with_foreign_queue_forms():
    """pygdn.warmup() with the queue as an int or a capsule: the dpctl copy made of it must live
    through the C call (freed before it, the call faults). In a child process, so a crash fails here."""
    run = subprocess.run([sys.executable, "-c", WARMUP_WITH_QUEUE_FORMS], capture_output=True, text=True,
                         timeout=900, cwd=os.path.dirname(os.path.abspath(__file__)), env=dict(os.environ))
    assert run.returncode == 0 and "warmed up" in run.stdout, (run.returncode, run.stdout + run.stderr[-3000:])


def test_prepared_call_with_dlpack_and_int_queue(queue):
    """prepare() consumes every capsule once; they are freed when the prepared call goes."""
    cfg, meta, arrays = make_call(3)
    want, _ = run(queue, queue, cfg, meta, arrays)
    dev = {k: DLPackOnly(v, queue) for k, v in arrays.items()}
    step = pygdn.prepare(pygdn.attention, queue.addressof_ref(), cfg, to_device(meta, queue), **dev)
    assert all(DELETER_CALLS.get(n, 0) == 0 for p in dev.values() for n in p.capsules), "freed while bound"
    step()
    for k in want:
        assert np.array_equal(dev[k].to_numpy(), want[k]), k
    del step
    assert_each_capsule_freed_once(dev.values())


def test_recorded_call_with_dlpack_tensors_and_an_int_queue(queue):
    """Graph capture as torch-XPU's does it: the call on the stream's queue (an int) with DLPack
    tensors and validate="counts", recorded (here by pygdn.Graph; torch: XPUGraph), then replayed
    after every array's contents changed: it computes what an eager call on the new contents does.
    Each capsule is released when the recorded call returns; the producer keeps the memory (as a
    captured torch tensor does) for the replays."""
    cfg, meta, arrays = make_call(6)
    dev = {k: DLPackOnly(v, queue) for k, v in arrays.items()}
    batch = to_device(meta, queue, validate="counts")  # (before: a copy to the queue would be recorded too)
    with pygdn.Graph(queue) as graph:
        pygdn.attention(queue.addressof_ref(), cfg, batch, **dev)
    assert_each_capsule_freed_once(dev.values())
    _, _, new = make_call(7)  # other contents, the same shapes
    for k, p in dev.items():
        p.base.copy_from(np.concatenate([np.zeros(p.offset, p.dtype), new[k].reshape(-1)]))
    graph.replay()
    want, _ = run(queue, queue, cfg, meta, new)
    for k in want:
        assert np.array_equal(dev[k].to_numpy(), want[k]), k


@pytest.mark.parametrize("producer", ["dlpack", "dlpack_copy", "suai"])
def test_unwritable_memory_is_refused_where_the_call_writes(queue, producer):
    """Memory its producer marks read-only (DLPack 1.x flags, SUAI data[1]) or a copy (DLPack
    IS_COPIED) is refused, by name and before anything runs, for an array the call writes; for an
    array it only reads it is used."""
    cfg, meta, arrays = make_call(5)
    want, _ = run(queue, queue, cfg, meta, arrays)
    read_only = lambda d: d.update(data=(d["data"][0], True))  # noqa: E731 - SUAI data[1]
    wrap = {"dlpack": lambda host: DLPackOnly(host, queue, flags=1),
            "dlpack_copy": lambda host: DLPackOnly(host, queue, flags=2),
            "suai": lambda host: EditedSUAI(usm(queue, host), read_only)}[producer]
    why = "a copy its producer made" if producer == "dlpack_copy" else "read-only memory"
    dev = {k: usm(queue, v) for k, v in arrays.items()}
    for field in ("ssm_state", "conv_state", "core_attn_out"):
        ro = wrap(arrays[field])
        with pytest.raises(ValueError, match=f"^{field}: {why}"):
            pygdn.attention(queue, cfg, to_device(meta, queue), **dict(dev, **{field: ro}))
        ro_array = ro.base.to_numpy() if producer == "suai" else ro.to_numpy()
        assert np.array_equal(ro_array, arrays[field]), f"{field} changed"
    for k in ("ssm_state", "conv_state", "core_attn_out"):
        assert np.array_equal(dev[k].to_numpy(), arrays[k]), f"{k} changed by a refused call"
    # dpctl.memory objects always set SUAI data[1] (meaning "writable" to them): a workspace
    batch = to_device(meta, queue)
    workspace = dpctl.memory.MemoryUSMDevice(pygdn.workspace_size(cfg, batch), queue=queue)
    assert workspace.__sycl_usm_array_interface__["data"][1] is True
    inputs = {k: wrap(arrays[k]) for k in ("mixed_qkv", "a", "conv_weight")}
    pygdn.attention(queue, cfg, batch, workspace=workspace, **dict(dev, **inputs))
    for k in want:
        assert np.array_equal(dev[k].to_numpy(), want[k]), k


def test_host_tensor_is_refused_by_name(queue):
    """Where the device cannot address host memory (test_host_memory.py: where it can)."""
    if queue.sycl_device.has_aspect_usm_system_allocations:
        pytest.skip("host memory is system memory on this device: accepted (test_host_memory.py)")
    cfg, meta, arrays = make_call(4)
    host = DLPackOnly(arrays["a"], queue, device_type=KDL_CPU)
    dev = {k: usm(queue, v) for k, v in arrays.items()}
    dev["a"] = host
    with pytest.raises(TypeError, match=r"^a: .*kDLCPU DLPack tensor \(DLPackOnly\) in host memory"):
        pygdn.attention(queue, cfg, to_device(meta, queue), **dev)
    assert host.capsules == [], "a capsule was taken from a host tensor"
    with pytest.raises(TypeError, match=r"^b: .*kDLCPU DLPack tensor \(ndarray\)"):
        pygdn.attention(queue, cfg, to_device(meta, queue), **dict(dev, a=dev["b"], b=arrays["b"]))


@pytest.mark.parametrize("case", ["bf16_code", "uint16", "strided", "other_context", "bad_device"])
def test_refused_dlpack_tensor_is_still_freed(queue, case):
    """Errors after (or before) consumption: named, nothing leaks, nothing is freed twice.
    bf16 (kDLBfloat, code 4) and uint16 are read as bf16, which an f32 config refuses."""
    cfg, meta, arrays = make_call(5)
    dev = {k: usm(queue, v) for k, v in arrays.items()}
    a = arrays["a"]
    if case == "bf16_code":
        bad, match = DLPackOnly(pygdn.to_bf16_bits(a), queue, code=4), "^a: dtype bf16, expected f32"
    elif case == "uint16":
        bad, match = DLPackOnly(pygdn.to_bf16_bits(a), queue), "^a: dtype bf16, expected f32"
    elif case == "strided":
        bad, match = DLPackOnly(a, queue, strides=(1, a.shape[0])), "^a: the dimensions after the first must be C-con"
    elif case == "other_context":
        other = dpctl.SyclQueue(dpctl.SyclContext([queue.sycl_device]), queue.sycl_device, property="in_order")
        bad, match = DLPackOnly(a, other), "^a: lives in another SYCL context than the queue"
    else:
        bad, match = DLPackOnly(a, queue), "^a: DLPack kDLOneAPI device 99 is not one of"
        bad.device = (KDL_ONEAPI, 99)
    with pytest.raises((TypeError, ValueError), match=match):
        pygdn.attention(queue, cfg, to_device(meta, queue), **dict(dev, a=bad))
    if case == "bad_device":
        assert bad.capsules == []
    else:
        assert_each_capsule_freed_once([bad])


def test_bad_queue_arguments(queue):
    cfg, meta, arrays = make_call(6)
    dev = {k: usm(queue, v) for k, v in arrays.items()}
    with pytest.raises(TypeError, match="^queue: expected a dpctl.SyclQueue, a sycl::queue\\* as int"):
        pygdn.attention("cpu", cfg, to_device(meta, queue), **dev)
    with pytest.raises(ValueError, match="^queue: NULL"):
        pygdn.attention(0, cfg, to_device(meta, queue), **dev)
    used = queue._get_capsule()
    dpctl.SyclQueue(used)  # consumes it
    with pytest.raises(TypeError, match="^queue: "):
        pygdn.attention(used, cfg, to_device(meta, queue), **dev)
