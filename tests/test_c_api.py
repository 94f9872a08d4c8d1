"""Builds the plain-C test program against the installed header and library (as a C consumer of
the wheel would: the wheel ships no executables) and runs it."""
import os
import shutil
import subprocess

import pygdn
from pygdn import _lib

C_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c")


def build_c_program(source, out_dir):
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    exe = os.path.join(str(out_dir), os.path.splitext(os.path.basename(source))[0])
    built = subprocess.run([cc, "-std=c99", "-O1", "-Wall", source, "-o", exe, *_lib.c_build_args(), "-lm"],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    return exe


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
