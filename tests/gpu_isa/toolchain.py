"""A current Intel GPU compiler without installing anything: Debian unstable's (sid) `ocloc` with its IGC
and `spirv-val`, downloaded by apt-get into a private folder and run through the folder's own loader.

    python tests/gpu_isa/toolchain.py [--refresh]      # fetch (or find) it and print what it holds

apt-get runs with a private sources list (the host's Debian mirror, suite sid), private package lists
and cache, so it needs no root and changes nothing on the host; `dpkg-deb -x` unpacks the packages
into one folder with sid's C and C++ runtime libraries beside the compiler, which need a newer glibc
than a Debian 12 host has: the folder's `ld-linux-x86-64.so.2 --library-path <folder's libs>` runs
them. Only what compiling SPIR-V needs is fetched (intel-ocloc, IGC, the runtime libraries,
spirv-tools: ~35 MB to download, ~135 MB unpacked): the OpenCL C front end and the drivers are not.

The folder is reused until removed (or --refresh): GDN_GPU_TOOLCHAIN_DIR, else
$XDG_CACHE_HOME/gdn-gpu-toolchain (~/.cache/gdn-gpu-toolchain). sid moves: the package versions the
folder holds are in its versions.txt, and every table names them.
"""
from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# What ocloc needs to compile SPIR-V (IGC's library is resolved from intel-opencl-icd's dependencies,
# so a new soname, libigc3, is followed), and spirv-val.
PACKAGES = ("intel-ocloc", "libc6", "libstdc++6", "libgcc-s1", "zlib1g", "spirv-tools")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
LIB = "usr/lib/x86_64-linux-gnu"
TIMEOUT = 600  # seconds for any one apt-get call


class Unavailable(RuntimeError):
    """The toolchain cannot be had here; the message says why."""


@dataclass
class Toolchain:
    root: str      # the unpacked packages
    ocloc_bin: str

    def _run(self, binary: str) -> list[str]:
        lib = os.path.join(self.root, LIB)
        return [os.path.join(lib, "ld-linux-x86-64.so.2"), "--library-path", lib, binary]

    @property
    def ocloc(self) -> list[str]:
        return self._run(self.ocloc_bin)

    @property
    def spirv_val(self) -> list[str]:
        return self._run(os.path.join(self.root, "usr/bin/spirv-val"))

    def versions(self) -> dict[str, str]:
        path = os.path.join(os.path.dirname(self.root), "versions.txt")
        with open(path) as f:
            return dict(line.split(None, 1) for line in f.read().splitlines() if line.strip())

    def describe(self) -> str:
        """The compiler's name for tables: ocloc and IGC versions, from Debian sid."""
        v = self.versions()
        igc = next((v[p] for p in v if re.fullmatch(r"libigc\d+", p)), "?")
        return f"ocloc {v.get('intel-ocloc', '?')} (IGC {igc}), Debian sid's intel-ocloc"


def default_dir() -> str:
    if os.environ.get("GDN_GPU_TOOLCHAIN_DIR"):
        return os.environ["GDN_GPU_TOOLCHAIN_DIR"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gdn-gpu-toolchain")


def _existing(folder: str) -> Toolchain | None:
    bins = sorted(glob.glob(os.path.join(folder, "root/usr/bin/ocloc-*")))
    if bins and os.path.exists(os.path.join(folder, "versions.txt")):
        return Toolchain(os.path.join(folder, "root"), bins[-1])
    return None


def debian_mirror() -> str:
    """The host's Debian mirror (a URI ending in /debian in its apt sources), else deb.debian.org."""
    texts = []
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*")):
        try:
            with open(path) as f:
                texts.append(f.read())
        except OSError:
            pass
    for text in texts:
        for m in re.finditer(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1).rstrip("/")
    return DEFAULT_MIRROR


def _apt(work: str, *args: str, cwd: str | None = None) -> str:
    opts = [f"Dir::Etc::sourcelist={work}/sources.list", "Dir::Etc::sourceparts=-",
            f"Dir::State::lists={work}/lists", f"Dir::Cache={work}/cache", "Debug::NoLocking=1"]
    if os.geteuid() == 0:
        opts.append("APT::Sandbox::User=root")  # the private folders are not _apt's to write
    cmd = ["apt-get" if args[0] in ("update", "download") else "apt-cache"]
    for o in opts:
        cmd += ["-o", o]
    try:
        r = subprocess.run(cmd + list(args), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{' '.join(cmd[:1] + list(args[:1]))} took over {TIMEOUT} s") from None
    if r.returncode:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-4:])
        raise Unavailable(f"{cmd[0]} {args[0]} from Debian sid failed: {tail}")
    return r.stdout


def fetch(folder: str, refresh: bool = False) -> Toolchain:
    """Download and unpack the packages into folder (built aside, then renamed: concurrent runs are safe;
    a complete toolchain another run put there first is kept unless refresh)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise Unavailable(f"the packages are fetched for x86_64 Linux, not {platform.system()} {platform.machine()}")
    for t in ("apt-get", "apt-cache", "dpkg-deb"):
        if not shutil.which(t):
            raise Unavailable(f"{t} not found (a Debian-family host fetches the compiler with it)")
    parent, prefix = os.path.dirname(os.path.abspath(folder)), os.path.basename(folder) + ".partial-"
    os.makedirs(parent, exist_ok=True)
    for old in glob.glob(os.path.join(parent, prefix + "*")):  # what a killed run left
        if time.time() - os.path.getmtime(old) > 3 * TIMEOUT:
            shutil.rmtree(old, ignore_errors=True)
    work = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        for d in ("lists/partial", "cache/archives/partial", "debs"):
            os.makedirs(os.path.join(work, d))
        signed = f"[signed-by={KEYRING}] " if os.path.exists(KEYRING) else ""
        with open(os.path.join(work, "sources.list"), "w") as f:
            f.write(f"deb {signed}{debian_mirror()} sid main\n")
        _apt(work, "update")
        depends = re.search(r"(?m)^Depends:.*", _apt(work, "show", "intel-opencl-icd"))
        igc = sorted(set(re.findall(r"\b(libigc\d+)\b", depends.group(0) if depends else "")))
        if not igc:
            raise Unavailable("Debian sid's intel-opencl-icd names no libigcN package")
        debs = os.path.join(work, "debs")
        _apt(work, "download", *PACKAGES, *igc, cwd=debs)
        root = os.path.join(work, "root")
        versions = []
        for deb in sorted(os.listdir(debs)):
            path = os.path.join(debs, deb)
            subprocess.run(["dpkg-deb", "-x", path, root], check=True)
            fields = subprocess.run(["dpkg-deb", "-f", path, "Package", "Version"], capture_output=True, text=True,
                                    check=True).stdout
            versions.append(" ".join(v.split(":", 1)[1].strip() for v in fields.splitlines()))
        shutil.rmtree(os.path.join(root, "usr/share"), ignore_errors=True)
        lib = os.path.join(root, LIB)
        iga = sorted(glob.glob(os.path.join(lib, "libiga64.so.*")))
        if iga and not os.path.exists(os.path.join(lib, "libiga64.so")):
            os.symlink(os.path.basename(iga[0]), os.path.join(lib, "libiga64.so"))  # ocloc disasm loads this name
        with open(os.path.join(work, "versions.txt"), "w") as f:
            f.write("\n".join(versions) + "\n")
        for d in ("debs", "lists", "cache"):
            shutil.rmtree(os.path.join(work, d))
        tc = _existing(work)
        if tc is None:
            raise Unavailable("Debian sid's intel-ocloc holds no usr/bin/ocloc-*")
        r = subprocess.run(tc.ocloc + ["--version"], capture_output=True, text=True)
        if r.returncode:
            raise Unavailable(f"the unpacked ocloc does not run: {(r.stdout + r.stderr).strip()[-300:]}")
        if os.path.isdir(folder) and (refresh or _existing(folder) is None):
            shutil.rmtree(folder)
        try:
            os.rename(work, folder)
        except OSError:
            if _existing(folder) is None:  # (else another run's copy got there first: use that one)
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _existing(folder)


def get(folder: str | None = None, refresh: bool = False) -> Toolchain:
    """The toolchain in folder (default_dir()), fetched when missing; Unavailable says why it cannot be."""
    folder = folder or default_dir()
    tc = None if refresh else _existing(folder)
    return tc or fetch(folder, refresh)


if __name__ == "__main__":
    refresh = "--refresh" in sys.argv[1:]
    try:
        tc = get(refresh=refresh)
    except Unavailable as e:
        print(f"unavailable: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{tc.describe()}\nin {os.path.dirname(tc.root)}\nocloc: {' '.join(tc.ocloc)}")
    print("".join(f"  {p} {v}\n" for p, v in tc.versions().items()), end="")
