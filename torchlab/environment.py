"""The environment a run ran in, kept in its run directory: the command, the loader plan as used, every installed
distribution (the user's overlay too), the image, Python, torch, CUDA, the GPUs, the machine and the code.

record() writes RUN_DIR/environment.json when a run starts (rank 0), and a numbered one (environment-2.json, -3,
...) when a later start of the same run finds the environment changed; the earlier records stay. Each record's
uncommitted diff, if any, is beside it as environment.patch (environment-2.patch, ...). Collecting costs a
few seconds at most (every command it runs has a timeout), and never stops the run: whatever fails is one
WARNING line. A start that finds something that can change the numbers changed (torch, CUDA, numpy, the image,
...) says so in one WARNING line; `torchlab env diff RUN_DIR` lists every difference.
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

import torch

from torchlab import io, machine

RECORD_NAME = "environment"  # environment.json, environment-2.json, ...; their patches environment.patch, ...
RECORD_FILE = re.compile(rf"{RECORD_NAME}(?:-(\d+))?\.json")
IMAGE_FILE = "/opt/torchlab/image.json"  # the image's labels, written at build time (the Dockerfile's last RUN)
COMMAND_SECONDS = 10  # the longest any one command (git, conda, nvidia-smi) may take
PATCH_LIMIT_BYTES = 1_000_000
UNTRACKED_NAMED = 50
OTHER_USERS_TREE = "in a git work tree owned by another user, which git does not read for this one (safe.directory)"
# What can change a run's numbers: a change in any of these at a resume is a WARNING in the log.
NUMERIC_KEYS = (
    "package torch",
    "package torchvision",
    "package numpy",
    "package pillow",
    "CUDA",
    "cuDNN",
    "image version",
)


def canonical_name(name):
    """A distribution's name as pip compares them: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(path=None):
    """Every distribution importable from `path` (sys.path): [{name, version, location}] by name, the first on
    the path winning (a --user install before the image's env), with the copies it shadows under "shadows"."""
    found = {}
    folders = list(dict.fromkeys(sys.path if path is None else path))  # a folder twice on the path is one place
    for dist in importlib.metadata.distributions(path=folders):
        name = dist.metadata["Name"]
        if not name:
            continue
        entry = {"name": canonical_name(name), "version": dist.version, "location": str(dist.locate_file(""))}
        direct_url = dist.read_text("direct_url.json")
        if direct_url:
            entry["url"] = json.loads(direct_url).get("url")
        first = found.setdefault(entry["name"], entry)
        if first is not entry:
            first.setdefault("shadows", []).append({"version": entry["version"], "location": entry["location"]})
    return [found[name] for name in sorted(found)]


def env_source():
    """conda where this Python's prefix is a conda env (and conda is on PATH), else pypi."""
    is_conda = os.path.isdir(os.path.join(sys.prefix, "conda-meta")) and shutil.which("conda") is not None
    return "conda" if is_conda else "pypi"


def run_command(*command, cwd=None):
    """A command's stdout (text); RuntimeError, naming it, where it fails or takes longer than COMMAND_SECONDS."""
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=COMMAND_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"{command[0]} {command[1]}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(f"{command[0]} {command[1]}: {last}")
    return done.stdout


def conda_environment():
    """`conda env export --no-builds` of this env, less its machine-specific prefix line."""
    text = run_command("conda", "env", "export", "--no-builds", "--prefix", sys.prefix)
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("prefix:"))


def packages():
    record = {"env_source": env_source(), "prefix": sys.prefix, "distributions": distributions()}
    if record["env_source"] == "conda":
        record["conda_environment"] = conda_environment()
    return record


def image():
    """The image's version, revision, source, flavour, env source and lock file, as its labels say ({} outside it)."""
    if not os.path.exists(IMAGE_FILE):
        return {}
    with open(IMAGE_FILE) as image_file:
        return json.load(image_file)


def versions():
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
    }


def gpus():
    """The driver (nvidia-smi) and every visible GPU's name and memory; no devices without CUDA."""
    if not torch.cuda.is_available():
        return {"driver": None, "devices": []}
    devices = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        devices.append({"name": properties.name, "memory_bytes": properties.total_memory})
    driver = None
    if shutil.which("nvidia-smi"):
        driver = run_command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").split()[0]
    return {"driver": driver, "devices": devices}


def this_machine():
    shm = machine.shared_memory_bytes()
    return {
        "hostname": socket.gethostname(),
        "cpus": len(os.sched_getaffinity(0)),
        "usable_cpus": machine.usable_cpu_count(),
        "shm_bytes": None if shm is None else shm[0],
        "platform": platform.platform(),
    }


def code_paths(flags):
    """The training script and the --config file, where they are files."""
    config_flag = argparse.ArgumentParser(add_help=False)
    config_flag.add_argument("--config")
    config_file = config_flag.parse_known_args(flags)[0].config
    return [path for path in (sys.argv[0], config_file) if path and os.path.isfile(path)]


def work_tree(path):
    """The top folder of the git work tree that holds the file `path`, or None."""
    if shutil.which("git") is None:
        return None
    try:
        return run_command("git", "rev-parse", "--show-toplevel", cwd=os.path.dirname(os.path.abspath(path))).strip()
    except RuntimeError as error:
        # Where the folder is a mount point (Kubeflow's PVC at the home) git ends with "Stopping at filesystem
        # boundary": no work tree holds the file there either.
        if "not a git repository" in str(error) or "Stopping at filesystem boundary" in str(error):
            return None
        raise


def git_state(top, path, patch_path):
    """The work tree `top`'s commit, branch and untracked files; its uncommitted diff goes to patch_path, cut at
    PATCH_LIMIT_BYTES (and then said so)."""
    untracked = run_command("git", "ls-files", "--others", "--exclude-standard", cwd=top).splitlines()
    state = {
        "path": os.path.abspath(path),
        "repository": top,
        "commit": run_command("git", "rev-parse", "HEAD", cwd=top).strip(),
        "branch": run_command("git", "rev-parse", "--abbrev-ref", "HEAD", cwd=top).strip(),
        "untracked": untracked[:UNTRACKED_NAMED],
        "untracked_count": len(untracked),
        "patch": None,
    }
    diff = run_command("git", "diff", "HEAD", "--no-color", "--no-ext-diff", cwd=top).encode("utf-8", "replace")
    if diff:
        state.update(
            patch=os.path.basename(patch_path),
            patch_bytes=len(diff),
            patch_sha256=hashlib.sha256(diff).hexdigest(),
            patch_truncated=len(diff) > PATCH_LIMIT_BYTES,
        )
        io.atomic_write(patch_path, lambda patch: patch.write(diff[:PATCH_LIMIT_BYTES]))
    return state


def code(flags, patch_path):
    """git_state of each work tree that holds the script or --config, once each; the second one's patch is
    environment.1.patch beside patch_path (environment.patch), and so on."""
    states, tops = [], []
    for path in code_paths(flags):
        try:
            top = work_tree(path)
        except RuntimeError as error:  # git's safe.directory rule: a tree owned by another user runs its config
            if "safe.directory" not in str(error):
                raise
            states.append({"path": os.path.abspath(path), "not_read": OTHER_USERS_TREE})
            continue
        if top is not None and top not in tops:
            stem, ext = os.path.splitext(patch_path)
            states.append(git_state(top, path, f"{stem}.{len(tops)}{ext}" if tops else patch_path))
            tops.append(top)
    return states


def collect(plan, flags, patch_path=None):
    """The record (a dict), and the parts that could not be collected: [(part, reason)]."""
    record = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": {"argv": list(sys.argv), "flags": list(flags), "cwd": os.getcwd(), "executable": sys.executable},
        "loader_plan": plan,
    }
    parts = {"packages": packages, "image": image, "versions": versions, "gpus": gpus, "machine": this_machine}
    if patch_path is not None:
        parts["code"] = lambda: code(flags, patch_path)
    problems = []
    for part, collect_part in parts.items():
        try:
            record[part] = collect_part()
        except Exception as error:  # a record with a part missing is better than none: said in the WARNING
            record[part] = None
            problems.append((part, f"{type(error).__name__}: {error}"))
    return record, problems


def record_files(run_dir):
    """The run's records, oldest first: [(number, path)], environment.json being 1."""
    found = []
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else ():
        match = RECORD_FILE.fullmatch(name)
        if match:
            found.append((int(match.group(1) or 1), os.path.join(run_dir, name)))
    return sorted(found)


def record_path(run_dir, number, ext=".json"):
    return os.path.join(run_dir, f"{RECORD_NAME}{'' if number == 1 else f'-{number}'}{ext}")


def latest_record(run_dir):
    """(path, record) of the run's newest record; ValueError where it has none or it is not readable."""
    files = record_files(run_dir)
    if not files:
        raise ValueError(f"{run_dir}: no {RECORD_NAME}.json (not a run directory, or a run from before records)")
    path = files[-1][1]
    try:
        with open(path) as record_file:
            return path, json.load(record_file)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None


def comparable(record):
    """What env diff compares: {key: value} of the packages, Python, CUDA, cuDNN, NCCL, the image and the GPUs."""
    values = {}
    for dist in (record.get("packages") or {}).get("distributions") or []:
        values[f"package {dist['name']}"] = dist["version"]
    recorded_versions = record.get("versions") or {}
    for key, label in (("python", "Python"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL")):
        values[label] = recorded_versions.get(key)
    recorded_image = record.get("image") or {}
    values["image version"] = recorded_image.get("version")
    values["image revision"] = recorded_image.get("revision")
    recorded_gpus = record.get("gpus") or {}
    devices = recorded_gpus.get("devices") or []
    values["GPU"] = ", ".join(f"{d['name']} ({d['memory_bytes'] / 2**30:.0f} GiB)" for d in devices) or "none"
    values["GPU driver"] = recorded_gpus.get("driver")
    return values


def differences(old, new):
    """[(key, line)]: one line per difference from record `old` to record `new`."""
    before, after = comparable(old), comparable(new)
    lines = []
    for key in sorted(before.keys() | after.keys(), key=lambda k: (k.startswith("package "), k)):
        if before.get(key) == after.get(key):
            continue
        if key.startswith("package ") and key not in before:
            lines.append((key, f"package added: {key[8:]} {after[key]}"))
        elif key.startswith("package ") and key not in after:
            lines.append((key, f"package removed: {key[8:]} {before[key]}"))
        elif key.startswith("package "):
            lines.append((key, f"package changed: {key[8:]} {before[key]} -> {after[key]}"))
        else:
            lines.append((key, f"{key}: {before.get(key)} -> {after.get(key)}"))
    return lines


def same_environment(old, new):
    """Whether two records describe one environment: all but when and how the run was started, and the names of
    the patch files (their contents count, by hash)."""

    def essence(record):
        kept = {key: value for key, value in record.items() if key not in ("recorded_at", "command", "code")}
        return {**kept, "code": [{**state, "patch": None} for state in record.get("code") or []]}

    return essence(old) == essence(new)


def warn(text):
    print(f"WARNING: {text}", flush=True)


def record(run_dir, plan, flags):
    """Write this start's record into run_dir (see the module's docstring). Never raises: a failure is one
    WARNING line. `flags`: the training flags as given (None: sys.argv[1:])."""
    try:
        write_record(run_dir, plan, sys.argv[1:] if flags is None else flags)
    except Exception as error:  # the run goes on without its record
        warn(f"the environment record was not written to {run_dir}: {type(error).__name__}: {error}")


def write_record(run_dir, plan, flags):
    files = record_files(run_dir)
    number = files[-1][0] + 1 if files else 1
    previous = latest_record(run_dir) if files else None
    current, problems = collect(plan, flags, record_path(run_dir, number, ".patch"))
    if problems:
        warn("the environment record misses " + "; ".join(f"{part} ({why})" for part, why in problems))
    if previous is not None:
        if same_environment(previous[1], current):
            for state in current.get("code") or []:  # the patch of an unchanged tree is the previous one's
                if state.get("patch"):
                    os.unlink(os.path.join(run_dir, state["patch"]))
            return
        changed = differences(previous[1], current)
        numeric = [line for key, line in changed if key in NUMERIC_KEYS]
        if numeric:
            warn(
                f"this environment differs from {previous[0]} in what can change the numbers: "
                f"{'; '.join(numeric)} ({len(changed)} differences in all: torchlab env diff {run_dir})"
            )
    text = json.dumps(current, indent=2).encode()
    io.atomic_write(record_path(run_dir, number), lambda record_file: record_file.write(text))
