"""Thread safety: gdn_attention from two Python threads at once -- each with its own in-order queue,
and both on one shared queue -- gives bit-for-bit the results of running the same calls serially.
Each thread runs a "program" of 20 steps (mixed prefill / decode / spec batches, a prefill long
enough for the chunked path and the library-owned workspace to grow) on its own caches. The
two-thread runs happen in a child process (a race may crash it) and are repeated for many rounds.
gdn_release_caches() on another thread while calls run (it drops the workspace a call is using, and
the kernels) changes nothing either.
"""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dpctl
import pygdn
from pygdn.batch import make_batch, to_device
from helpers import default_queue, usm

STEPS = 20
H, HV, K, V, W = 1, 2, 8, 8, 4
NUM_SLOTS, NUM_SPEC = 24, 2
C = 2 * H * K + HV * V

PROGRAM_CONFIGS = [  # one per thread: different layouts and shapes
    dict(ssm_layout="kv", conv_layout="dim_major", conv_spec_layout="snapshot", z=False),
    dict(ssm_layout="vk", conv_layout="time_major", conv_spec_layout="rolled", z=True),
]


def make_program(seed, ssm_layout, conv_layout, conv_spec_layout, z):
    """Host data of STEPS calls: batches, per-step inputs, initial caches."""
    rng = np.random.default_rng(seed)
    cfg = pygdn.Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=NUM_SLOTS, conv_width=W,
                       act_dtype="f32", ssm_layout=ssm_layout, conv_layout=conv_layout,
                       conv_spec_layout=conv_spec_layout, conv_state_len=W - 1 + NUM_SPEC)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    steps = []
    for i in range(STEPS):
        prefill = [int(rng.integers(2, 12))] if i % 3 == 0 else []
        if i % 7 == 3:
            prefill.append(int(rng.integers(64, 100)))  # chunked path, bigger workspace
        meta = make_batch(rng, num_slots=NUM_SLOTS, prefill_lens=prefill, num_decodes=int(rng.integers(0, 4)),
                          spec_lens=list(rng.integers(1, NUM_SPEC + 2, size=int(rng.integers(0, 3)))),
                          num_spec=NUM_SPEC, order="random", pad_non_spec=i % 2, pad_len=1)
        T = meta["num_actual_tokens"]
        steps.append(dict(meta=meta, x=f(T, C), a=f(T, HV), b=f(T, HV), z=f(T, HV, V) if z else None))
    init = dict(conv_weight=f(C, W) * 0.5, conv_bias=f(C) * 0.1,
                A_log=np.log(rng.uniform(0.5, 8, HV)).astype(np.float32),
                dt_bias=rng.uniform(-1, 1, HV).astype(np.float32),
                norm_weight=rng.uniform(0.5, 1.5, V).astype(np.float32),
                conv_state=f(*cfg.conv_state_shape), ssm_state=f(*cfg.ssm_state_shape) * 0.5)
    return dict(cfg=cfg, steps=steps, init=init, z=z)


def run_program(queue, prog):
    """Runs the program's calls in order on `queue`; returns every step's output and the final caches."""
    d = {k: usm(queue, v) for k, v in prog["init"].items()}
    outs = []
    for step in prog["steps"]:
        T = step["meta"]["num_actual_tokens"]
        out = usm(queue, np.full((T, HV, V), 7.0, np.float32))
        pygdn.attention(queue, prog["cfg"], to_device(step["meta"], queue), mixed_qkv=usm(queue, step["x"]),
                        a=usm(queue, step["a"]), b=usm(queue, step["b"]), conv_weight=d["conv_weight"],
                        conv_bias=d["conv_bias"], A_log=d["A_log"], dt_bias=d["dt_bias"], conv_state=d["conv_state"],
                        ssm_state=d["ssm_state"], core_attn_out=out,
                        z=usm(queue, step["z"]) if prog["z"] else None,
                        norm_weight=d["norm_weight"] if prog["z"] else None)
        outs.append(out.to_numpy())
    return outs, d["conv_state"].to_numpy(), d["ssm_state"].to_numpy()


def in_threads(fns):
    """Runs each fn in its own thread, all released at once; re-raises the first exception."""
    barrier = threading.Barrier(len(fns))
    results, errors = [None] * len(fns), []

    def body(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive(), "a thread hangs"
    if errors:
        raise errors[0]
    return results


def assert_same(serial, concurrent, what):
    (o1, c1, s1), (o2, c2, s2) = serial, concurrent
    for i, (a, b) in enumerate(zip(o1, o2)):
        assert np.array_equal(a, b), f"{what}: step {i} core_attn_out differs from the serial run"
    assert np.array_equal(c1, c2), f"{what}: conv_state differs from the serial run"
    assert np.array_equal(s1, s2), f"{what}: ssm_state differs from the serial run"


def releasing_meanwhile(queue, programs):
    """Runs the programs one after the other on one thread while another calls gdn_release_caches()
    over and over; returns their results."""
    done = threading.Event()

    def run():
        try:
            return [run_program(queue, p) for p in programs]
        finally:
            done.set()

    def release():
        while not done.is_set():
            pygdn.lib.gdn_release_caches()

    return in_threads([run, release])[0]


def rounds(mode, count):
    """Runs the programs serially, then `count` rounds of both at once; returns a failure message or None.
    mode "own": each thread has its own new in-order queue every round; "shared": both use one queue;
    "release": the programs run on one thread while another releases the library's caches."""
    main_queue = default_queue()
    programs = [make_program(100 + i, **kw) for i, kw in enumerate(PROGRAM_CONFIGS)]
    serial = [run_program(main_queue, p) for p in programs]
    for r in range(count):
        if mode == "release":
            results = releasing_meanwhile(main_queue, programs)
        else:
            if mode == "own":
                queues = [dpctl.SyclQueue(main_queue.sycl_device, property="in_order") for _ in programs]
            else:
                queues = [main_queue] * len(programs)
            results = in_threads([lambda q=q, p=p: run_program(q, p) for q, p in zip(queues, programs)])
        for i, (want, got) in enumerate(zip(serial, results)):
            try:
                assert_same(want, got, f"round {r}, thread {i}")
            except AssertionError as e:
                return str(e).splitlines()[0]
    return None


def run_isolated(mode, count):
    """rounds() in a child process, so that a crash fails this test instead of killing the test run."""
    run = subprocess.run([sys.executable, os.path.abspath(__file__), mode, str(count)], capture_output=True, text=True,
                         timeout=900, env=dict(os.environ))
    tail = (run.stdout + run.stderr)[-3000:]
    assert run.returncode == 0, f"child exited with {run.returncode} (negative: killed by that signal):\n{tail}"
    assert f"OK {count} rounds" in run.stdout, tail


# One round is two threads x 20 calls. A submission race (threads on two queues of one context got
# wrong results, then a segfault in gdn_conv_non_spec, when every call fetched a new sycl::kernel from
# the cached bundle) showed up within ~100 rounds of 25 ms: 300 rounds make a regression reliable.
OWN_QUEUE_ROUNDS, SHARED_QUEUE_ROUNDS = 300, 50
# A release must not free the workspace a call is using: when it did, the child process died of heap
# corruption within its first round (0.3 s) in every try; 10 rounds take ~6 s.
RELEASE_ROUNDS = 10


def test_threads_with_own_queues():
    run_isolated("own", OWN_QUEUE_ROUNDS)


def test_threads_sharing_one_queue():
    run_isolated("shared", SHARED_QUEUE_ROUNDS)


def test_release_caches_during_calls():
    # Every release drops the kernels too: the next call loads them from the disk cache, which the
    # library keeps for OpenCL devices only. Elsewhere every call would compile (minutes a round).
    if os.environ.get("GDN_XPU_DISK_CACHE", "1").startswith("0") or \
            default_queue().sycl_device.backend != dpctl.backend_type.opencl:
        pytest.skip("no disk cache of kernels here: every call after a release would compile again")
    run_isolated("release", RELEASE_ROUNDS)


def test_last_error_is_per_thread(queue):
    """A thread's failing calls report their own message while another thread's calls succeed."""
    prog = make_program(100, **PROGRAM_CONFIGS[0])
    step = next(s for s in prog["steps"] if s["meta"]["num_spec_decodes"] > 0)
    meta = dict(step["meta"], num_accepted_tokens=np.zeros_like(step["meta"]["num_accepted_tokens"]))

    def failing():
        for _ in range(STEPS):
            with pytest.raises(pygdn.GdnError) as info:
                run_program(queue, dict(prog, steps=[dict(step, meta=meta)]))
            assert info.value.status_name == "GDN_ERROR_BAD_ACCEPTED", str(info.value)
            assert "num_accepted_tokens[0] = 0" in str(info.value)

    def succeeding():
        for _ in range(2):
            run_program(queue, dict(prog, steps=prog["steps"][:10]))
        return pygdn.ffi.string(pygdn.lib.gdn_last_error()).decode()

    _, last = in_threads([failing, succeeding])
    assert last == "", f"the succeeding thread sees an error message: {last!r}"


if __name__ == "__main__":
    failure = rounds(sys.argv[1], int(sys.argv[2]))
    if failure:
        print("MISMATCH:", failure)
        sys.exit(1)
    print(f"OK {sys.argv[2]} rounds")
