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
LIBRARY_PATH = _os.environ.get("GDN_XPU_LIBRARY", _os.path.join(_HERE, "libgdn_xpu.so"))
EXPECTED_ABI = 1


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
