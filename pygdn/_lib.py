"""Loads libgdn_xpu.so with cffi in ABI mode, declaring it from the installed gdn_xpu.h.

The header is the one source of truth: the text between GDN_CDEF_BEGIN and GDN_CDEF_END is
fed to cffi as is (minus the GDN_API visibility macro), so Python cannot drift from C.
"""
from __future__ import annotations

import os as _os
import re as _re

import cffi as _cffi

_HERE = _os.path.dirname(_os.path.abspath(__file__))
HEADER_PATH = _os.environ.get("GDN_XPU_HEADER", _os.path.join(_HERE, "include", "gdn_xpu.h"))
EXPECTED_ABI = 1


def _installed_library(header: str) -> str:
    """The wheel installs libgdn_xpu.so.MAJOR (its SONAME) beside the package, in the folder
    meson-python gives a project's C libraries (.pygdn.mesonpy.libs). MAJOR is the header's."""
    with open(header, encoding="utf-8") as f:
        major = _re.search(r"#define GDN_VERSION_MAJOR (\d+)", f.read()).group(1)
    return _os.path.join(_os.path.dirname(_HERE), ".pygdn.mesonpy.libs", f"libgdn_xpu.so.{major}")


LIBRARY_PATH = _os.environ.get("GDN_XPU_LIBRARY") or _installed_library(HEADER_PATH)


def _cdef_from_header(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = _re.search(r"/\* GDN_CDEF_BEGIN \*/(.*)/\* GDN_CDEF_END \*/", text, _re.S)
    if not m:
        raise ImportError(f"{path}: no GDN_CDEF_BEGIN/END region")
    return _re.sub(r"\bGDN_API\b", "", m.group(1))


ffi = _cffi.FFI()
ffi.cdef(_cdef_from_header(HEADER_PATH))
lib = ffi.dlopen(LIBRARY_PATH)

if lib.gdn_abi_version() != EXPECTED_ABI:
    raise ImportError(f"{LIBRARY_PATH} has ABI {lib.gdn_abi_version()}, pygdn expects {EXPECTED_ABI}")
for _name in ("config", "batch", "tensors"):
    _ours = ffi.sizeof(f"gdn_{_name}_t")
    _theirs = getattr(lib, f"gdn_sizeof_{_name}")()
    if _ours != _theirs:
        raise ImportError(f"gdn_{_name}_t: cffi layout {_ours} bytes, library {_theirs} bytes")


def c_build_args() -> list:
    """cc arguments that compile and link a C program against this installed library: the
    header's folder, the library by path, and run paths to it and to the SYCL runtime it loads
    (<prefix>/lib, its own RUNPATH $ORIGIN/../../..). The wheel ships no executables; the tests
    and the benchmark build their C programs with these."""
    libdir = _os.path.dirname(LIBRARY_PATH)
    sycl_libdir = _os.path.normpath(_os.path.join(libdir, _os.pardir, _os.pardir, _os.pardir))
    return ["-I" + _os.path.dirname(HEADER_PATH), LIBRARY_PATH, "-Wl,-rpath," + libdir,
            "-Wl,-rpath-link," + sycl_libdir]


def version() -> str:
    return ffi.string(lib.gdn_version()).decode()


def last_error() -> str:
    return ffi.string(lib.gdn_last_error()).decode()


def status_name(status: int) -> str:
    for name in dir(lib):
        if name.startswith("GDN_ERROR_") or name == "GDN_SUCCESS":
            if getattr(lib, name) == status:
                return name
    return f"status {status}"
