"""The library and the wheel as packagers and C projects see them: exported symbols, SONAME and
RUNPATH of the installed library, the wheel's tag and contents, libgdn_xpu as a meson
subproject of a C project, and `pip install .` of a clean clone in a fresh venv."""
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

import pytest

import pygdn
from pygdn import _lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI_RUNTIME = os.path.join(REPO, "tests", "ci-runtime.txt")


def readelf(*args):
    if not shutil.which("readelf"):
        pytest.skip("readelf (binutils) is not installed")
    return subprocess.run(["readelf", "-W", *args, _lib.LIBRARY_PATH], capture_output=True, text=True,
                          check=True).stdout


def header_functions():
    with open(_lib.HEADER_PATH, encoding="utf-8") as f:
        return set(re.findall(r"^GDN_API\b[^;(]*?\b(gdn_\w+)\s*\(", f.read(), re.M))


# ---------------------------------------------------------------- the installed library (readelf)
def test_exports_only_the_c_abi():
    defined = set()
    for line in readelf("--dyn-syms").splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) >= 8 and f[0].endswith(":") and f[6] != "UND" and f[3] in ("FUNC", "OBJECT", "IFUNC", "TLS"):
            defined.add(f[7].split("@")[0])
    assert defined == header_functions(), f"exported beyond gdn_*: {sorted(defined - header_functions())}"


def test_soname_is_versioned():
    soname = re.search(r"\(SONAME\)\s+Library soname: \[(.*)\]", readelf("-d")).group(1)
    assert soname == f"libgdn_xpu.so.{pygdn.lib.GDN_VERSION_MAJOR}"
    assert os.path.basename(_lib.LIBRARY_PATH) == soname


def test_runpath_has_no_build_machine_path():
    entries = []
    for m in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", readelf("-d")):
        entries += m.group(1).split(":")
    assert entries, "no RUNPATH: libsycl.so.9 of the venv would not be found"
    assert all(e.startswith("$ORIGIN") for e in entries), entries


# ---------------------------------------------------------------- the wheel
def test_wheel_is_tagged_for_any_python_and_ships_no_programs():
    dist = importlib.metadata.distribution("pygdn")
    tags = [line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    assert tags and all(t.startswith("py3-none-") and not t.endswith("-any") for t in tags), tags
    files = [str(f) for f in dist.files]
    assert any(f.endswith("licenses/LICENSE") for f in files), files
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    natives = []
    for f in dist.files:
        path = f.locate()
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    natives.append(os.path.basename(f))
    assert natives == [os.path.basename(_lib.LIBRARY_PATH)], natives


def test_python_m_pygdn_help(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pygdn", "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "demo" in run.stdout


def test_build_requirement_is_the_ci_runtime():
    """The wheel is built against the oldest supported runtime, the one CI runs on."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    with open(CI_RUNTIME, encoding="utf-8") as f:
        ci = dict(line.strip().split("==") for line in f if "==" in line and not line.startswith("#"))
    build = [r for r in project["build-system"]["requires"] if r.startswith("intel-sycl-rt")]
    assert build == [f"intel-sycl-rt=={ci['intel-sycl-rt']}"]
    lower = f">={ci['intel-sycl-rt']},"
    for name in ("intel-sycl-rt", "dpcpp-cpp-rt", "intel-opencl-rt"):
        assert any(r.startswith(name + lower) for r in project["project"]["dependencies"]), name


# ---------------------------------------------------------------- a C project using us as a subproject
def test_meson_subproject_consumer(tmp_path):
    meson, ninja = shutil.which("meson"), shutil.which("ninja")
    if not (meson and ninja):
        pytest.skip("meson and ninja are needed (pip install meson ninja)")
    proj = tmp_path / "consumer"
    shutil.copytree(os.path.join(REPO, "tests", "meson_consumer"), proj)
    (proj / "subprojects").mkdir()
    os.symlink(REPO, proj / "subprojects" / "libgdn_xpu")
    build = proj / "build"

    def step(*args):
        run = subprocess.run([meson, *args], cwd=proj, capture_output=True, text=True, timeout=1200)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    # The subproject finds the SYCL headers through the Python that runs meson (this venv).
    step("setup", str(build), "--force-fallback-for=gdn_xpu")
    step("compile", "-C", str(build))
    exe = str(build / "conv_from_c")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "conv_from_c: ok" in run.stdout

    # Without OCL_ICD_FILENAMES the wheel's OpenCL CPU runtime is invisible: the error must say so.
    env = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_FILENAMES", "ONEAPI_DEVICE_SELECTOR")}
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600, env=env)
    if run.returncode == 0:
        pytest.skip("a CPU device is registered system-wide: the missing-device hint cannot be provoked")
    assert "OCL_ICD_FILENAMES" in run.stderr and "ONEAPI_DEVICE_SELECTOR" in run.stderr, run.stderr


# ---------------------------------------------------------------- `pip install .` in a fresh venv
@pytest.mark.install
def test_pip_install_of_a_clean_clone(tmp_path):
    """The standard command, with build isolation: the build must find the SYCL headers in pip's
    build environment, not in the target venv. The runtime is constrained to the CI set so that
    pip takes the wheels from its cache, and the warmup finds the suite's compiled kernels."""
    src = tmp_path / "src"
    if os.path.exists(os.path.join(REPO, ".git")) and shutil.which("git"):
        subprocess.run(["git", "clone", "-q", REPO, str(src)], check=True, timeout=300)
    else:  # an unpacked sdist
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv*", ".sycl-cache*", "build*", "__pycache__"))
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # OCL_ICD_FILENAMES dropped: the new venv's pygdn must point OpenCL at its own CPU runtime.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "OCL_ICD_FILENAMES")}
    env.update(PIP_CONSTRAINT=CI_RUNTIME, PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)], env=env, capture_output=True,
                         text=True, timeout=1800)
    assert pip.returncode == 0, pip.stdout[-4000:] + pip.stderr[-4000:]
    code = ("import dpctl, pygdn\n"
            "q = dpctl.SyclQueue('cpu', property='in_order')\n"
            "pygdn.warmup(q, pygdn.Config(num_k_heads=1, num_v_heads=1, head_k_dim=8, head_v_dim=8, num_slots=4))\n"
            "print(pygdn.__file__, pygdn.__version__)\n")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith(str(venv)), run.stdout
