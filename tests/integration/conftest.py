"""The tiny models of the integration tests (Qwen3-Next, Qwen3.5 dense and MoE) and the runs of vLLM on
them (each in a process of its own: vLLM reads its plugins and settings once per process). Needs the
environment of `tests/setup_and_run.sh integration` (vLLM's CPU build beside pygdn)."""
import json
import os
import subprocess
import sys

import pytest

from models import CONFIG, write_model  # noqa: F401 (CONFIG: benchmarks/vllm_e2e.py takes it from here)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("qwen3_next_tiny"), "qwen3_next")


def engine_env(plugin):
    """The environment of one vLLM process: in-process engine, a small KV cache, Intel OpenMP preloaded
    as vLLM's CPU build wants it, and the plugin's switch."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_LOGGING_LEVEL="INFO")
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    if os.path.exists(iomp):
        env["LD_PRELOAD"] = iomp
    env.pop("GDN_XPU_VLLM", None)
    if plugin:
        env["GDN_XPU_VLLM"] = "1"
    return env


def run_vllm(tmp_path, model, name, plugin, *args, env=None):
    """Runs run_vllm.py (env: more environment variables); returns (its JSON result, its log)."""
    out = tmp_path / f"{name}.json"
    p = subprocess.run([sys.executable, os.path.join(HERE, "run_vllm.py"), str(out), model, *map(str, args)],
                       env=dict(engine_env(plugin), **(env or {})), capture_output=True, text=True, timeout=1800,
                       cwd=str(tmp_path))
    log = p.stdout + p.stderr
    if p.returncode:
        raise AssertionError(f"vLLM run {name} failed ({p.returncode}):\n{log[-6000:]}")
    return json.load(open(out)), log
