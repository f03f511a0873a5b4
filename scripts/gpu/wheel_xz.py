#!/usr/bin/env python3
"""Carries Python wheels in fewer bytes: a wheel is a deflate zip; its members repacked as an
xz tar are 3-4x smaller (flashinfer-python 0.7.2.post1: 62 MB -> ~18 MB), which lets the
FlashInfer wheels travel within a device call's 64 MiB carry limit.

    wheel_xz.py pack WHEEL OUT.tar.xz [--drop MEMBER]...
                                          (here) the wheel's members, in its order, as an xz tar;
                                          --drop leaves a member out (and its RECORD line)
    wheel_xz.py unpack IN.tar.xz OUTDIR   (there) the wheel rebuilt in OUTDIR (stored zip, same
                                          name and members), ready for pip install --no-index

The rebuilt wheel holds the same member names, bytes and modes as the original (pip installs it
the same way), less any member dropped at packing; only the zip compression differs. Standard library only.
"""
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile


def pack(wheel, out, drop=()):
    tmp = out + ".tmp"
    buf = io.BytesIO()
    drop = set(drop)
    with zipfile.ZipFile(wheel) as z, tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        missing = drop - set(z.namelist())
        if missing:
            sys.exit(f"pack: {wheel} has no member {sorted(missing)} to drop")
        for info in z.infolist():
            if info.is_dir() or info.filename in drop:
                continue
            data = z.read(info)
            if drop and info.filename.endswith(".dist-info/RECORD"):
                # the dropped members leave the RECORD too, so pip installs no stale entry
                data = b"".join(l for l in data.splitlines(keepends=True)
                                if l.split(b",", 1)[0].decode() not in drop)
            ti = tarfile.TarInfo(info.filename)
            ti.size = len(data)
            mode = (info.external_attr >> 16) & 0o777
            ti.mode = mode or 0o644
            ti.mtime = 0
            t.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    if shutil.which("xz"):
        with open(tmp, "wb") as f:
            subprocess.run(["xz", "-6", "-T0", "-c"], input=raw, stdout=f, check=True)
    else:
        import lzma
        with open(tmp, "wb") as f:
            f.write(lzma.compress(raw, preset=6))
    os.replace(tmp, out)


def unpack(archive, outdir):
    name = os.path.basename(archive)
    if not name.endswith(".whl.tar.xz"):
        sys.exit(f"unpack: {archive}: expected NAME.whl.tar.xz")
    wheel = os.path.join(outdir, name[: -len(".tar.xz")])
    tmp = wheel + ".tmp"
    with tarfile.open(archive, mode="r:xz") as t, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for ti in t:
            if not ti.isfile():
                continue
            zi = zipfile.ZipInfo(ti.name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | (ti.mode & 0o777)) << 16
            z.writestr(zi, t.extractfile(ti).read())
    os.replace(tmp, wheel)
    print(wheel)


if __name__ == "__main__":
    args = sys.argv[1:]
    drop = [args[i + 1] for i, a in enumerate(args) if a == "--drop" and i + 1 < len(args)]
    args = [a for i, a in enumerate(args) if a != "--drop" and (i == 0 or args[i - 1] != "--drop")]
    if len(args) != 3 or args[0] not in ("pack", "unpack") or (drop and args[0] != "pack"):
        sys.exit(__doc__)
    if args[0] == "pack":
        pack(args[1], args[2], drop)
    else:
        unpack(args[1], args[2])
