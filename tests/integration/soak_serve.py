"""The serving soak: vLLM's OpenAI-compatible server with the plugin (serve.py: the README's command) on the
tiny Qwen3-Next with MTP k=2, fed /v1/completions requests from concurrent HTTP clients for a while, the
worker process's resident memory sampled as it goes. Too long for CI; run it in the environment of
`tests/setup_and_run.sh integration`:

    .venv-integration/bin/python tests/integration/soak_serve.py [--seconds 600] [--requests 2000]
        [--concurrency 8] [--stock] [--out soak.json]

It sends requests (1..400 prompt tokens, 1..64 asked, random) until both --seconds have passed and
--requests have been answered (and stops after 4x --seconds or --max-requests sent), then prints and writes
(--out) its figures: requests, errors, tokens, the worker's RSS at the end of the warm-up (the first
WARMUP of the run) and at the end, and the largest RSS after the warm-up. Exit status 1 on any error or
when the RSS after the warm-up grew by more than --rss-growth-mib (default 64).
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import CONFIG, write_model  # noqa: E402
from serve import SERVES, Server, make_requests, problem  # noqa: E402

WARMUP = 0.1      # the share of the run (in requests) before the reference RSS sample
SAMPLE_S = 5.0    # RSS sampling period


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--max-requests", type=int, default=50000, help="stop after sending this many, whatever the time")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--stock", action="store_true", help="vLLM's own kernels (no GDN_XPU_VLLM)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rss-growth-mib", type=float, default=64)
    p.add_argument("--out")
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="gdn_soak_")
    model = write_model(os.path.join(tmp, "qwen3_next_tiny"), "qwen3_next")
    log_path = os.path.join(tmp, "server.log")
    print(f"soak: server log {log_path}", flush=True)
    with Server(model, log_path, plugin=not args.stock) as server:
        procs = server.processes()
        worker = procs.get("worker")
        if worker is None:
            sys.exit(f"soak: no worker process found under the server ({procs})")
        print(f"soak: server ready in {server.start_s:.0f} s; worker pid {worker.pid}", flush=True)
        state = dict(sent=0, done=0, errors=[], tokens=0, stop=False)
        samples = []  # (seconds, requests answered, worker RSS MiB)
        lock = threading.Lock()
        t0 = time.monotonic()

        def enough():
            elapsed = time.monotonic() - t0
            return (elapsed >= args.seconds and state["done"] >= args.requests) or \
                elapsed >= 4 * args.seconds or state["sent"] >= args.max_requests

        def client():
            while True:
                with lock:
                    if state["stop"] or enough():
                        state["stop"] = True
                        return
                    i = state["sent"]
                    state["sent"] += 1
                request = make_requests(1, f"{args.seed}:{i}", CONFIG["vocab_size"])[0]
                try:
                    answer = server.complete(*request)
                except Exception as e:  # counted below
                    answer = e
                bad = problem(request, answer)
                with lock:
                    state["done"] += 1
                    if bad:
                        state["errors"].append(f"request {i}: {bad}")
                    else:
                        state["tokens"] += request[1]

        threads = [threading.Thread(target=client, daemon=True) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            samples.append((time.monotonic() - t0, state["done"], worker.memory_info().rss / 2**20))
            if len(samples) % 12 == 0:
                s = samples[-1]
                print(f"soak: {s[0]:6.0f} s  {s[1]:6d} requests  {len(state['errors'])} errors  worker RSS "
                      f"{s[2]:.0f} MiB", flush=True)
            for t in threads:
                t.join(SAMPLE_S / len(threads))
        samples.append((time.monotonic() - t0, state["done"], worker.memory_info().rss / 2**20))
        log = server.log()
    served = any("Worker" in line and SERVES in line for line in log.splitlines())

    after = [s for s in samples if s[1] >= WARMUP * state["done"]]
    result = dict(
        command=" ".join([os.path.basename(sys.executable), *sys.argv]), plugin=not args.stock,
        plugin_serving=served, seconds=round(samples[-1][0], 1), requests=state["done"],
        errors=len(state["errors"]), first_errors=state["errors"][:5], tokens_out=state["tokens"],
        tokens_out_per_s=round(state["tokens"] / samples[-1][0], 1),
        concurrency=args.concurrency, rss_first_mib=round(samples[0][2], 1),
        rss_after_warmup_mib=round(after[0][2], 1), rss_end_mib=round(samples[-1][2], 1),
        rss_max_after_warmup_mib=round(max(s[2] for s in after), 1), samples=samples)
    growth = result["rss_max_after_warmup_mib"] - result["rss_after_warmup_mib"]
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    ok = not state["errors"] and growth <= args.rss_growth_mib and (served or args.stock)
    print(f"soak: {'PASS' if ok else 'FAIL'}: {state['done']} requests, {len(state['errors'])} errors, worker RSS "
          f"{result['rss_after_warmup_mib']:.0f} -> {result['rss_end_mib']:.0f} MiB after the warm-up "
          f"(max {result['rss_max_after_warmup_mib']:.0f}, growth bound {args.rss_growth_mib:.0f})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
