"""python -m pygdn {demo,warmup,info,bench} [options]   (run with --help for each)

  demo    a Qwen3-Next MTP layer step on the default SYCL device, checked and timed
          (--model kimi-linear: a Kimi-Linear KDA layer step)
  warmup  compile the kernels of a deployment into the library's disk cache ahead of time
  info    the library version, the default device and the path a prefill takes there (f32, XMX, AMX, emulated bf16)
  bench   the benchmark; it is not part of the package: this runs benchmarks/bench.py of the
          source checkout the current directory is in (= python benchmarks/bench.py)
"""
import os
import sys


def _find_benchmark():
    """benchmarks/bench.py of the libgdn_xpu checkout holding the current directory, or None."""
    d = os.getcwd()
    while True:
        path = os.path.join(d, "benchmarks", "bench.py")
        if os.path.isfile(path) and os.path.isfile(os.path.join(d, "include", "gdn_xpu.h")):
            return path
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _bench(argv) -> int:
    path = _find_benchmark()
    if path is None:
        print("python -m pygdn bench: the benchmark is not installed with pygdn; it lives in benchmarks/ of a "
              f"libgdn_xpu source checkout, and none holds {os.getcwd()}. Run it from a checkout: "
              "python benchmarks/bench.py [--quick]", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(path))  # its sibling modules (cases, peers, ...)
    import bench
    return bench.main(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv.pop(0) if argv else "demo"
    if cmd in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if cmd == "demo":
        from .demo import main as run
    elif cmd == "warmup":
        from .warmup import main as run
    elif cmd == "bench":
        return _bench(argv)
    elif cmd == "info":
        from .demo import info as run
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
