"""Check this container before a long run: `torchlab doctor`; --help lists what it checks.

Each check is one row: ok, warn or fail, what was found, and for warn and fail the fix in words. A notebook
calls run_checks() and gets a Report: a list of Check rows that shows itself as an HTML table.
The defaults of --data, --workers, --batch-size, --prefetch-factor, --image-size and --run-dir are train.py's.
"""

import ctypes
import dataclasses
import html
import importlib.util
import json
import math
import os
import re
import shutil
import site
import subprocess
import sys
import time
from io import BytesIO

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from torchlab import config, environment, flavour, io, machine, parsing, resolve
from torchlab.data import folder, splits
from torchlab.pipeline import plan

OK, WARN, FAIL = "ok", "warn", "fail"
SEVERITY = {OK: 0, WARN: 1, FAIL: 2}
EXIT_FAIL = 1
GIB = 2**30
SUGGESTED_SHM_GIB = 8
# /dev/shm under twice what the batches in flight take leaves too little for anything else there.
SHM_HEADROOM = 2.0
# Checkpoints of a ResNet-50 with its optimiser state take ~200 MB each and train.py keeps three.
RUN_DIR_FAIL_BYTES = 1 * GIB
RUN_DIR_WARN_BYTES = 10 * GIB
# GPU memory already taken by others before this process starts: more than this share is worth a warning.
GPU_MEMORY_BUSY_SHARE = 0.5
MATMUL_SIZE = 1024
MATMUL_REPEATS = 10
MATMUL_TOLERANCE = 1e-2  # relative to the largest entry; TF32 lands near 1e-3, fp32 near 1e-6
CLASS_NAMES_SHOWN = 5
ENV_SPEC = "/opt/torchlab/environment.yml"  # the image's pins (the repository's environment.yml)
ENVSPEC = "/opt/torchlab/envspec.py"  # the build's reader of them (buildtools/envspec.py), which knows the flavours
DEVICE_DECODE_TOLERANCE = 3.0  # mean levels between nvJPEG's and libjpeg-turbo's decode of the test image
GPUS_FIX = "start the container with --gpus all (the host needs the NVIDIA driver and the NVIDIA Container Toolkit)"


@dataclasses.dataclass
class Check:
    """One row of the report: `facts` holds the numbers behind `detail` for tools (--json)."""

    name: str
    status: str
    detail: str
    fix: str = ""
    facts: dict = dataclasses.field(default_factory=dict)


class Report(list):
    """The rows of run_checks(): a list of Check, shown as an HTML table in Jupyter."""

    @property
    def status(self):
        """The worst status of all rows."""
        return max((check.status for check in self), key=SEVERITY.__getitem__, default=OK)

    @property
    def exit_code(self):
        return EXIT_FAIL if self.status == FAIL else 0

    def counts(self):
        return {status: sum(check.status == status for check in self) for status in SEVERITY}

    def summary(self):
        counts = self.counts()
        return f"doctor: {counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail"

    def as_text(self):
        width = max((len(check.name) for check in self), default=0)
        lines = []
        for check in self:
            lines.append(f"{check.status:<4}  {check.name:<{width}}  {check.detail}")
            if check.fix:
                lines.append(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
        return "\n".join([*lines, self.summary()])

    def as_json(self):
        return json.dumps(
            {"status": self.status, "counts": self.counts(), "checks": [dataclasses.asdict(c) for c in self]}, indent=2
        )

    def _repr_html_(self):
        colours = {OK: "#1a7f37", WARN: "#9a6700", FAIL: "#cf222e"}
        cell = '<td style="text-align:left;vertical-align:top">'
        rows = "".join(
            f'<tr class="torchlab-doctor-{check.status}" data-status="{check.status}">'
            f'<td style="text-align:left;vertical-align:top;color:{colours[check.status]};font-weight:bold">'
            f"{check.status}</td>{cell}{html.escape(check.name)}</td>{cell}{html.escape(check.detail)}</td>"
            f"{cell}{html.escape(check.fix)}</td></tr>"
            for check in self
        )
        header = "".join(f'<th style="text-align:left">{title}</th>' for title in ("status", "check", "found", "fix"))
        return (
            f'<table class="torchlab-doctor"><thead><tr>{header}</tr></thead><tbody>{rows}</tbody>'
            f'<caption style="caption-side:bottom;text-align:left">{self.summary()}</caption></table>'
        )


def format_bytes(count):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def cudnn_version_text(version):
    """torch.backends.cudnn.version() as major.minor.patch: 8902 is 8.9.2, 90100 is 9.1.0."""
    major_unit = 10000 if version >= 90000 else 1000
    return f"{version // major_unit}.{version % major_unit // 100}.{version % 100}"


# ---------------------------------------------------------------- the software
def check_python():
    return Check("python", OK, f"{sys.version.split()[0]} ({sys.executable})", facts={"version": sys.version})


def pinned_version(conda_name, spec_path=ENV_SPEC, envspec_path=ENVSPEC):
    """The version environment.yml pins `conda_name` to for this image's flavour, as the build read it (its own
    envspec.py), or None (no such file or pin: outside the image)."""
    try:
        module_spec = importlib.util.spec_from_file_location("torchlab_envspec", envspec_path)
        envspec = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(envspec)
        pins = envspec.conda_pins(spec_path, flavour.this_flavour(environment.image()))
    except OSError:
        return None
    return pins.get(conda_name)


def check_torch(spec_path=ENV_SPEC):
    """torch's version and build; a failure when it is not the version the image pins (a `pip install --user
    torch` on /workspace shadows the env's)."""
    if torch.version.cuda is not None:
        cudnn = torch.backends.cudnn.version()
        built = f"CUDA {torch.version.cuda}, cuDNN {cudnn_version_text(cudnn) if cudnn else 'none'}"
    elif torch.version.hip is not None:
        built = f"ROCm (HIP {torch.version.hip})"
    else:
        built = "CPU only"
    facts = {"version": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    detail = f"{torch.__version__}, built with {built}"
    pinned = pinned_version("pytorch", spec_path)
    if pinned is not None and torch.__version__.split("+")[0] != pinned:
        return Check(
            "torch",
            FAIL,
            f"{detail}, from {os.path.dirname(torch.__file__)}; the image pins {pinned}",
            fix="another torch shadows the image's: pip uninstall it (a --user install lands in /workspace/.local)",
            facts=facts,
        )
    return Check("torch", OK, detail, facts=facts)


TORCH_FAMILY = re.compile(r"torch|torchvision|torchaudio|nvidia-.*|triton")  # a mismatch here breaks the GPU


def sessions_path():
    """sys.path as the user's sessions have it: the user site first, also where this process skips it (the start's
    report runs without it, so that nothing the user installed runs during the start). Only metadata is read."""
    user_site = site.getusersitepackages()
    return sys.path if user_site in sys.path else [user_site, *sys.path]


def check_user_packages():
    """The user's packages (pip install as the user, on /workspace) that shadow one of the image's, one each."""
    shadowing = [dist for dist in environment.distributions(sessions_path()) if dist.get("shadows")]
    if not shadowing:
        return Check("your packages", OK, "none shadows one of the image's")
    lines = [
        f"{dist['name']} {dist['shadows'][0]['version']} (image) is shadowed by {dist['version']} in {dist['location']}"
        for dist in shadowing
    ]
    facts = {"shadowing": shadowing}
    if any(TORCH_FAMILY.fullmatch(dist["name"]) for dist in shadowing):
        fix = "a torch or CUDA package of your own must match the image's CUDA and driver; remove it to go back"
        return Check("your packages", WARN, "; ".join(lines), fix=fix, facts=facts)
    return Check("your packages", OK, "; ".join(lines), facts=facts)


def check_package(name):
    try:
        module = __import__(name)
    except Exception as error:  # ImportError, or an OSError from a library that does not load
        return Check(name, FAIL, f"does not import: {error}", fix="rebuild the image (its env is incomplete)")
    return Check(name, OK, module.__version__, facts={"version": module.__version__})


# ---------------------------------------------------------------- GPUs
def nvidia_smi(field):
    """nvidia-smi's `field` of each GPU (--query-gpu), one word each; [] where nvidia-smi does not answer."""
    try:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return result.stdout.split()


def nvidia_driver_version():
    """The NVIDIA driver's version, from nvidia-smi or the kernel module; None when neither says."""
    versions = nvidia_smi("driver_version")
    if versions:
        return versions[0]
    try:
        with open("/proc/driver/nvidia/version") as version_file:
            words = version_file.readline().split()
    except OSError:
        return None
    return next((word for word in words if word[:1].isdigit() and "." in word), None)


def measure_matmul(device, size=MATMUL_SIZE, dtype=torch.float32, repeats=MATMUL_REPEATS):
    """Multiply two random size x size matrices on `device`: (TFLOP/s, largest error relative to the largest entry).

    The error is against the same product in float64 on the CPU.
    """
    generator = torch.Generator().manual_seed(0)
    left, right = (torch.randn(size, size, generator=generator) for _ in range(2))
    expected = left.double() @ right.double()
    left_on_device, right_on_device = left.to(device, dtype), right.to(device, dtype)
    product = left_on_device @ right_on_device  # the first call loads the kernels: not timed
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        product = left_on_device @ right_on_device
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    error = ((product.double().cpu() - expected).abs().max() / expected.abs().max()).item()
    return 2 * size**3 * repeats / elapsed / 1e12, error


def check_gpu(index, driver):
    device = torch.device("cuda", index)
    properties = torch.cuda.get_device_properties(device)
    name = f"gpu {index}"
    facts = {"name": properties.name, "driver": driver, "capability": f"{properties.major}.{properties.minor}"}
    try:
        free, total = torch.cuda.mem_get_info(device)
        tflops, error = measure_matmul(device)
    except RuntimeError as failure:
        return Check(
            name,
            FAIL,
            f"{properties.name}: CUDA fails on it: {failure}".splitlines()[0],
            fix="check the GPU on the host with nvidia-smi; the driver must support this torch's CUDA",
            facts=facts,
        )
    facts.update(memory_total=total, memory_free=free, matmul_tflops=tflops, matmul_error=error)
    detail = (
        f"{properties.name} (compute {facts['capability']}), driver {driver or 'unknown'}, "
        f"{format_bytes(free)} free of {format_bytes(total)}; {MATMUL_SIZE}x{MATMUL_SIZE} float32 matmul "
        f"{tflops:.1f} TFLOP/s, error {error:.1e}"
    )
    if error > MATMUL_TOLERANCE:
        return Check(name, FAIL, detail, fix="the GPU computes wrong results: check it on the host", facts=facts)
    if free < total * GPU_MEMORY_BUSY_SHARE:
        fix = "other processes hold its memory: nvidia-smi on the host lists them"
        return Check(name, WARN, detail, fix=fix, facts=facts)
    return Check(name, OK, detail, facts=facts)


def driver_cuda_version():
    """The newest CUDA the NVIDIA driver supports, as (major, minor), from its library (no device needed, and
    torch's CUDA need not start); None where there is no driver."""
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return (version.value // 1000, version.value % 1000 // 10)  # 12040 is 12.4


def gpu_capabilities():
    """Each visible GPU's compute capability: torch's, or nvidia-smi's where this torch's CUDA cannot start."""
    if torch.cuda.is_available():
        return [torch.cuda.get_device_capability(index) for index in range(torch.cuda.device_count())]
    try:
        return [flavour.version_pair(word) for word in nvidia_smi("compute_cap")]
    except ValueError:
        return []


def check_flavour(flavours_file=flavour.FLAVOURS_FILE):
    """The image's flavour, and whether its torch runs on the GPUs and driver it sees; where not, the flavour to
    use instead, in one line."""
    name = flavour.this_flavour(environment.image())
    if torch.version.cuda is None:
        return Check("flavour", OK, f"{name}: a CPU-only torch", facts={"flavour": name})
    arch_flags = torch._C._cuda_getArchFlags()
    capabilities, driver_cuda = gpu_capabilities(), driver_cuda_version()
    problems, notes, fix = flavour.fit(
        capabilities,
        arch_flags,
        flavour.version_pair(torch.version.cuda),
        driver_cuda,
        flavour.read_flavours(flavours_file),
        name,
    )
    facts = {"flavour": name, "arch_flags": arch_flags, "capabilities": capabilities, "driver_cuda": driver_cuda}
    detail = f"{name}: torch {torch.__version__} for CUDA {torch.version.cuda}, built for {arch_flags}"
    if not capabilities:
        detail += "; no GPU seen to check against"
    else:
        seen = ", ".join(f"{major}.{minor}" for major, minor in capabilities)
        driver = "unknown" if driver_cuda is None else "{}.{}".format(*driver_cuda)
        detail += f"; GPUs of compute {seen}, driver's CUDA {driver}"
    if problems:
        return Check("flavour", FAIL, f"{detail}: {'; '.join(problems)}", fix=fix, facts=facts)
    if notes:
        return Check("flavour", WARN, f"{detail}: {'; '.join(notes)}", fix=fix, facts=facts)
    return Check("flavour", OK, detail, facts=facts)


def check_gpus():
    """One row per visible GPU; no GPU is a warning (train.py runs on the CPU), a GPU CUDA cannot use a failure."""
    if torch.version.cuda is None:
        return [Check("gpu", WARN, "this torch is a CPU-only build: training runs on the CPU", fix=GPUS_FIX)]
    if not torch.cuda.is_available():
        device_files = [name for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit()]
        if device_files:
            try:
                torch.cuda.init()
                reason = "unknown reason"
            except Exception as error:  # torch raises RuntimeError or its own CUDA errors
                reason = str(error).splitlines()[0]
            return [
                Check(
                    "gpu",
                    FAIL,
                    f"/dev/{device_files[0]} is there but CUDA cannot use it: {reason}",
                    fix=f"the host's NVIDIA driver must support CUDA {torch.version.cuda}: update it (nvidia-smi "
                    "on the host shows its version), and start the container with --gpus all",
                )
            ]
        return [Check("gpu", WARN, "no GPU visible: train.py runs on the CPU (slowly)", fix=GPUS_FIX)]
    driver = nvidia_driver_version()
    return [check_gpu(index, driver) for index in range(torch.cuda.device_count())]


# ---------------------------------------------------------------- mounts, data, memory, CPUs, disk
def mount_of(path, mountinfo="/proc/self/mountinfo"):
    """(mount point, file system type, read-only) of the mount that holds `path`; None if mountinfo is unreadable."""
    path = os.path.realpath(path)
    found = None
    try:
        with open(mountinfo) as mounts:
            for line in mounts:
                fields, _, after_separator = line.partition(" - ")
                fields = fields.split()
                # Spaces and such in mount points are octal escapes (\040).
                mount_point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), fields[4])
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and (found is None or len(mount_point) >= len(found[0])):
                    found = (mount_point, after_separator.split()[0], "ro" in fields[5].split(","))
    except OSError:
        return None
    return found


def in_container_layer(mount):
    """Whether `mount` (from mount_of) is the container's own file system, which goes with the container."""
    return mount is not None and mount[0] == "/" and mount[1] == "overlay"


def describe_mount(mount):
    if mount is None:
        return "mount unknown"
    if in_container_layer(mount):
        return "in the container's own file system, not mounted"
    return f"mounted at {mount[0]} ({mount[1]}, {'read-only' if mount[2] else 'read-write'})"


def data_folder_problem(data_dir):
    """A failing Check when `data_dir` is missing, not a folder or not readable; else None."""
    mount_fix = f"mount your images: docker run -v /path/to/images:{data_dir}:ro ... (or pass --data)"
    if not os.path.exists(data_dir):
        return Check("data", FAIL, f"{data_dir}: no such folder", fix=mount_fix)
    if not os.path.isdir(data_dir):
        return Check("data", FAIL, f"{data_dir}: not a folder", fix=mount_fix)
    if not os.access(data_dir, os.R_OK | os.X_OK):
        return Check(
            "data",
            FAIL,
            f"{data_dir}: not readable by UID {os.getuid()}",
            fix=f"on the host: chmod -R a+rX on the folder mounted at {data_dir}",
        )
    return None


def check_data(data_dir, batch_size, val_fraction, seed):
    """The data train.py would read: its layout, classes and image counts, by train.py's own indexing."""
    return indexed_data_check(data_dir, batch_size, val_fraction, seed)[0]


def indexed_data_check(data_dir, batch_size, val_fraction, seed):
    """check_data's row, and the training index it read (None where it could not): run_checks resolves --decode
    and sizes the loader's batches on it, so that a large --data is scanned once."""
    problem = data_folder_problem(data_dir)
    if problem is not None:
        return problem, None
    try:
        class_names, train_index, val_index = splits.load_splits(data_dir, val_fraction, seed)
    except folder.DataError as error:  # its own fix (a symlink loop, an unreadable folder), else the layout's
        fix = error.fix or f"arrange {data_dir} as train/CLASS/IMAGE and val/CLASS/IMAGE"
        return Check("data", FAIL, error.problem, fix=fix), None
    except OSError as error:  # a prepared copy's own files; the folders of an ImageFolder raise DataError
        fix = "on the host: chmod -R a+rX the folder"
        return Check("data", FAIL, f"cannot read {data_dir}: {error}", fix=fix), None
    mount = mount_of(data_dir)
    layout = splits.data_layout(data_dir)
    described_layout = {
        "prepared": "a prepared copy (torchlab prepare) with its own training and validation splits",
        "train_val": "train/ and val/",
        "train": f"train/, {val_fraction:.0%} of it held out for val",
        "single": f"one folder of classes, {val_fraction:.0%} held out for val",
    }[layout]
    shown = ", ".join(class_names[:CLASS_NAMES_SHOWN]) + (", ..." if len(class_names) > CLASS_NAMES_SHOWN else "")
    detail = (
        f"{data_dir}, {describe_mount(mount)}: {described_layout}; {len(class_names)} classes ({shown}); "
        f"{len(train_index)} training and {len(val_index)} validation images"
    )
    facts = {
        "layout": layout,
        "mounted": mount is not None and not in_container_layer(mount),
        "classes": class_names,
        "train_images": len(train_index),
        "val_images": len(val_index),
    }
    status, fix = OK, ""
    if len(train_index) < batch_size:
        status, fix = FAIL, f"add images, or lower --batch-size to {len(train_index)} or less"
        detail += f": not one full batch of {batch_size}"
    elif len(class_names) < 2:
        status, fix = WARN, "a classifier needs at least two class folders"
    elif len(val_index) == 0:
        status, fix = WARN, "add a val/ folder, or raise train.py's --val-fraction"
    return Check("data", status, detail, fix, facts), train_index


def shared_memory_fix(needed):
    gib = max(SUGGESTED_SHM_GIB, math.ceil(SHM_HEADROOM * needed / GIB))
    return f"start the container with --shm-size={gib}g (or --ipc=host), or use --loader threads (or auto)"


def check_shared_memory(shm, outcome, processes=1):
    """Whether /dev/shm ((size, free) bytes, or None) holds the batches of the loader plan train.py makes:
    `outcome` is that plan.LoaderPlan, or the plan.SharedMemoryError train.py stops with. The plan's own /dev/shm
    fit decides; this row says what it decided, and warns where little room is left."""
    if isinstance(outcome, plan.SharedMemoryError):
        return Check("shared memory", FAIL, f"{outcome}: train.py stops", shared_memory_fix(0))
    used = outcome
    if used.loader == "threads" or used.workers == 0:
        why = f" ({used.reasons['loader']})" if "loader" in used.reasons else ""
        units = (
            f"{plan.UNITS['threads']} in the training process"
            if used.workers
            else "workers: decoded in the training loop"
        )
        return Check(
            "shared memory",
            OK,
            f"not used: {used.workers} {units}{why}",
            facts={"workers": used.workers, "loader": used.loader},
        )
    processes_text = f" ({processes} processes)" if processes > 1 else ""
    need_text = (
        f"the worker processes' batches of {format_bytes(used.batch_bytes)} (in flight as asked, and "
        f"{plan.BATCHES_HELD_BY_MAIN} held){processes_text} need {format_bytes(used.shm_needed)}"
    )
    fix = shared_memory_fix(used.shm_needed)
    if shm is None:
        return Check("shared memory", FAIL, f"no /dev/shm; {need_text}", fix=fix)
    size, free = shm
    detail = f"/dev/shm {format_bytes(size)} ({format_bytes(free)} free); {need_text}"
    facts = {"size": size, "free": free, "needed": used.shm_needed}
    facts.update(workers=used.workers, prefetch_factor=used.prefetch_factor)
    lowered = used.reasons.get("workers", "")
    if lowered.startswith("lowered"):
        return Check("shared memory", WARN, f"{detail}: train.py's loader is {lowered}", fix, facts)
    if free < SHM_HEADROOM * used.shm_needed:
        return Check("shared memory", WARN, detail + ": little room left", fix, facts)
    return Check("shared memory", OK, detail, facts=facts)


def check_cpus(workers, processes=1, cgroup_root=machine.CGROUP_ROOT, tuned=None, loader="processes"):
    """CPUs this container may use (affinity and cgroup quota) against the loader workers (or decode threads) the
    plan uses. Workers from a saved autotune setting (tuned: the plan's reason for them) are what autotune
    measured fastest here: shown as such, not flagged, also where there are more of them than CPUs."""
    affinity = len(os.sched_getaffinity(0))
    quota = machine.cgroup_cpu_limit(cgroup_root)
    usable = machine.usable_cpu_count(cgroup_root)
    quota_text = "no cgroup CPU quota" if quota is None else f"cgroup CPU quota {quota:g}"
    units = plan.UNITS[loader]
    detail = (
        f"{usable} usable ({affinity} in the CPU affinity of {os.cpu_count()}, {quota_text}); "
        f"{workers} {units}{f' x {processes} processes' if processes > 1 else ''}"
    )
    facts = {"usable": usable, "affinity": affinity, "quota": quota, "workers": workers, "autotuned": bool(tuned)}
    if tuned:
        more = ": more than CPUs, and faster so when autotune measured it" if workers * processes > usable else ""
        return Check(
            "cpus", OK, f"{detail}; {tuned.replace('autotuned', f'autotuned: {workers} {units}')}{more}", facts=facts
        )
    if workers * processes > usable:
        fix = f"--workers {plan.auto_workers(usable, processes)} (or auto), or give the container more CPUs (--cpus)"
        return Check("cpus", WARN, detail + ": more workers than CPUs", fix=fix, facts=facts)
    if usable < 2:
        fix = "give the container more CPUs (docker run --cpus N): decoding images needs them"
        return Check("cpus", WARN, detail, fix=fix, facts=facts)
    return Check("cpus", OK, detail, facts=facts)


def check_run_dir(run_dir, fail_below=RUN_DIR_FAIL_BYTES, warn_below=RUN_DIR_WARN_BYTES):
    """Free disk where checkpoints go, whether they can be written there, and whether they outlive the container."""
    path, existing = os.path.abspath(run_dir), io.nearest_existing(run_dir)
    name = "run dir"
    reason = io.unwritable_reason(path)
    if reason is not None:
        return Check(
            name,
            FAIL,
            f"{path}: cannot be written ({reason})",
            fix="pass a --run-dir under a writable folder, e.g. /workspace/runs/NAME",
        )
    free = shutil.disk_usage(existing).free
    mount = mount_of(existing)
    detail = f"{path}: {format_bytes(free)} free, {describe_mount(mount)}"
    facts = {"path": path, "free": free, "persistent": not in_container_layer(mount)}
    if free < fail_below:
        fix = f"free disk space, or pass a --run-dir on a disk with more than {format_bytes(warn_below)} free"
        return Check(name, FAIL, detail + ": too little for checkpoints", fix=fix, facts=facts)
    if free < warn_below:
        fix = "checkpoints take hundreds of MB each: free disk space or pass another --run-dir"
        return Check(name, WARN, detail, fix=fix, facts=facts)
    if in_container_layer(mount):
        fix = "checkpoints are lost with the container: mount a host folder there, e.g. -v $PWD/runs:/workspace/runs"
        return Check(name, WARN, detail, fix=fix, facts=facts)
    return Check(name, OK, detail, facts=facts)


def nvjpeg_error(device):
    """Why the device cannot decode a JPEG as the CPU does (None when it can): a small test image decoded both
    ways must agree within DEVICE_DECODE_TOLERANCE levels on average."""
    gradient = np.linspace(0, 255, 64 * 48 * 3).astype(np.uint8).reshape(48, 64, 3)
    encoded = BytesIO()
    Image.fromarray(gradient).save(encoded, "JPEG", quality=90)
    data = torch.frombuffer(bytearray(encoded.getvalue()), dtype=torch.uint8)
    try:
        on_device = decode_jpeg(data, mode=ImageReadMode.RGB, device=device).cpu()
    except RuntimeError as error:
        return str(error).splitlines()[0]
    difference = (on_device.float() - decode_jpeg(data, mode=ImageReadMode.RGB).float()).abs().mean().item()
    return None if difference <= DEVICE_DECODE_TOLERANCE else f"its pixels differ by {difference:.1f} levels on average"


def check_decoder(decoder, device, workers, autotuned, loader="threads"):
    """Where train.py will decode images on `device` (--decode as the loader plan resolves it) with `workers` of
    --loader `loader`, and for gpu whether nvJPEG works on this GPU."""
    facts = {"decode": decoder, "autotuned": autotuned}
    if decoder == "gpu" and device == "cpu":
        return Check(
            "decoder",
            FAIL,
            "--decode gpu, but no CUDA device is visible: train.py stops",
            fix=f"{GPUS_FIX}, or use --decode cpu or auto",
            facts=facts,
        )
    how = " (autotuned)" if autotuned else ""
    if decoder == "cpu":
        why = ": no CUDA device" if device == "cpu" else ""
        return Check("decoder", OK, f"cpu{how}: decoded by the {workers} {plan.UNITS[loader]}{why}", facts=facts)
    error = nvjpeg_error(torch.device(device))
    detail = f"gpu{how}: nvJPEG on {device} decodes each batch; the {workers} {plan.UNITS[loader]} read the files"
    if error is not None:
        fix = "train with --decode cpu (the workers decode), and check the GPU and driver on the host"
        return Check("decoder", FAIL, f"{detail}, but it fails here: {error}", fix=fix, facts=facts)
    return Check("decoder", OK, detail, facts=facts)


# ---------------------------------------------------------------- all of it
def loader_checks(flags, processes, index, device):
    """The shared memory, cpus and decoder rows, from the loader plan train.py makes of `flags` (a TrainConfig)
    for `index` on `device` (resolve.loader_plan, with what torchlab autotune saved)."""
    try:
        used = resolve.loader_plan(flags, device, index, processes)
    except plan.SharedMemoryError as error:
        return [check_shared_memory(machine.shared_memory_bytes(), error, processes)]
    except plan.PlanError as error:
        return [Check("loader", FAIL, f"{error}: train.py stops", fix="give train.py the flag as the line says")]
    tuned = used.reasons["workers"] if used.autotuned and "workers" in used.reasons else None
    decode_tuned = used.reasons.get("decode", "").startswith("autotuned")
    return [
        check_shared_memory(machine.shared_memory_bytes(), used, processes),
        check_cpus(used.workers, processes, tuned=tuned, loader=used.loader),
        check_decoder(used.decode, device, used.workers, decode_tuned, used.loader),
    ]


def run_checks(
    data_dir=None,
    workers=None,
    batch_size=None,
    prefetch_factor=None,
    image_size=None,
    run_dir=None,
    processes=1,
    autotune_file=None,
    decoder=None,
    loader=None,
):
    """Every check, as a Report (a list of Check). Arguments left None take train.py's defaults; the loader rows
    come from the loader plan train.py makes of them, with what torchlab autotune saved in autotune_file."""
    asked = {
        "data": data_dir,
        "workers": workers,
        "batch_size": batch_size,
        "prefetch_factor": prefetch_factor,
        "image_size": image_size,
        "run_dir": run_dir,
        "autotune_file": autotune_file,
        "decode": decoder,
        "loader": loader,
    }
    given = {name: value for name, value in asked.items() if value is not None}
    return checks_for(dataclasses.replace(config.DEFAULTS, **given), processes)


def checks_for(flags, processes=1):
    """Every check for train.py's `flags` (a TrainConfig), with `processes` training processes on the machine."""
    report = Report([check_python(), check_torch(), check_package("torchvision"), check_package("torchaudio")])
    report.append(check_user_packages())
    report.append(check_flavour())
    report.extend(check_gpus())
    data_check, train_index = indexed_data_check(flags.data, flags.batch_size, flags.val_fraction, flags.seed)
    report.append(data_check)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    report.extend(loader_checks(flags, processes, [] if train_index is None else train_index, device))
    report.append(check_run_dir(flags.run_dir))
    return report


DESCRIPTION = (
    "Check this container before a long training run: Python and torch (versions, CUDA and cuDNN "
    "it was built with); each GPU (driver, memory, a small matmul); the data at --data (mounted? readable? "
    "layout, classes, image counts); /dev/shm against the batches the loader workers keep in flight; the "
    "usable CPUs (affinity and cgroup quota); free disk at --run-dir. "
    "The loader flags are train.py's, with its defaults: pass the ones you will train with."
)

EPILOG = (
    "Each line reads ok, warn or fail, and for warn and fail the fix. Exit status: 0 when nothing "
    "fails (warnings included), 1 when a check fails, 2 for a bad flag. A missing GPU is a warning (train.py "
    "runs on the CPU); a GPU that CUDA cannot use is a failure. Missing or unreadable data, a /dev/shm "
    "too small for one loader worker's batches (docker run --shm-size=8g), and a run dir that cannot be "
    "written or has under 1 GiB free are failures; a /dev/shm that makes train.py lower --workers or "
    "--prefetch-factor is a warning."
)


DOCTOR_FLAGS = ("data", "workers", "batch_size", "prefetch_factor", "image_size", "run_dir", "autotune_file")
DOCTOR_FLAGS += ("loader", "decode")


def build_parser(prog="torchlab doctor"):
    """train.py's own flags (DOCTOR_FLAGS: the ones the checks depend on), --processes and --json."""
    parser = parsing.OneLineErrorParser(prog=prog, description=DESCRIPTION, epilog=EPILOG)
    config.add_flags(parser, DOCTOR_FLAGS)
    parser.add_argument(
        "--processes",
        type=parsing.positive_int,
        default=1,
        help="training processes on this machine, as torchrun --nproc-per-node (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON, for tools")
    return parser


def main(argv=None, prog="torchlab doctor"):
    args = build_parser(prog).parse_args(argv)
    flags = dataclasses.replace(config.DEFAULTS, **{name: getattr(args, name) for name in DOCTOR_FLAGS})
    report = checks_for(flags, args.processes)
    print(report.as_json() if args.json else report.as_text())
    sys.exit(report.exit_code)


if __name__ == "__main__":
    main()
