"""The README's server: vLLM's OpenAI-compatible server (serve.py) on localhost serving the tiny Qwen3-Next
with MTP k=2, with the plugin (GDN_XPU_VLLM=1) and without it (vLLM's own kernels), each answering the same
REQUESTS /v1/completions requests from CONCURRENCY client threads over HTTP: prompts of 1..400 random
token ids, 1..64 tokens asked, greedy, end-of-sequence ignored. One server of each kind, shared by the
tests. That the plugin's results equal vLLM's kernels' is test_vllm.py's per-call check; here: every
request answered with all its tokens, the plugin running inside the server's worker, MTP's drafts
proposed through it. And the README's lines are the ones tests/setup_and_run.sh runs."""
import os
import re
import time

import pytest

from models import CONFIG
from serve import SERVER_MODULE, SERVES, Server, make_requests, problem, run_clients

REQUESTS, CONCURRENCY, SEED = 48, 8, 11
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    requests = make_requests(REQUESTS, SEED, CONFIG["vocab_size"])
    out = {}
    for name, plugin in (("plugin", True), ("stock", False)):
        with Server(model_dir, tmp / f"{name}.log", plugin) as server:
            t0 = time.monotonic()
            answers = run_clients(server, requests, CONCURRENCY)
            load_s = time.monotonic() - t0
            accepted = server.metric("vllm:spec_decode_num_accepted_tokens")
            drafts = server.metric("vllm:spec_decode_num_draft_tokens")
        out[name] = dict(answers=answers, log=server.log(), accepted=accepted, drafts=drafts,
                         start_s=server.start_s, load_s=load_s)
        print(f"{name} server: ready in {server.start_s:.0f} s, {REQUESTS} requests in {load_s:.0f} s, "
              f"{drafts:.0f} draft tokens, {accepted:.0f} accepted")
    return requests, out


@pytest.mark.parametrize("kind", ["plugin", "stock"])
def test_every_request_answered_with_all_its_tokens(served, kind):
    requests, out = served
    problems = [(i, p) for i, (r, a) in enumerate(zip(requests, out[kind]["answers"])) if (p := problem(r, a))]
    assert not problems, problems[:5]


def test_plugin_serves_inside_the_worker(served):
    log = served[1]["plugin"]["log"]
    assert any("Worker" in line and SERVES in line for line in log.splitlines()), log[-4000:]
    assert SERVES not in served[1]["stock"]["log"]


@pytest.mark.parametrize("kind", ["plugin", "stock"])
def test_mtp_drafts_each_step(served, kind):
    """MTP ran: the server's counters show k=2 draft tokens proposed at its decode steps (each verified
    with its drafts in one GDN call: the plugin's speculative path)."""
    run = served[1][kind]
    assert run["drafts"] >= 2 * CONCURRENCY and 0 <= run["accepted"] <= run["drafts"], (run["drafts"], run["accepted"])


def readme_serving_block():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split("## Serving with vLLM", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_readme_lines_are_the_tested_ones():
    """Each install line of the README's block is a line of tests/setup_and_run.sh's integration branch,
    and its server line is serve.py's command."""
    lines = [line.split("#", 1)[0].strip() for line in readme_serving_block().splitlines()]
    lines = [line for line in lines if line]
    script = open(os.path.join(ROOT, "tests", "setup_and_run.sh"), encoding="utf-8").read()
    branch = script.split('if [ "$what" = integration ]; then', 1)[1].split("\nelse", 1)[0]
    branch_lines = {line.strip() for line in branch.splitlines()}
    installs = [line for line in lines if line.startswith("pip ")]
    assert len(installs) >= 2 and all(line in branch_lines for line in installs), (installs, branch)
    assert any(line.startswith("export LD_PRELOAD=") and "libiomp5.so" in line for line in lines), lines
    assert any(line.startswith(f"GDN_XPU_VLLM=1 python -m {SERVER_MODULE} --model ") for line in lines), lines
