"""How the benchmark times things on a shared 2-core machine: other processes' share of the CPU
(CpuWatch), waiting for a quiet machine, and the timing loops."""
from __future__ import annotations

import os
import statistics
import time

FOREIGN_FLAG = 0.05   # flag rows during which other processes used more than this share of the CPU
RETRY_SHARE = 0.15    # ... and measure a case again (once, within a time budget) above this share
LATE_BUDGET_S = 0.5    # repeat budget per implementation once past the run's soft deadline
SWITCH_PAUSE_S = 0.15  # pause between implementations (see timed_blocks)
WARM_S = 0.02          # ... after which each one runs untimed for at least this long (and one turn, see below)
QUIET_SHARE = 0.05    # before a case, wait (within a time budget) for other processes to drop below this


class CpuWatch:
    """How much of the machine's CPU time went to OTHER processes over an interval (from
    /proc/stat minus the rusage of this process and its children): a benchmark sharing 2 cores
    with other work measures that work too, so rows with a high share are flagged."""

    def __init__(self):
        self.t, self.busy, self.own = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
            return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            return float("nan")

    @staticmethod
    def _own():
        """CPU time of this process and of its finished children: the C host-overhead program and
        its compiler run as children, and are the benchmark's own work, not other processes'."""
        import resource
        t = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            t += r.ru_utime + r.ru_stime
        return t

    def foreign(self):
        wall = time.perf_counter() - self.t
        other = (self._busy() - self.busy) - (self._own() - self.own)
        return max(0.0, other / (wall * (os.cpu_count() or 1))) if wall > 0 else 0.0


def wait_quiet(plan):
    """Before a case: wait (within plan["quiet_left_s"] for the whole run) until other processes
    leave the CPU mostly idle. Returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < plan["quiet_left_s"]:
        w = CpuWatch()
        time.sleep(0.3)
        if w.foreign() < QUIET_SHARE:
            break
    waited = time.perf_counter() - t0
    plan["quiet_left_s"] = max(0.0, plan["quiet_left_s"] - waited)
    return waited


def settle():
    # Let other runtimes' worker threads (OpenBLAS, OpenMP, TBB) stop spinning before a timing.
    time.sleep(0.05)


def timed_blocks(impls, budget_s, together=(), rounds=5):
    """Each implementation in turn: a pause (other libraries' idle worker threads stop spinning:
    OpenBLAS's spin up to ~0.1 s after a threaded call), untimed steps for WARM_S and at least one
    turn (they wake its own threads and caches: on this 2-core VM, steps right after the pause and
    one untimed step ran up to 2-3x slower for tens of ms -- decode B=1 0.45-0.51 ms against
    0.15-0.16 back to back), then its repeats back to back, as a serving loop would run it.
    A turn is fn.cycle calls (1 without it): a step that rotates over copies of its memory
    (cases.Rotating, machine.StatePass) touches each copy once in a turn. On a VM, memory left
    untouched for a few seconds costs more to touch again, and in these rounds every other block
    runs in between: decode B=8 over a 1.9 GiB rotation (118 copies), after 3 s with its copies
    idle, ran 3.8-12 ms a step after 20 ms of warm-up and 1.2-1.4 ms after one turn, as back to
    back (1.3 ms; Intel Xeon KVM guest, pygdn 0.3.1). In a serving loop every layer's state is
    touched once a step, so the timed repeats follow a whole turn.
    impls: name -> (fn, reps, first_s); each gets at most budget_s of repeats. The names in
    `together` (variants whose times are compared as ratios: our ssm layouts and state dtypes)
    split their repeats over `rounds` interleaved rounds, in alternating order, so this host's
    swings of minutes hit them alike (measured one block after another, a ratio moved up to ~3x
    between runs; the kv/vk ratio of spec S=1 B=1, this procedure run 12 times in one process:
    0.76-1.39 with 3 rounds of 5 repeats, 0.68-1.05 with 5 rounds of 3, standard deviation 0.19
    -> 0.10). Returns (name -> stats, share of the CPU other processes used meanwhile)."""
    stats, times = {}, {}
    watch = CpuWatch()

    def block(n, want):
        fn, _, first = impls[n]
        time.sleep(SWITCH_PAUSE_S)
        t0 = time.perf_counter()
        for _ in range(getattr(fn, "cycle", 1)):
            fn()
        if first * (want + 1) <= budget_s:
            while time.perf_counter() - t0 < WARM_S:
                fn()
        times.setdefault(n, []).extend(call_times(fn, want))

    def wanted(n):
        fn, reps, first = impls[n]
        return max(1, min(reps, int(budget_s / first))) if first > 0 else reps

    group = [n for n in impls if n in together and impls[n][2] < budget_s]
    for n, (fn, reps, first) in impls.items():
        if first >= budget_s:
            # One step takes longer than the whole budget (a loaded machine, or a slow peer):
            # the first (warm-up / check) call is the measurement.
            stats[n] = {"median_s": first, "min_s": first, "reps": 1, "first_call_only": True}
        elif n not in group:
            block(n, wanted(n))
        elif n == group[0]:
            for r in range(rounds):
                for m in (group if r % 2 == 0 else group[::-1]):
                    want = wanted(m)
                    share = want // rounds + (1 if r < want % rounds else 0)
                    if share:
                        block(m, share)
    for n, ts in times.items():
        stats[n] = {"median_s": statistics.median(ts), "min_s": min(ts), "reps": len(ts)}
    return stats, watch.foreign()


def first_call_s(fn):
    """Seconds of one fn() call."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def call_times(fn, n):
    """Wall seconds of each of n back-to-back fn() calls."""
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def best_seconds(fn, repeat=3):
    """fn() once to warm up, then the best wall time of `repeat` calls."""
    fn()
    return min(call_times(fn, repeat))


def us_per_call(fn, calls, finish=None):
    """µs per fn() over calls back-to-back calls (finish(), e.g. one queue.wait, inside the timing)."""
    settle()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    if finish:
        finish()
    return (time.perf_counter() - t) / calls * 1e6
