"""python -m pygdn warmup fills the library's disk cache: a second process's warmup of the same
deployment loads every kernel file from it and compiles nothing (read from GDN_XPU_VERBOSE lines,
not from timings)."""
import os
import subprocess
import sys


def run_warmup(cache_dir, *args):
    env = dict(os.environ, GDN_XPU_CACHE_DIR=str(cache_dir), GDN_XPU_VERBOSE="1")
    out = subprocess.run([sys.executable, "-m", "pygdn", "warmup", *args], capture_output=True, text=True, env=env,
                         timeout=900, cwd=str(cache_dir.parent))  # not the repository: its pygdn/ would shadow
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_warmup_fills_the_cache_for_the_next_process(tmp_path):
    cache = tmp_path / "kernels"
    first = run_warmup(cache, "--config", "demo")
    compiled = [line for line in first.stderr.splitlines() if "libgdn_xpu: compiled " in line]
    assert compiled, first.stderr
    assert "demo bf16 vk: ready in" in first.stdout
    second = run_warmup(cache, "--config", "demo")
    assert "libgdn_xpu: compiled " not in second.stderr, second.stderr
    loaded = [line for line in second.stderr.splitlines() if "libgdn_xpu: loaded " in line]
    assert len(loaded) == len(compiled), second.stderr


def test_warmup_help():
    out = subprocess.run([sys.executable, "-m", "pygdn", "warmup", "--help"], capture_output=True, text=True,
                         timeout=120, cwd="/")
    assert out.returncode == 0 and "--config" in out.stdout
