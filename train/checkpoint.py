"""Checkpoints in the run directory: checkpoint-<global step, 8 digits>.pt, written atomically, the newest K kept.

A checkpoint is written to a hidden temporary file in the same directory, flushed and fsynced, renamed over
its final name (os.replace: atomic on POSIX), and the directory is fsynced so that the rename survives a
power cut. A crash leaves at most a stale .checkpoint-*.tmp file, which no name pattern below matches: a
resume never loads half a file. The next run removes such leftovers.
"""

import contextlib
import os
import re

import torch

CHECKPOINT_NAME = re.compile(r"checkpoint-(\d{8})\.pt")
TEMP_PREFIX, TEMP_SUFFIX = ".checkpoint-", ".tmp"


def checkpoint_path(run_dir, global_step):
    return os.path.join(run_dir, f"checkpoint-{global_step:08d}.pt")


def list_checkpoints(run_dir):
    """Paths of the checkpoints in `run_dir`, oldest (lowest step) first; [] when there is no such folder."""
    if not os.path.isdir(run_dir):
        return []
    names = sorted(name for name in os.listdir(run_dir) if CHECKPOINT_NAME.fullmatch(name))
    return [os.path.join(run_dir, name) for name in names]


def latest_checkpoint(run_dir):
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def fsync_directory(path):
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path, write):
    """write(file) into `path` so that `path` holds either the old file or the whole new one."""
    directory = os.path.dirname(path) or "."
    temp_path = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}{TEMP_SUFFIX}")
    try:
        with open(temp_path, "wb") as temp_file:
            write(temp_file)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
    fsync_directory(directory)


def save_atomically(state, path):
    """torch.save(state) to `path` so that `path` holds either the old file or the whole new one."""
    write_atomically(path, lambda temp_file: torch.save(state, temp_file))


def remove_old_checkpoints(run_dir, keep):
    for path in list_checkpoints(run_dir)[:-keep]:
        os.unlink(path)


def remove_stale_temp_files(run_dir):
    """Delete what an interrupted save left behind."""
    for name in os.listdir(run_dir):
        if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
            os.unlink(os.path.join(run_dir, name))


def capture_rng_states():
    """torch's generators: the only randomness of the training loop itself (dropout, stochastic depth).

    Data order and augmentation need none: they are seeded functions of (seed, epoch, sample).
    """
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_states(states):
    torch.set_rng_state(states["torch"])
    if torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
