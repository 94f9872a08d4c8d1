"""Runs the plain-C test program (built by meson, installed next to the library)."""
import os
import subprocess

import pygdn


def test_c_program_passes():
    exe = os.path.join(os.path.dirname(pygdn.__file__), "gdn_c_api_test")
    assert os.path.exists(exe), f"{exe} missing: the package was not built with its C test"
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "c_api: all checks passed" in run.stdout


def test_header_is_the_cffi_source():
    """pygdn declares the library from the installed header, and the struct layouts agree."""
    from pygdn import _lib
    assert os.path.exists(_lib.HEADER_PATH)
    assert pygdn.ffi.sizeof("gdn_batch_t") == pygdn.lib.gdn_sizeof_batch()
    assert pygdn.lib.gdn_abi_version() == pygdn.lib.GDN_ABI_VERSION
    assert pygdn.version() == "%d.%d.%d" % (pygdn.lib.GDN_VERSION_MAJOR, pygdn.lib.GDN_VERSION_MINOR,
                                            pygdn.lib.GDN_VERSION_PATCH)
