"""python -m pygdn warmup: fill the library's disk cache of compiled kernels for a deployment.

    python -m pygdn warmup [--config NAME ...] [--dtype bf16|f16|f32 ...] [--ssm-layout vk|kv ...]
                           [--state-dtype f32|bf16|f16|i8|f8e4m3 ...] [--prefill-precision auto|f32|bf16 ...]
                           [--device FILTER]

Compiles (or finds in the cache) every kernel a config can launch on the device, as the C call
gdn_warmup does, and says for each config how long it took. Run it where the cache will be used
(e.g. as a step of a container image build, with GDN_XPU_CACHE_DIR pointing into the image): the
first call of a serving process then starts without compiling. The cache is keyed by the kernel
sources, options, device, driver and runtime: a warmup on another machine kind does not help.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time

import dpctl

from .demo import MODELS
from .config import Config
from .ops import warmup

# Model shapes per tensor-parallel rank (H k-heads, HV v-heads, K, V, conv width, gate mode) of
# the demo's models: qwen3-next-tp1 .. tp8 (Qwen3-Next-80B-A3B), kimi-linear-tp1 .. tp8
# (Kimi-Linear-48B-A3B, KDA). Kernel builds depend on the dtype, K, the gate mode and the layouts
# (docs/design.md), so TP degrees mostly share them.
PRESETS = {f"{name}-tp{tp}": (m["k_heads"] // tp, m["v_heads"] // tp, m["head_dim"], m["head_dim"], m["conv_width"],
                              m["gate_mode"]) for name, m in MODELS.items() for tp in (1, 2, 4, 8)}
PRESETS["demo"] = PRESETS["qwen3-next-tp1"]  # python -m pygdn demo's default layer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pygdn warmup", description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", choices=sorted(PRESETS), help="model shape (default: demo); repeatable")
    p.add_argument("--dtype", action="append", choices=["bf16", "f16", "f32"], help="activation dtype (default bf16)")
    p.add_argument("--ssm-layout", action="append", choices=["vk", "kv"], help="ssm_state layout (default vk)")
    p.add_argument("--state-dtype", action="append", choices=["f32", "bf16", "f16", "i8", "f8e4m3"],
                   help="ssm_state dtype (default f32); repeatable")
    p.add_argument("--prefill-precision", action="append", choices=["auto", "f32", "bf16"],
                   help="the chunked prefill's products (default auto: the form the device takes); repeatable")
    p.add_argument("--device", default=None, help="dpctl filter string (default: the default SYCL device)")
    args = p.parse_args(argv)
    q = dpctl.SyclQueue(args.device, property="in_order") if args.device else dpctl.SyclQueue(property="in_order")
    print(f"warming up libgdn_xpu kernels on {q.sycl_device.name}", flush=True)
    total = time.perf_counter()
    for name, dtype, layout, state, precision in itertools.product(
            args.config or ["demo"], args.dtype or ["bf16"], args.ssm_layout or ["vk"], args.state_dtype or ["f32"],
            args.prefill_precision or ["auto"]):
        H, HV, K, V, W, gate_mode = PRESETS[name]
        cfg = Config(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, num_slots=1, conv_width=W,
                     act_dtype=dtype, ssm_layout=layout, state_dtype=state, gate_mode=gate_mode,
                     prefill_precision=precision)
        t0 = time.perf_counter()
        warmup(q, cfg)
        print(f"  {name} {dtype} {layout}{'' if state == 'f32' else f' {state} state'}"
              f"{'' if precision == 'auto' else f' {precision} prefill'}: ready in {time.perf_counter() - t0:.2f} s",
              flush=True)
    print(f"done in {time.perf_counter() - total:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
