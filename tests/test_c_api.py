"""Builds the plain-C test program against the installed header and library (as a C consumer of
the wheel would: the wheel ships no executables) and runs it."""
import os
import subprocess

import pygdn
from pygdn import _lib
from helpers import C_DIR, build_c_program


def test_c_program_passes(tmp_path):
    exe = build_c_program(os.path.join(C_DIR, "test_c_api.c"), tmp_path)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "c_api: all checks passed" in run.stdout


def test_header_is_the_cffi_source():
    """pygdn declares the library from the installed header, and the struct layouts agree."""
    assert os.path.exists(_lib.HEADER_PATH)
    assert pygdn.ffi.sizeof("gdn_batch_t") == pygdn.lib.gdn_sizeof_batch()
    assert pygdn.lib.gdn_abi_version() == pygdn.lib.GDN_ABI_VERSION
    assert pygdn.version() == "%d.%d.%d" % (pygdn.lib.GDN_VERSION_MAJOR, pygdn.lib.GDN_VERSION_MINOR,
                                            pygdn.lib.GDN_VERSION_PATCH)
