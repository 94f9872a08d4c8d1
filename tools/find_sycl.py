"""Build step: print the prefix holding include/sycl/sycl.hpp and lib/libsycl.so.

meson.build runs this with the Python that builds us. Under `pip install .` (build isolation on)
that Python's sys.prefix is the *target* environment, while the build requirement intel-sycl-rt
was installed into pip's temporary build environment, which is only on sys.path (docs/usage.md
"Installing", Building). So look where the installed distribution really put its files, then fall
back to the prefixes of sys.path and to a oneAPI installation (CMPLR_ROOT).
"""
import importlib.metadata
import os
import sys

HEADER = os.path.join("include", "sycl", "sycl.hpp")


def has_sycl(prefix: str) -> bool:
    return os.path.isfile(os.path.join(prefix, HEADER)) and os.path.isdir(os.path.join(prefix, "lib"))


def from_distribution():
    """The prefix the intel-sycl-rt wheel was installed into (its RECORD lists the header)."""
    try:
        dist = importlib.metadata.distribution("intel-sycl-rt")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.as_posix().endswith("include/sycl/sycl.hpp"):
            header = os.path.normpath(str(f.locate()))
            return header[: -len(HEADER) - 1]
    return None


def candidates():
    yield from_distribution()
    # <prefix>/lib/pythonX.Y/site-packages -> <prefix>, for every entry of sys.path
    for entry in sys.path:
        if os.path.basename(entry) == "site-packages":
            yield os.path.normpath(os.path.join(entry, os.pardir, os.pardir, os.pardir))
    yield sys.prefix
    yield sys.base_prefix
    yield os.environ.get("CMPLR_ROOT")  # set by oneAPI's setvars.sh


def main() -> int:
    for prefix in candidates():
        if prefix and has_sycl(prefix):
            print(prefix)
            return 0
    sys.stderr.write("sycl/sycl.hpp not found in the building Python environment (nor CMPLR_ROOT): "
                     "pip install intel-sycl-rt==2026.1.2, or pass -Dsycl_prefix=<prefix with include/sycl>\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
