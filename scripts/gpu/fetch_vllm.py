#!/usr/bin/env python3
"""The worker of scripts/gpu/fetch_vllm.sh: resolves vLLM's wheels beyond the GPU image, downloads
them (pip download --no-deps per requirement, cp312 manylinux x86_64) and packs them into carry
parts of at most PART_MIB MiB.

    fetch_vllm.py resolve DL_DIR            downloads what is missing into DL_DIR, writes DL_DIR/resolved.json
    fetch_vllm.py verify DL_DIR             the vLLM wheel pins the image's torch and links libcudart.so.13
    fetch_vllm.py pack DL_DIR CARRY_DIR     parts under CARRY_DIR/part_NN/ (see fetch_vllm.sh)

Resolution: from vllm==VERSION's Requires-Dist (markers evaluated for CPython 3.12 on x86_64
Linux, extras followed), every requirement whose name the GPU image already holds is left to the
image (checked against the version where the image's version is known; vLLM's install stage
checks the rest there, since pip resolves against the image's packages); every other is downloaded
as the newest wheel that satisfies every specifier met so far, and its own requirements followed.
A later, narrower specifier re-downloads. Standard library and pip's vendored `packaging` only.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare Python: pip's own copy of the same library
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

VLLM = os.environ.get("VLLM_VERSION", "0.26.0")

# The GPU image's Python packages (the device library's KINDS.md, "Python packages already there",
# read on 2026-11-17), with the versions one session's pip list showed there where known.
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
IMAGE_VERSIONS = {
    "accelerate": "1.15.0", "cupy-cuda13x": "14.2.0", "huggingface-hub": "1.33.0", "jax": "0.11.2",
    "numpy": "2.5.2", "onnx": "1.23.1", "safetensors": "0.8.0", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
    "tokenizers": "0.23.2", "torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0",
    "transformers": "5.17.0", "triton": "3.6.0",
}
IMAGE_SET = {canonicalize_name(n) for n in IMAGE} | {"huggingface-hub"}

# Resolved but not carried: what a Llama-shaped decode on Hopper (FlashAttention 3, CUDA graphs)
# and `vllm serve` do not import (vLLM imports these inside the features that use them). Carrying
# the whole resolution is ~890 MiB of wheels; these are ~620 MiB of it. vllm-install installs with
# --no-deps, then imports vllm and runs it, so a wrong guess shows as the missing module's name.
NOT_CARRIED = {
    "tokenspeed-mla": "MLA (DeepSeek-style) decode kernels",
    "tokenspeed-triton": "the Triton fork of tokenspeed-mla",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (FA4 on Blackwell, Mamba, MLA/DSA indexers, some MoE)",
    "nvidia-cutlass-dsl-libs-base": "of nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-core": "of nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-cu12": "of nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13": "of nvidia-cutlass-dsl",
    "cuda-python": "of nvidia-cutlass-dsl", "nvidia-cuda-nvdisasm": "of nvidia-cutlass-dsl",
    "quack-kernels": "CuTe DSL kernels (needs nvidia-cutlass-dsl)",
    "humming-kernels": "quantized / MoE kernels JIT-built with its own nvcc",
    "nvidia-cuda-nvcc": "of humming-kernels (the image has nvcc)", "nvidia-nvvm": "of humming-kernels",
    "nvidia-cuda-cccl": "of humming-kernels", "nvidia-cuda-crt": "of humming-kernels", "pyelftools": "of humming-kernels",
    "tilelang": "TileLang kernels (sparse attention of some models)", "z3-solver": "of tilelang",
    "torch-c-dlpack-ext": "of tilelang",
    "pynvvideocodec": "video decoding (multimodal inputs)", "torchcodec": "audio/video decoding (multimodal inputs)",
    "flashinfer-python": "the FlashInfer backend, not vLLM's default on Hopper (FLASH_ATTN, FA3); absent, vLLM "
                         "samples with its own kernels", "cuda-tile": "of flashinfer-python",
    "numpy": "the image's numpy 2.5.2 serves (the <2.4 caps come from tilelang, flashinfer and mistral-common's "
             "metadata)",
}
# Members of the vLLM wheel left out: FlashAttention 2's extension (Ampere's; on sm_90 vLLM takes
# FA3, and imports FA2 under try/except) and the optional Rust frontend (VLLM_RUST_FRONTEND_PATH).
VLLM_DROP = ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs"]

PLATFORMS = ["manylinux_2_%d_x86_64" % n for n in (39, 38, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def environment(extra=""):
    env = default_environment()
    env.update({"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "platform_machine": "x86_64",
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "extra": extra})
    return env


def applies(req, extras):
    """Whether requirement `req` of a package installed with `extras` applies on the GPU image."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate(environment(e)) for e in (sorted(extras) or [""]) + [""])


def wheel_meta(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(name).decode("utf-8", "replace")
    head = text.split("\n\n", 1)[0]
    reqs = [line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("Requires-Dist:")]
    version = next(line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("Version:"))
    return version, reqs


def wheel_name_version(filename):
    parts = filename.split("-")
    return canonicalize_name(parts[0]), parts[1]


class NoVersion(Exception):
    """No wheel of `name` satisfies the specifiers met so far; `versions` are those on the index."""

    def __init__(self, name, versions):
        super().__init__(name)
        self.name, self.versions = name, versions


def download(dl, name, spec):
    """The newest wheel of `name` satisfying `spec` into dl (reused when already there); its path."""
    for f in sorted(os.listdir(dl)):
        if f.endswith(".whl"):
            n, v = wheel_name_version(f)
            if n == name and spec.contains(v, prereleases=True):
                return os.path.join(dl, f)
    before = set(os.listdir(dl))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += ["-d", dl, f"{name}{spec}"]
    print(f"  downloading {name}{spec}", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"\(from versions: ([^)]*)\)", r.stderr)
    if r.returncode != 0 and m:
        raise NoVersion(name, [v.strip() for v in m.group(1).split(",") if v.strip()])
    if r.returncode != 0:
        sys.exit(f"fetch_vllm: pip download {name}{spec} failed (no cp312 manylinux x86_64 wheel?):\n{r.stderr[-2000:]}")
    new = [f for f in set(os.listdir(dl)) - before if f.endswith(".whl")]
    for f in new:
        if wheel_name_version(f)[0] == name:
            return os.path.join(dl, f)
    # pip found it already there under another spelling of the name
    for f in sorted(os.listdir(dl)):
        if f.endswith(".whl") and wheel_name_version(f)[0] == name and spec.contains(wheel_name_version(f)[1], prereleases=True):
            return os.path.join(dl, f)
    sys.exit(f"fetch_vllm: pip download {name}{spec} saved no wheel of {name} in {dl}")


def resolve(dl):
    """Resolves, backtracking by exclusion: where no version of a package satisfies every specifier,
    the current versions of the packages whose own requirement on it excludes every version the
    fixed (==) requirements admit are excluded (name!=version), and the resolution starts again
    (downloads are kept, so a restart costs only the new wheels)."""
    os.makedirs(dl, exist_ok=True)
    excluded = {}  # name -> [versions ruled out]
    for attempt in range(60):
        try:
            return resolve_once(dl, excluded)
        except Backtrack as b:
            for n, v in b.culprits:
                print(f"  backtracking: {n}=={v} requires {b.name}{b.wanted[n]}, against {b.name}{b.fixed}: "
                      f"trying an older {n}", flush=True)
                excluded.setdefault(n, []).append(v)
    sys.exit("fetch_vllm: no consistent set of wheels after 60 restarts")


class Backtrack(Exception):
    def __init__(self, name, fixed, wanted, culprits):
        super().__init__(name)
        self.name, self.fixed, self.wanted, self.culprits = name, fixed, wanted, culprits


def find_culprits(name, contributions, versions, chosen_versions):
    """The (package, version) pairs to exclude when no version of `name` satisfies every
    contribution [(parent, parent version, specifier)]: fixed = the contributions of parents that are
    themselves pinned (==, or the root), culprits = the others whose specifier, with fixed, admits no
    version on the index."""
    fixed = SpecifierSet(",".join(str(sp) for p, pv, sp, pinned in contributions if pinned and str(sp)))
    admitted = [v for v in versions if fixed.contains(v, prereleases=True)]
    culprits, wanted = [], {}
    for p, pv, sp, pinned in contributions:
        if pinned:
            continue
        if not any(sp.contains(v, prereleases=True) for v in admitted):
            culprits.append((p, pv))
            wanted[p] = str(sp)
    if not culprits:
        sys.exit(f"fetch_vllm: no version of {name} satisfies {[(p, pv, str(sp)) for p, pv, sp, _ in contributions]} "
                 f"(index: {versions}); the fixed requirements alone conflict")
    return Backtrack(name, str(fixed), wanted, culprits)


def resolve_once(dl, excluded):
    specs = {}    # name -> SpecifierSet: every specifier met so far
    contrib = {}  # name -> [(parent, parent version, specifier, parent pinned by ==)]
    extras = {}   # name -> set of extras asked for
    chosen = {}   # name -> wheel path
    done = {}     # name -> (version, frozenset of extras) whose requirements were followed
    via = {}      # name -> who first asked for it
    image = {}    # name -> (specifier, version known or None)
    queue = [(Requirement(f"vllm=={VLLM}"), "(root)", "", True)]
    while queue:
        req, parent, parent_version, parent_pinned = queue.pop(0)
        name = canonicalize_name(req.name)
        if name not in specs:
            ex = ",".join(f"!={v}" for v in excluded.get(name, []))
            specs[name] = SpecifierSet(ex)
        specs[name] = SpecifierSet(",".join(s for s in (str(specs[name]), str(req.specifier)) if s))
        contrib.setdefault(name, []).append((parent, parent_version, req.specifier, parent_pinned))
        extras.setdefault(name, set()).update(req.extras)
        via.setdefault(name, f"{parent}=={parent_version}" if parent_version else parent)
        if name in IMAGE_SET:
            known = IMAGE_VERSIONS.get(name)
            if known is None or specs[name].contains(known, prereleases=True):
                image[name] = (str(specs[name]), known)
                continue
            print(f"  {name}: the image's {known} does not satisfy {specs[name]} (from {parent}): carried", flush=True)
            image.pop(name, None)
        path = chosen.get(name)
        if path is None or not specs[name].contains(wheel_name_version(os.path.basename(path))[1], prereleases=True):
            try:
                path = download(dl, name, specs[name])
            except NoVersion as e:
                raise find_culprits(name, contrib[name], e.versions, chosen)
            chosen[name] = path
        version, reqs = wheel_meta(path)
        key = (version, frozenset(extras[name]))
        if done.get(name) == key:
            continue
        done[name] = key
        pinned = parent == "(root)" or any(sp.operator == "==" for c in contrib[name] for sp in c[2])
        for r in reqs:
            rq = Requirement(r)
            if applies(rq, extras[name]):
                queue.append((rq, name, version, pinned))
    out = {
        "vllm": VLLM,
        "carried": {n: {"wheel": os.path.basename(p), "version": wheel_name_version(os.path.basename(p))[1],
                        "specifier": str(specs[n]), "via": via[n], "bytes": os.path.getsize(p)}
                    for n, p in sorted(chosen.items())},
        "image": {n: {"specifier": s, "version_known": v, "via": via[n]} for n, (s, v) in sorted(image.items())},
    }
    # Wheels left over from an older resolution would travel for nothing.
    keep = {os.path.basename(p) for p in chosen.values()}
    for f in os.listdir(dl):
        if f.endswith(".whl") and f not in keep:
            print(f"  removing {f} (not in this resolution)")
            os.remove(os.path.join(dl, f))
    with open(os.path.join(dl, "resolved.json"), "w") as f:
        json.dump(out, f, indent=1)
    total = sum(c["bytes"] for c in out["carried"].values())
    print(f"resolved: {len(out['carried'])} wheels to carry ({total / 2**20:.1f} MiB as wheels), "
          f"{len(out['image'])} requirements left to the image")
    return out


def elf_needed(data):
    """DT_NEEDED names of a 64-bit little-endian ELF shared object (its dynamic section)."""
    import struct
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dyn = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
    if dyn is None:
        return []
    strtab = sections[dyn[6]]  # sh_link: the dynamic string table
    names = []
    for off in range(dyn[4], dyn[4] + dyn[5], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            start = strtab[4] + val
            names.append(data[start:data.index(b"\0", start)].decode())
    return names


def verify(dl):
    """The vLLM wheel runs on the GPU image: Requires-Dist pins torch==2.11.0 (the image's) and its
    main extension links libcudart.so.13 (CUDA 13, the image's)."""
    res = json.load(open(os.path.join(dl, "resolved.json")))
    whl = os.path.join(dl, res["carried"]["vllm"]["wheel"])
    _, reqs = wheel_meta(whl)
    torch_pins = [r for r in reqs if canonicalize_name(Requirement(r).name) == "torch"]
    with zipfile.ZipFile(whl) as z:
        needed = elf_needed(z.read("vllm/_C_stable_libtorch.abi3.so"))
    cudart = [n for n in needed if n.startswith("libcudart.so")]
    print(f"verify: {os.path.basename(whl)}: Requires-Dist {torch_pins}; vllm/_C_stable_libtorch.abi3.so "
          f"needs {cudart}")
    ok = any(Requirement(r).specifier == SpecifierSet("==" + IMAGE_VERSIONS["torch"]) for r in torch_pins)
    if not ok or cudart != ["libcudart.so.13"]:
        sys.exit(f"fetch_vllm: vLLM {res['vllm']} does not match the image (torch {IMAGE_VERSIONS['torch']}, "
                 f"libcudart.so.13): {torch_pins}, {cudart}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(dl, carry, part_mib):
    """Every carried wheel as NAME.whl.tar.xz (wheel_xz.py, reused while its source is unchanged), all
    of them in one tar stream cut into parts of part_mib MiB: carry/part_NN/{vllm.tar.part_NN,
    SHA256SUMS, MANIFEST}. MANIFEST (the same in every part) lists the parts with their sha256 and
    the wheels with theirs; run_all.sh vllm-install checks both."""
    res = json.load(open(os.path.join(dl, "resolved.json")))
    xz_dir = os.path.join(dl, "xz")
    os.makedirs(xz_dir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    packed = []
    for name, c in res["carried"].items():
        if name in NOT_CARRIED:
            continue
        whl = os.path.join(dl, c["wheel"])
        out = os.path.join(xz_dir, c["wheel"] + ".tar.xz")
        stamp = out + ".src_sha256"
        drop = VLLM_DROP if name == "vllm" else []
        src = sha256(whl) + (" drop " + " ".join(drop) if drop else "")  # what the xz tar was made from
        if not (os.path.exists(out) and os.path.exists(stamp) and open(stamp).read().strip() == src):
            print(f"  repacking {c['wheel']} ({c['bytes'] / 2**20:.1f} MiB)", flush=True)
            cmd = [sys.executable, os.path.join(here, "wheel_xz.py"), "pack", whl, out]
            for m in drop:
                cmd += ["--drop", m]
            subprocess.run(cmd, check=True)
            with open(stamp, "w") as f:
                f.write(src + "\n")
        packed.append(out)
    stream = os.path.join(dl, "vllm.tar")
    with tarfile.open(stream, "w", format=tarfile.PAX_FORMAT) as t:
        for p in sorted(packed):
            ti = t.gettarinfo(p, arcname=os.path.basename(p))
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
            with open(p, "rb") as f:
                t.addfile(ti, f)
    part_bytes = int(part_mib * 2**20)
    size = os.path.getsize(stream)
    n_parts = (size + part_bytes - 1) // part_bytes
    for d in os.listdir(carry) if os.path.isdir(carry) else []:
        if d.startswith("part_"):
            for f in os.listdir(os.path.join(carry, d)):
                os.remove(os.path.join(carry, d, f))
            os.rmdir(os.path.join(carry, d))
    parts = []
    with open(stream, "rb") as f:
        for i in range(n_parts):
            d = os.path.join(carry, f"part_{i:02d}")
            os.makedirs(d, exist_ok=True)
            p = os.path.join(d, f"vllm.tar.part_{i:02d}")
            with open(p, "wb") as o:
                o.write(f.read(part_bytes))
            parts.append(p)
    manifest = {"vllm": res["vllm"], "n_parts": n_parts, "part_mib": part_mib, "tar_bytes": size,
                "tar_sha256": sha256(stream),
                "parts": {os.path.basename(p): {"sha256": sha256(p), "bytes": os.path.getsize(p)} for p in parts},
                "wheels": {os.path.basename(p)[: -len(".tar.xz")]: {"xz_sha256": sha256(p), "xz_bytes": os.path.getsize(p)}
                           for p in sorted(packed)},
                "carried": {n: c for n, c in res["carried"].items() if n not in NOT_CARRIED},
                "not_carried": {n: {**c, "why": NOT_CARRIED[n]} for n, c in res["carried"].items() if n in NOT_CARRIED},
                "vllm_dropped_members": VLLM_DROP, "image": res["image"]}
    os.remove(stream)
    for p in parts:
        d = os.path.dirname(p)
        with open(os.path.join(d, "SHA256SUMS"), "w") as f:
            f.write(f"{manifest['parts'][os.path.basename(p)]['sha256']}  {os.path.basename(p)}\n")
        with open(os.path.join(d, "MANIFEST.json"), "w") as f:
            json.dump(manifest, f, indent=1)
    with open(os.path.join(carry, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    xz_total = sum(w["xz_bytes"] for w in manifest["wheels"].values())
    print(f"packed: {len(packed)} wheels, {xz_total / 2**20:.1f} MiB as xz tars, {n_parts} parts of at most "
          f"{part_mib} MiB under {carry}/part_NN/")
    return manifest


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "resolve":
        resolve(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "verify":
        verify(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "pack":
        pack(sys.argv[2], sys.argv[3], float(os.environ.get("VLLM_PART_MIB", "32")))
    else:
        sys.exit(__doc__)
