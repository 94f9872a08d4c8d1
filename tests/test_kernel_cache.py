"""The library's own disk cache of compiled kernels (src/cache/disk_cache.hpp), from fresh processes:
a second process loads what the first compiled, damaged or unusable entries and folders cost a
warning and a recompile (never a failed call or a wrong result), nothing is written when it is
off, and loading the library leaves the process environment alone (a C++ host's own bf16 JIT
kernel runs with the library linked in). Which path a process took is read from its
GDN_XPU_VERBOSE lines, never from timings."""
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import time

import numpy as np
import pytest

import pygdn
from pygdn import reference as ref
from helpers import assert_close

# A small f32 conv (one kernel family, a few seconds to compile): the child saves its inputs and
# outputs, the parent checks them against the float64 reference.
CHILD = r"""
import json, sys
import numpy as np
if sys.argv[3:] == ["queue_first"]:  # the SYCL runtime starts before the library is loaded
    import dpctl
    q = dpctl.SyclQueue(property="in_order")
import pygdn, dpctl
from pygdn.batch import make_batch, to_device
if sys.argv[3:] != ["queue_first"]:
    q = dpctl.SyclQueue(property="in_order")
rng = np.random.default_rng(int(sys.argv[2]))
meta = make_batch(rng, num_slots=6, prefill_lens=[3], num_decodes=2)
cfg = pygdn.Config(num_k_heads=1, num_v_heads=1, head_k_dim=8, head_v_dim=8, num_slots=6, conv_width=4,
                   act_dtype="f32", conv_layout="dim_major")
if sys.argv[3:] == ["warmup_threads"]:  # every build of cfg asked for by two threads at once
    import threading
    start = threading.Barrier(2)
    def warm():
        start.wait()
        pygdn.warmup(q, cfg)
    threads = [threading.Thread(target=warm) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
T, C = meta["num_actual_tokens"], cfg.conv_dim
x = rng.standard_normal((T, C)).astype(np.float32)
w = (rng.standard_normal((C, 4)) * 0.5).astype(np.float32)
st = rng.standard_normal(cfg.conv_state_shape).astype(np.float32)
U = lambda a: pygdn.UsmArray.from_numpy(np.ascontiguousarray(a), q)
d_out = U(np.zeros((T, C), np.float32))
batch = to_device(meta, q)
for _ in range(2):  # the second call reuses the kernels of the first (one load/compile line)
    d_state = U(st)
    pygdn.causal_conv1d(q, cfg, batch, mixed_qkv=U(x), conv_weight=U(w), conv_state=d_state, conv_out=d_out)
np.savez(sys.argv[1], x=x, w=w, st=st, out=d_out.to_numpy(), state=d_state.to_numpy(),
         meta=json.dumps({k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in meta.items()}))
"""

COMPILED = re.compile(r"libgdn_xpu: compiling (\S+)")
LOADED = re.compile(r"libgdn_xpu: loaded (\S+) .* from (\S+) in")
WARNING = re.compile(r"libgdn_xpu: warning: (.*)")


def child_env(cache_dir=None, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYCL_CACHE", "GDN_XPU_"))}
    if "GDN_XPU_LIBRARY" in os.environ:  # testing a library other than the installed one
        env["GDN_XPU_LIBRARY"] = os.environ["GDN_XPU_LIBRARY"]
    env["GDN_XPU_VERBOSE"] = "1"
    if cache_dir is not None:
        env["GDN_XPU_CACHE_DIR"] = str(cache_dir)
    env.update(extra)
    return env


def spawn(tmp_path, env, name="run", seed=0, extra=()):
    out = tmp_path / f"{name}.npz"
    # cwd outside the repository: its pygdn/ folder would shadow the installed package
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(out), str(seed), *extra], env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, out


def finish(p, out):
    stdout, stderr = p.communicate(timeout=900)
    assert p.returncode == 0, stderr
    check_results(out)
    return stderr


def run(tmp_path, env, name="run", seed=0, extra=()):
    return finish(*spawn(tmp_path, env, name, seed, extra))


def check_results(npz):
    d = np.load(npz)
    meta = {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in json.loads(str(d["meta"])).items()}
    want_out, want_state = ref.causal_conv1d(d["x"].astype(np.float64), d["w"].astype(np.float64), None,
                                             d["st"].astype(np.float64), meta)
    T = d["out"].shape[0]
    assert_close(d["out"][:T], want_out, 2e-5, "conv_out")
    assert np.array_equal(d["state"].astype(np.float64), want_state), "conv_state differs"


def entries(cache_dir):
    return sorted(p for p in cache_dir.iterdir() if p.is_file()) if cache_dir.exists() else []


def warnings(stderr):
    return WARNING.findall(stderr)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache folder filled by one process (copied by the tests that damage it)."""
    tmp = tmp_path_factory.mktemp("filled")
    cache = tmp / "cache"
    err = run(tmp, child_env(cache))
    assert COMPILED.findall(err) and not LOADED.findall(err), err
    assert not warnings(err), err
    files = entries(cache)
    assert files, "nothing was written to the cache folder"
    assert all(f.name.endswith(".bin") for f in files), files  # no temporary files left
    return cache


def copy_cache(filled, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(filled, cache)
    return cache


def test_second_process_loads_from_disk(filled, tmp_path):
    cache = copy_cache(filled, tmp_path)
    err = run(tmp_path, child_env(cache))
    assert not COMPILED.findall(err), f"the second process compiled again:\n{err}"
    loaded = LOADED.findall(err)
    assert len(loaded) == len(entries(cache)) == 1, err  # one family, loaded once for two calls
    assert loaded[0][1] == str(entries(cache)[0])
    assert not warnings(err), err


def test_queue_made_before_import_still_uses_the_disk_cache(filled, tmp_path):
    # (With the old SYCL_CACHE_* route the runtime had read its configuration before the library
    # could set it, and the cache was silently off.)
    cache = copy_cache(filled, tmp_path)
    err = run(tmp_path, child_env(cache), extra=("queue_first",))
    assert LOADED.findall(err) and not COMPILED.findall(err) and not warnings(err), err


def with_kernel_list(data, edit):
    """The entry file with its kernel list replaced by edit(list of (name, backend name)) and its
    checksum made valid again: it passes every check of the format (src/cache/cache_file.cpp) and its
    binary builds, but the kernels it lists cannot be made."""
    header = 8 + 4 + 4 + 8 + 32  # magic, format, 0, payload bytes, SHA-256 of the payload
    payload, at = data[header:], 0

    def u32():
        nonlocal at
        at += 4
        return struct.unpack_from("<I", payload, at - 4)[0]

    def string():
        nonlocal at
        n = u32()
        at += n
        return payload[at - n:at]

    key = string()
    kernels = edit([(string(), string()) for _ in range(u32())])
    rest = payload[at:]  # binary size and binary
    new = struct.pack("<I", len(key)) + key + struct.pack("<I", len(kernels))
    for name, native in kernels:
        new += struct.pack("<I", len(name)) + name + struct.pack("<I", len(native)) + native
    new += rest
    return data[:16] + struct.pack("<Q", len(new)) + hashlib.sha256(new).digest() + new


DAMAGE = {
    "truncated": lambda b: b[: len(b) // 3],
    "random_bytes": lambda b: np.random.default_rng(1).integers(0, 256, len(b), dtype=np.uint8).tobytes(),
    "wrong_version": lambda b: b[:8] + bytes([b[8] + 1]) + b[9:],  # the format field after the magic
    "flipped_byte": lambda b: b[:-100] + bytes([b[-100] ^ 0xFF]) + b[-99:],
    "empty": lambda b: b"",
    # well-formed entries whose kernels cannot be made: a warning and a rebuild that replaces the
    # entry, not GDN_ERROR_INTERNAL in every call of every process
    "kernel_not_in_binary": lambda b: with_kernel_list(b, lambda ks: [(n, native + b"_gone") for n, native in ks]),
    "no_kernels_listed": lambda b: with_kernel_list(b, lambda ks: []),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entries_are_replaced(filled, tmp_path, damage):
    cache = copy_cache(filled, tmp_path)
    good = {f.name: f.read_bytes() for f in entries(cache)}
    for f in entries(cache):
        f.write_bytes(DAMAGE[damage](f.read_bytes()))
    err = run(tmp_path, child_env(cache))
    assert COMPILED.findall(err), err
    for name in good:  # at most one warning naming each file
        assert sum(name in w for w in warnings(err)) == 1, err
    assert len(warnings(err)) == len(good), err
    # replaced atomically by a good entry: the next process loads it, silently
    assert sorted(f.name for f in entries(cache)) == sorted(good)
    err = run(tmp_path, child_env(cache), name="again")
    assert LOADED.findall(err) and not COMPILED.findall(err) and not warnings(err), err


def test_runtime_build_options_from_the_environment_get_their_own_entry(filled, tmp_path):
    # The SYCL runtime applies SYCL_PROGRAM_COMPILE_OPTIONS (and its APPEND / LINK twins) to the
    # library's builds too: a binary built under them is another binary, stored under an entry of
    # its own, not the plain one's.
    cache = copy_cache(filled, tmp_path)
    err = run(tmp_path, child_env(cache, SYCL_PROGRAM_COMPILE_OPTIONS="-cl-opt-disable"))
    assert COMPILED.findall(err) and not LOADED.findall(err), err
    assert len(entries(cache)) == 2, entries(cache)
    err = run(tmp_path, child_env(cache), name="plain")  # without them: the first entry again
    assert LOADED.findall(err) and not COMPILED.findall(err) and not warnings(err), err


def test_unreadable_entry(filled, tmp_path):
    cache = copy_cache(filled, tmp_path)
    for f in entries(cache):
        if os.geteuid() == 0:  # root reads any file: a folder in its place cannot be read as one
            f.unlink()
            f.mkdir()
        else:
            f.chmod(0)
    err = run(tmp_path, child_env(cache))
    assert COMPILED.findall(err), err
    assert any("cannot read kernel cache entry" in w for w in warnings(err)), err


def test_fifo_in_place_of_an_entry(filled, tmp_path):
    # Opening it must not block the call: a warning, a recompile, and the FIFO replaced by a good
    # entry.
    cache = copy_cache(filled, tmp_path)
    names = []
    for f in entries(cache):
        names.append(f.name)
        f.unlink()
        os.mkfifo(f)
    p, out = spawn(tmp_path, child_env(cache))
    try:
        err = finish(p, out)
    finally:
        p.kill()
    assert COMPILED.findall(err), err
    assert any("cannot read kernel cache entry" in w for w in warnings(err)), err
    assert [f.name for f in entries(cache)] == names  # regular files again


def age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_a_store_removes_stale_temporaries_and_unused_entries(filled, tmp_path):
    # A crash between creating an entry's temporary file and renaming it leaves the file behind:
    # a store removes it once an hour old (a younger one may be a write in progress). An entry no
    # process wrote or loaded for 30 days (another library version's, say) goes too; a file that
    # is not an entry stays, whatever its name (the folder may be shared).
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o700)  # whatever the umask: a folder others may write is not used at all
    unused = cache / ("other-" + "ab" * 32 + ".bin")
    shutil.copy(entries(filled)[0], unused)
    foreign = cache / ("cd" * 32 + ".bin")
    foreign.write_bytes(b"somebody else's")
    stale, fresh = cache / (unused.name + ".tmp.123.0"), cache / (unused.name + ".tmp.124.0")
    for f in (stale, fresh):
        f.write_bytes(b"partial")
    for f, seconds in ((unused, 31 * 86400), (foreign, 31 * 86400), (stale, 2 * 3600)):
        age(f, seconds)
    err = run(tmp_path, child_env(cache))
    assert COMPILED.findall(err) and not warnings(err), err
    assert not unused.exists() and not stale.exists()
    assert foreign.exists() and fresh.exists()


def test_folder_writable_by_others_is_not_used(filled, tmp_path):
    # Its files would run in this process: a world-writable folder is neither loaded from nor
    # written to (a warning; the call compiles and succeeds).
    cache = copy_cache(filled, tmp_path)
    cache.chmod(0o777)
    before = [(f.name, f.stat().st_mtime) for f in entries(cache)]
    err = run(tmp_path, child_env(cache))
    assert COMPILED.findall(err) and not LOADED.findall(err), err
    assert any("is writable by other users (mode 777)" in w for w in warnings(err)), err
    assert [(f.name, f.stat().st_mtime) for f in entries(cache)] == before


def test_a_loaded_entry_counts_as_used(filled, tmp_path):
    cache = copy_cache(filled, tmp_path)
    for f in entries(cache):
        age(f, 31 * 86400)
    err = run(tmp_path, child_env(cache))
    assert LOADED.findall(err) and not COMPILED.findall(err), err
    assert all(time.time() - f.stat().st_mtime < 3600 for f in entries(cache))


def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    if os.access(d, os.W_OK):  # root: permissions do not stop it; /proc/self refuses new files
        return "/proc/self"
    return str(d)


def test_read_only_dir(tmp_path):
    err = run(tmp_path, child_env(read_only_dir(tmp_path)))
    assert COMPILED.findall(err), err
    assert len(warnings(err)) == 1 and "cannot write to the kernel cache folder" in warnings(err)[0], err


def test_read_only_dir_with_entries_loads(filled, tmp_path):
    cache = copy_cache(filled, tmp_path)
    cache.chmod(0o500)
    try:
        err = run(tmp_path, child_env(cache))
    finally:
        cache.chmod(0o700)
    assert LOADED.findall(err) and not COMPILED.findall(err) and not warnings(err), err


def test_unwritable_dir(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    err = run(tmp_path, child_env(blocker / "cache"))
    assert COMPILED.findall(err), err
    assert len(warnings(err)) == 1 and "cannot create the kernel cache folder" in warnings(err)[0], err


def test_no_home_falls_back_to_temp(tmp_path):
    env = child_env(None, TMPDIR=str(tmp_path))
    for k in ("HOME", "XDG_CACHE_HOME"):
        env.pop(k, None)
    err = run(tmp_path, env)
    folder = tmp_path / f"libgdn_xpu-{os.geteuid()}"
    assert len(warnings(err)) == 1 and str(folder) in warnings(err)[0], err
    assert entries(folder), "nothing written to the temp folder"
    assert folder.stat().st_mode & 0o077 == 0, "the temp folder is not private"
    err = run(tmp_path, env, name="again")  # the next process finds it there (and says so again)
    assert LOADED.findall(err) and not COMPILED.findall(err), err


def test_xdg_cache_home(tmp_path):
    env = child_env(None, XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"))
    err = run(tmp_path, env)
    assert not warnings(err), err
    assert entries(tmp_path / "xdg" / "libgdn_xpu") and not (tmp_path / "home").exists()


def test_two_processes_fill_one_empty_dir(tmp_path):
    cache = tmp_path / "cache"
    procs = [spawn(tmp_path, child_env(cache), name=f"p{i}", seed=i) for i in range(2)]
    errs = [finish(*p) for p in procs]
    for err in errs:
        assert not warnings(err), err
    files = entries(cache)
    assert len(files) == 1 and files[0].name.endswith(".bin"), files  # no temporary files left
    err = run(tmp_path, child_env(cache), name="third")
    assert LOADED.findall(err) and not COMPILED.findall(err), err


def test_builds_of_one_request_run_side_by_side_and_once(tmp_path):
    """Two threads warm up one config at once: every build is made once (the other thread waits for
    it), the builds of the request overlap when the process may use two CPUs, each build is kept in
    its own entry, and the kernels compute what the reference does."""
    cache = tmp_path / "cache"
    err = run(tmp_path, child_env(cache), extra=["warmup_threads"])
    compiling = COMPILED.findall(err)
    assert len(compiling) >= 3 and len(set(compiling)) == len(compiling), err  # each build once
    assert len(re.findall(r"libgdn_xpu: compiled ", err)) == len(compiling), err
    assert not LOADED.findall(err) and not warnings(err), err
    assert len(entries(cache)) == len(compiling), entries(cache)
    if len(os.sched_getaffinity(0)) >= 2:  # the second build starts before the first one ends
        lines = [line for line in err.splitlines() if line.startswith("libgdn_xpu: compil")]
        assert lines[0].startswith("libgdn_xpu: compiling ") and lines[1].startswith("libgdn_xpu: compiling "), err


def test_disk_cache_off_writes_nothing(tmp_path):
    cache = tmp_path / "off"
    err = run(tmp_path, child_env(cache, GDN_XPU_DISK_CACHE="0"))
    assert COMPILED.findall(err) and not warnings(err), err
    assert not cache.exists()


ENV_CHILD = r"""
import ctypes, json, os
def c_environ():  # the C library's environment (what setenv changes; os.environ is a copy made at startup)
    env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    out, i = {}, 0
    while env[i]:
        k, _, v = env[i].decode(errors="replace").partition("=")
        out[k], i = v, i + 1
    return out
def diff(before, after):
    return {"added": sorted(set(after) - set(before)), "changed": sorted(k for k in before if after.get(k) != before[k])}
before, c_before = dict(os.environ), c_environ()
import pygdn  # loads libgdn_xpu.so (its constructors run here)
pygdn.version()
print(json.dumps({"python": diff(before, dict(os.environ)), "c": diff(c_before, c_environ())}))
"""


def test_loading_the_library_leaves_the_environment_alone(tmp_path):
    env = child_env(None)  # OCL_ICD_FILENAMES is already set here, so pygdn has nothing to add
    out = subprocess.run([sys.executable, "-c", ENV_CHILD], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    diff = json.loads(out.stdout.strip().splitlines()[-1])
    none = {"added": [], "changed": []}
    assert diff == {"python": none, "c": none}, diff


# A host program with its own run-time compiled bf16 kernel (sycl::ext::oneapi::bfloat16: the
# runtime's persistent cache crashes on it, docs/design.md "State stores, bf16, streaming stores,
# prefetching"), linked against the library.
HOST_CPP = r"""
#include <sycl/sycl.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "gdn_xpu.h"
extern char **environ;
namespace syclexp = sycl::ext::oneapi::experimental;
static const char *src = R"(
#include <sycl/sycl.hpp>
#include <sycl/ext/oneapi/bfloat16.hpp>
namespace syclexp = sycl::ext::oneapi::experimental;
using bf16 = sycl::ext::oneapi::bfloat16;
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void widen(const bf16 *x, float *y) {
  auto i = sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_global_id(0);
  y[i] = float(x[i]) * 2.0f;
}
)";
int main() {
  std::printf("library %s\n", gdn_version());  // a real reference: the library is loaded
  for (char **e = environ; *e; ++e)
    if (std::strncmp(*e, "SYCL_", 5) == 0) { std::printf("environment has %s\n", *e); return 2; }
  sycl::queue q{sycl::cpu_selector_v};
  auto source = syclexp::create_kernel_bundle_from_source(q.get_context(), syclexp::source_language::sycl, src);
  auto bundle = syclexp::build(source);
  sycl::kernel k = bundle.ext_oneapi_get_kernel("widen");
  const int n = 64;
  auto *x = sycl::malloc_shared<sycl::ext::oneapi::bfloat16>(n, q);
  auto *y = sycl::malloc_shared<float>(n, q);
  for (int i = 0; i < n; ++i) x[i] = sycl::ext::oneapi::bfloat16(0.5f * i);
  q.submit([&](sycl::handler &h) { h.set_args(x, y); h.parallel_for(sycl::nd_range<1>{n, 8}, k); }).wait();
  for (int i = 0; i < n; ++i)
    if (y[i] != float(i)) { std::printf("wrong y[%d] = %g\n", i, y[i]); return 3; }
  std::printf("bf16 kernel ok\n");
  return 0;
}
"""


def test_cpp_host_bf16_kernel_with_library_linked(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    from pygdn import _lib
    lib_dir = os.path.dirname(os.path.abspath(_lib.LIBRARY_PATH))
    inc = os.path.dirname(os.path.abspath(_lib.HEADER_PATH))
    prefix = sys.prefix
    src = tmp_path / "host.cpp"
    src.write_text(HOST_CPP)
    exe = tmp_path / "host"
    link_lib = tmp_path / "libgdn_xpu.so"  # the library file under its plain name, for -lgdn_xpu
    link_lib.symlink_to(os.path.abspath(_lib.LIBRARY_PATH))
    cmd = ["g++", "-std=c++17", "-O0", "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING", "-Wno-deprecated-declarations",
           f"-I{prefix}/include", f"-I{inc}", str(src), "-o", str(exe), "-Wl,--no-as-needed", f"-L{tmp_path}",
           "-lgdn_xpu", f"-L{prefix}/lib", "-lsycl", f"-Wl,-rpath,{tmp_path}:{lib_dir}:{prefix}/lib"]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    env = {k: v for k, v in child_env(None).items() if not k.startswith("SYCL_")}
    env.pop("GDN_XPU_VERBOSE")
    env.setdefault("OCL_ICD_FILENAMES", os.path.join(prefix, "lib", "libintelocl.so"))
    out = subprocess.run([str(exe)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr[-4000:]}"
    assert "bf16 kernel ok" in out.stdout
    readelf = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True)
    assert "libgdn_xpu.so" in readelf.stdout, "the host program is not linked against the library"
