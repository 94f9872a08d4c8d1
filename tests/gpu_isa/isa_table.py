"""The generic (GPU) kernels as Intel GPU ISA, without a GPU: capture the SPIR-V the SYCL runtime
builds for each kernel file, validate it with spirv-val, compile it with ocloc for Intel GPUs and
print what the native code looks like (docs/gpu.md explains the columns).

    python tests/gpu_isa/isa_table.py [--all] [--variant ACT/STATE/K/LAYOUT[/EXTRA...] ...] [--device bmg ...]
                                      [--no-dump] [--keep DIR]

Per variant (activation dtype, state dtype, K = V, ssm layout, then optional extras) one process with
an empty kernel cache runs pygdn's warmup with GDN_XPU_GENERIC_KERNELS=1 and SYCL_DUMP_IMAGES=1: the
runtime writes the SPIR-V of every kernel file it builds (img_spir64_N.spv; the file without a
number holds the runtime's own kernels and is ignored), before it compiles the file for the CPU
device. The extras choose what the plan builds, and so the kernel files' build options: "kda" is
gate_mode "channel" (a decay per key channel); "name=value" sets a Config field (e.g.
conv_width=2); "NAME=value" (upper case) sets an environment variable of the warmup process.
Identical files (the conv, prep and norm builds do not depend on the state) are compiled once. Per
device, `ocloc compile -spirv_input ... --format zebin` builds the file; the zebin's .ze_info
section gives each kernel's SIMD width, GRF count, SLM bytes, private/scratch bytes per thread and
whether it uses DPAS (has_dpas); ocloc's log gives spills ("spilled around N"); IGC's shader dump
(IGC_ShaderDumpEnable=1) gives instruction counts, the spill bytes and the DPAS instructions. A
zero exit code is not a build: a truncated SPIR-V also compiles to an empty zebin, so every kernel
name the SPIR-V declares must be in the zebin.

Needs: the installed pygdn (run with the venv's python) and the compiler toolchain.py fetches
(Debian sid's ocloc and spirv-val, unpacked into a cache folder on first use).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import toolchain

# The Intel GPUs people serve on: Arc B-series (bmg, Xe2), Lunar Lake (lnl-m, Xe2), Data Center GPU
# Max (pvc, Xe-HPC), Arc A-series (dg2, Xe-HPG). --device takes any other name ocloc knows.
DEVICES = ("bmg", "lnl-m", "pvc", "dg2")
# The representative set the test compiles: the demo's deployment (bf16, K = V = 128, vk) with
# f32 and bf16 state, the kv layout, f16 activations with an f16 state, and KDA's deployment (Kimi
# Linear: K = V = 128, a decay per key channel).
# The matrix form of the chunk kernels (prefill_precision bf16 on a GPU with XMX) as joint_matrix with
# a device's tile, captured on the CPU device by a warmup with GDN_XPU_MATRIX_BUILD and the CPU
# runtime's JIT targeting an AMX CPU (it then compiles joint_matrix without running anything; docs/gpu.md
# "Matrix engines"): the extra "xmx16" is the 8x16x16 tile in sub-groups of 16 (Xe2, Xe-HPC), "xmx8"
# 8x8x16 in sub-groups of 8 (Xe-HPG), each compiled for the devices that take its tile only.
MATRIX_TILES = {"xmx16": ("8x16x16/16", ("bmg", "lnl-m", "pvc")), "xmx8": ("8x8x16/8", ("dg2",))}
# The 8-bit states (per-row scales: the generic kernels' amax reductions and E4M3 / int8 conversions)
# build without replay mode, which takes no 8-bit state.
DEFAULT_VARIANTS = ("bf16/f32/128/vk", "bf16/bf16/128/vk", "bf16/f32/128/kv", "f16/f16/128/vk", "bf16/f32/128/vk/kda",
                    "bf16/f32/128/vk/xmx16", "bf16/f32/128/vk/xmx8", "bf16/i8/128/vk/replay_tokens=0",
                    "bf16/f8e4m3/128/kv/replay_tokens=0")
# --all: every activation dtype x state dtype x K = V in {64, 128, 256} x layout.
ALL_VARIANTS = tuple(f"{a}/{s}/{k}/{l}" for a in ("f32", "f16", "bf16") for s in ("f32", "bf16", "f16")
                     for k in (64, 128, 256) for l in ("vk", "kv"))

# One process per variant: the runtime numbers its dumps per process, and an empty kernel cache makes
# it compile (and so dump) every kernel file the config can launch. Replay mode (replay_tokens > 0)
# adds its launches: gdn_recurrent's replay and ring paths, gdn_replay_count.
_WARMUP = """
import dpctl, json, sys
from pygdn import Config, warmup
q = dpctl.SyclQueue("cpu", property="in_order")
warmup(q, Config(**json.loads(sys.argv[1])))
"""


def variant_setup(variant: str) -> tuple[dict, dict]:
    """The Config fields and the environment variables of a variant (see the module's doc and
    MATRIX_TILES)."""
    act, state, k, layout, *extras = variant.split("/")
    cfg = dict(num_k_heads=2, num_v_heads=4, head_k_dim=int(k), head_v_dim=int(k), num_slots=1, conv_width=4,
               act_dtype=act, state_dtype=state, ssm_layout=layout, replay_tokens=2, gate_mode="head")
    env = {}
    for e in extras:
        name, eq, value = e.partition("=")
        if e == "kda":
            cfg.update(gate_mode="channel", num_v_heads=2)
        elif e in MATRIX_TILES:
            env.update(CL_CONFIG_CPU_TARGET_ARCH="sapphirerapids", GDN_XPU_MATRIX_BUILD=MATRIX_TILES[e][0])
        elif eq and name.isupper():
            env[name] = value
        elif eq:
            cfg[name] = int(value) if re.fullmatch(r"-?\d+", value) else value
        else:
            raise ValueError(f"variant {variant}: unknown extra {e!r} (kda, {', '.join(MATRIX_TILES)}, name=value or NAME=value)")
    return cfg, env


def variant_devices(variant: str, devices=DEVICES) -> tuple[str, ...]:
    """The devices of `devices` that a variant is compiled for: those its matrix tile is for, else all."""
    tiles = [MATRIX_TILES[e][1] for e in variant.split("/")[4:] if e in MATRIX_TILES]
    return tuple(d for d in devices if all(d in t for t in tiles))


@dataclass
class KernelIsa:
    name: str
    simd: int = 0
    grf: int = 0
    slm: int = 0
    scratch: int = 0       # per_thread_memory_buffers: private/scratch bytes per thread
    has_dpas: bool = False # .ze_info's has_dpas
    spill: int = 0         # bytes, from IGC's dump (or the "spilled around" warning when that is missing)
    insts: int = 0         # instructions of the kernel's build in IGC's dump (the attempt the zebin holds)
    dpas_insts: int = 0    # DPAS instructions in that build

    @property
    def dpas(self) -> bool:
        """Whether the kernel uses the matrix engines (XMX): .ze_info says so, or its ISA has DPAS."""
        return self.has_dpas or self.dpas_insts > 0


@dataclass
class FileResult:
    spv: str
    kernels: list[str]                         # the __sycl_kernel_* entry points the SPIR-V declares
    variants: list[str] = field(default_factory=list)
    spirv_val_error: str = ""                  # spirv-val's complaint, "" when it accepts the file
    isa: dict = field(default_factory=dict)    # device -> {kernel name -> KernelIsa}
    errors: dict = field(default_factory=dict) # device -> ocloc's log when a build failed or lost kernels


def entry_points(spv: bytes) -> list[str]:
    """The names of a SPIR-V module's OpEntryPoint instructions."""
    words = struct.unpack(f"<{len(spv) // 4}I", spv[: len(spv) // 4 * 4])
    if not words or words[0] != 0x07230203:
        return []
    names, i = [], 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            break
        if op == 15:  # OpEntryPoint: model, id, name (a nul-terminated string), interface ids
            raw = struct.pack(f"<{count - 3}I", *words[i + 3 : i + count])
            names.append(raw.split(b"\0", 1)[0].decode())
        i += count
    return names


def capture(variant: str, out: str, python: str = sys.executable) -> list[str]:
    """The SPIR-V files of every kernel file the variant's warmup builds, in out."""
    os.makedirs(out, exist_ok=True)
    cfg, extra_env = variant_setup(variant)
    with tempfile.TemporaryDirectory(prefix="gdn-isa-cache-") as cache:
        env = dict(os.environ, GDN_XPU_GENERIC_KERNELS="1", GDN_XPU_CACHE_DIR=cache, SYCL_DUMP_IMAGES="1",
                   SYCL_DUMP_IMAGES_PREFIX=os.path.join(out, "img_"), **extra_env)
        env.pop("SYCL_CACHE_PERSISTENT", None)
        r = subprocess.run([python, "-P", "-c", _WARMUP, json.dumps(cfg)], env=env, capture_output=True, text=True,
                           cwd=out)
    if r.returncode:
        raise RuntimeError(f"warmup of {variant} failed:\n{r.stdout}{r.stderr}")
    return sorted(os.path.join(out, f) for f in os.listdir(out) if re.fullmatch(r"img_spir64_\d+\.spv", f))


def parse_ze_info(text: str) -> dict[str, KernelIsa]:
    """The per-kernel fields of a zebin's .ze_info (YAML; parsed by indentation, no YAML library)."""
    kernels: dict[str, KernelIsa] = {}
    cur: KernelIsa | None = None
    section, in_kernels = "", False
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        s = line.strip()
        if indent == 0:
            in_kernels = s == "kernels:"
            cur = None
            continue
        if not in_kernels:
            continue
        m = re.match(r"- name:\s*(\S+)", s)
        if m and indent <= 4:
            cur = kernels.setdefault(m.group(1), KernelIsa(m.group(1)))
            section = ""
            continue
        if cur is None:
            continue
        if s.endswith(":") and not s.startswith("-"):
            section = s[:-1]
            continue
        key, _, val = s.lstrip("- ").partition(":")
        key, val = key.strip(), val.strip()
        if key == "simd_size":
            cur.simd = int(val)
        elif key == "grf_count":
            cur.grf = int(val)
        elif key == "slm_size":
            cur.slm = int(val)
        elif key == "has_dpas":
            cur.has_dpas = val == "true"
        elif key == "size" and section == "per_thread_memory_buffers":
            cur.scratch += int(val)
    return kernels


def elf_section(path: str, wanted: str) -> bytes:
    """One section of a 64-bit little-endian ELF file (a zebin), by name."""
    with open(path, "rb") as f:
        data = f.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    stro = header(shstrndx)[4]
    for i in range(shnum):
        h = header(i)
        name = data[stro + h[0] : data.index(b"\0", stro + h[0])].decode()
        if name == wanted:
            return data[h[4] : h[4] + h[5]]
    return b""


def dump_stats(dump_dir: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(kernel name, SIMD) -> (instructions, spill bytes, DPAS instructions) from IGC's shader dump
    (.asm: a header, then the ISA). IGC compiles a kernel again with other settings when the first
    attempt spills (a retry, dumped as <hash>_<n>_simd..): the zebin holds the last attempt, so the
    highest n counts."""
    best: dict[tuple[str, int], tuple[int, int, int, int]] = {}
    for root, _, files in os.walk(dump_dir):
        for f in files:
            m = re.search(r"_(?:(\d+)_)?simd(\d+)_entry_\d+\.asm$", f)
            if not m:
                continue
            with open(os.path.join(root, f), errors="replace") as fh:
                text = fh.read()
            name = re.search(r"^//\.kernel (\S+)", text, re.M)
            insts = re.search(r"^//\.instCount (\d+)", text, re.M)
            spill = re.search(r"^//\.spill size (\d+)", text, re.M)
            if not name:
                continue
            key, attempt = (name.group(1), int(m.group(2))), int(m.group(1) or 0)
            if key not in best or attempt > best[key][0]:
                dpas = len(re.findall(r"^[^/]*\bdpasw?\.\d+x\d+\b", text, re.M))
                best[key] = (attempt, int(insts.group(1)) if insts else 0, int(spill.group(1)) if spill else 0, dpas)
    return {k: v[1:] for k, v in best.items()}


def ocloc(tc: toolchain.Toolchain, spv: str, device: str, work: str, dump: bool, options: str = "",
          keep_dump: bool = False) -> tuple[dict[str, KernelIsa], str]:
    """ocloc's zebin of spv for device: per-kernel properties, and its log. IGC's shader dump (tens of
    MB a file) is removed once read unless keep_dump."""
    out = os.path.join(work, device)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    dump_dir = os.path.join(out, "igc")
    if dump:
        env.update(IGC_ShaderDumpEnable="1", IGC_DumpToCustomDir=dump_dir)
    cmd = tc.ocloc + ["compile", "-spirv_input", "-file", spv, "-device", device, "--format", "zebin",
                      "-out_dir", out, "-output", "k"]
    if options:
        cmd += ["-options", options]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log = r.stdout + r.stderr
    zebins = [os.path.join(out, f) for f in os.listdir(out) if f.startswith("k") and f.endswith(".bin")]
    kernels = parse_ze_info(elf_section(zebins[0], ".ze_info").decode(errors="replace")) if zebins and r.returncode == 0 else {}
    stats = dump_stats(dump_dir) if dump else {}
    if not keep_dump:
        shutil.rmtree(dump_dir, ignore_errors=True)
    for name, k in kernels.items():
        k.insts, k.spill, k.dpas_insts = stats.get((name, k.simd), (0, 0, 0))
    for m in re.finditer(r"kernel (\S+) +compiled SIMD\d+ allocated \d+ regs and spilled around (\d+)", log):
        if m.group(1) in kernels and not kernels[m.group(1)].spill:
            kernels[m.group(1)].spill = -1  # spilled, bytes unknown (no shader dump)
    if r.returncode:
        log = f"exit {r.returncode}\n" + log
    return kernels, log


# spirv-tools validates SPV_KHR_cooperative_matrix without Intel's additions (SPV_INTEL_joint_matrix):
# the runtime's SPIR-V for a bf16 joint_matrix product carries the operand bit
# MatrixAAndBBFloat16ComponentsINTEL (0x40), which spirv-val rejects and IGC takes.
_SPIRV_VAL_INTEL_MATRIX = re.compile(r"Invalid cooperative matrix operands operand: \d+ has invalid mask component")


def spirv_val(tc: toolchain.Toolchain, spv: str) -> str:
    """spirv-val's complaint about spv, "" when it accepts the file (or objects only to Intel's matrix bits)."""
    r = subprocess.run(tc.spirv_val + [spv], capture_output=True, text=True)
    err = (r.stdout + r.stderr).strip()
    if r.returncode == 0 or _SPIRV_VAL_INTEL_MATRIX.search(err):
        return ""
    return err or f"exit {r.returncode}"


def build(variants, devices=DEVICES, work=None, dump=True, jobs=2, python=sys.executable,
          tc: toolchain.Toolchain | None = None, keep_dumps: bool = False) -> list[FileResult]:
    """Capture, validate and compile every variant's kernel files; one FileResult per distinct SPIR-V."""
    tc = tc or toolchain.get()
    work = work or tempfile.mkdtemp(prefix="gdn-isa-")
    by_hash: dict[str, FileResult] = {}
    with ThreadPoolExecutor(jobs) as ex:
        captured = list(ex.map(lambda v: (v, capture(v, os.path.join(work, v.replace("/", "_")), python)), variants))
    for v, files in captured:
        for f in files:
            with open(f, "rb") as fh:
                data = fh.read()
            h = hashlib.sha256(data).hexdigest()
            if h not in by_hash:
                by_hash[h] = FileResult(f, [n for n in entry_points(data) if n.startswith("__sycl_kernel_")])
            by_hash[h].variants.append(v)
    results = list(by_hash.values())

    def one(fr: FileResult):
        fr.spirv_val_error = spirv_val(tc, fr.spv)
        for d in (d for d in devices if any(d in variant_devices(v, devices) for v in fr.variants)):
            kernels, log = ocloc(tc, fr.spv, d, fr.spv[:-4] + "_ocl", dump, keep_dump=keep_dumps)
            fr.isa[d] = kernels
            if log.startswith("exit") or set(fr.kernels) - set(kernels):
                fr.errors[d] = log
    with ThreadPoolExecutor(jobs) as ex:
        list(ex.map(one, results))
    return results


def short(name: str) -> str:
    return name.removeprefix("__sycl_kernel_")


def dpas_cell(k: KernelIsa) -> str:
    """"no", or "yes" with the DPAS instruction count of the dump when there is one."""
    return "no" if not k.dpas else f"yes ({k.dpas_insts})" if k.dpas_insts else "yes"


def table(results: list[FileResult], devices=DEVICES) -> str:
    """One row per (kernel, variants with that SPIR-V, device), sorted in that order."""
    head = ("kernel", "device", "variants", "SIMD", "GRF", "spill B", "scratch B", "SLM B", "DPAS", "insts")
    rows = []
    for fr in results:
        vs = ",".join(fr.variants) if len(fr.variants) < 4 else f"{fr.variants[0]} +{len(fr.variants) - 1}"
        for name in fr.kernels:
            for di, d in enumerate(devices):
                if d not in fr.isa:  # (a matrix tile's file: compiled for the devices of that tile only)
                    continue
                k = fr.isa[d].get(name)
                cells = ("MISSING", "", "", "", "", "", "") if k is None else (
                    str(k.simd), str(k.grf), str(k.spill), str(k.scratch), str(k.slm), dpas_cell(k),
                    str(k.insts or ""))
                rows.append(((short(name), vs, di), (short(name), d, vs) + cells))
    rows = [head] + [r for _, r in sorted(rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", help="ACT/STATE/K/LAYOUT[/kda], e.g. bf16/f32/128/vk (repeatable)")
    p.add_argument("--all", action="store_true", help="every act x state x K in {64,128,256} x layout")
    p.add_argument("--device", action="append",
                   help=f"an ocloc device name (repeatable; default {' '.join(DEVICES)})")
    p.add_argument("--no-dump", action="store_true", help="skip IGC's shader dump (no instruction counts)")
    p.add_argument("--keep", help="work directory to keep, IGC's shader dumps included (default: a temporary one)")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    try:
        tc = toolchain.get()
    except toolchain.Unavailable as e:
        print(f"no GPU compiler: {e}", file=sys.stderr)
        return 2
    variants = ALL_VARIANTS if args.all else tuple(args.variant or DEFAULT_VARIANTS)
    devices = tuple(args.device or DEVICES)
    work = args.keep or tempfile.mkdtemp(prefix="gdn-isa-")
    try:
        results = build(variants, devices, work, not args.no_dump, args.jobs, tc=tc, keep_dumps=bool(args.keep))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(tc.describe())
    print(table(results, devices))
    bad = 0
    for fr in results:
        if fr.spirv_val_error:
            print(f"spirv-val rejects {fr.spv} ({','.join(fr.variants)}): {fr.spirv_val_error}", file=sys.stderr)
            bad += 1
        for d, log in fr.errors.items():
            print(f"ocloc {d} on {fr.spv} lost kernels or failed:\n{log}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
