"""Checkpoints in the run directory: checkpoint-<global step, 8 digits>.pt, written atomically, the newest K kept.

CheckpointManager owns what a checkpoint holds (the state of the model, optimiser, schedule and gradient
scaler, where in the run it was taken, torch's RNG state and the run's configuration), writing it with
io.atomic_write (a crash leaves at most a hidden temporary file, which no name pattern below matches, so a
resume never loads half a file), restoring it, and keeping the newest --keep-checkpoints.
"""

import dataclasses
import os
import re

import torch

from torchlab import io

CHECKPOINT_NAME = re.compile(r"checkpoint-(\d{8})\.pt")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, say); the earlier ones are untouched: exit code 1."""


class CheckpointReadError(ValueError):
    """A --resume file that torch cannot read, that is no torchlab checkpoint, or whose states do not fit this run's
    model and optimiser: bad input, one line and exit code 2."""


@dataclasses.dataclass
class Position:
    """Where a run is: the epoch, the steps done in it, and the steps done in all; mid-epoch, what the epoch's
    summary and the current --log-interval's record have summed so far in each process (metrics.Meter.state,
    stacked by rank; None at an epoch's start, and in checkpoints written before they were kept)."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epoch_sums: torch.Tensor = None
    interval_sums: torch.Tensor = None


def one_line(error):
    """What went wrong, in one line: the first line of the error's message, or its type where it has none."""
    text = f"{error}".strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_state(path, mmap=False):
    """torch.load(path) onto the CPU, tensors and plain values only (mapped, not read, with `mmap`). Where torch
    cannot read it, CheckpointReadError whose message is torch's reason in one line."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # pickle's, zipfile's and torch's own errors alike
        empty = isinstance(error, EOFError) and os.path.isfile(path) and os.path.getsize(path) == 0
        raise CheckpointReadError("the file is empty" if empty else one_line(error)) from None


def check_readable(path):
    """Raise CheckpointReadError unless torch reads `path` as a torchlab checkpoint (where in a run it was taken,
    and the RNG state). Its tensors are mapped, not read, so a large file costs little."""
    try:
        state = load_state(path, mmap=True)
    except CheckpointReadError as reason:
        raise CheckpointReadError(f"{path}: not a checkpoint torch can read ({reason})") from None
    expected = ["rng", "epoch", "step_in_epoch", "global_step"]
    missing = [key for key in expected if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointReadError(f"{path}: not a torchlab checkpoint (it has no {', '.join(missing)})")


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


def save_atomically(state, path):
    """torch.save(state) to `path` so that `path` holds either the old file or the whole new one."""
    io.atomic_write(path, lambda temp_file: torch.save(state, temp_file))


def capture_rng_states():
    """torch's generators: the only randomness of the training loop itself (dropout, stochastic depth).

    Data order and augmentation need none: they are seeded functions of (seed, epoch, sample).
    """
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_states(states):
    torch.set_rng_state(states["torch"])
    if torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


class CheckpointManager:
    """The checkpoints of one run directory. `components` maps names ("model", "optimizer", ...) to objects
    with state_dict() and load_state_dict(); `run_config` (a dict) is saved with each checkpoint."""

    def __init__(self, run_dir, keep, components, run_config):
        self.run_dir, self.keep = run_dir, keep
        self.components, self.run_config = components, run_config

    def save(self, position):
        """Write the checkpoint of `position`, then delete all but the newest `keep`; returns its path.
        A failed write raises CheckpointWriteError, leaving the earlier checkpoints as they were."""
        path = checkpoint_path(self.run_dir, position.global_step)
        state = {name: component.state_dict() for name, component in self.components.items()}
        state.update(dataclasses.asdict(position), rng=capture_rng_states(), config=self.run_config)
        try:
            save_atomically(state, path)
        except (OSError, RuntimeError) as error:
            # torch.save reports a failed write (ENOSPC, EIO) as a RuntimeError raised while handling the OSError.
            cause = error if isinstance(error, OSError) else error.__context__
            if not isinstance(cause, OSError):
                raise
            previous = latest_checkpoint(self.run_dir)
            kept = f"the previous checkpoint {previous} is intact" if previous else "there is no earlier checkpoint"
            raise CheckpointWriteError(f"could not write {path}: {cause.strerror or cause}; {kept}") from None
        for old in list_checkpoints(self.run_dir)[: -self.keep]:
            os.unlink(old)
        return path

    def restore(self, path):
        """Load every component's state and the RNG state from `path`; returns the Position it holds. Raises
        CheckpointReadError where a state does not fit (another --arch or number of classes, say)."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        for name, component in self.components.items():
            try:
                component.load_state_dict(state[name])
            except (KeyError, RuntimeError, ValueError) as error:
                lines = [line.strip() for line in f"{error}".splitlines() if line.strip()]
                reason = " ".join(lines[:2])  # torch's heading, then the first mismatch
                reason = reason if len(reason) <= 240 else reason[:240] + " ..."
                raise CheckpointReadError(
                    f"{path}: its {name} state does not fit this run ({reason}); resume with the flags it was "
                    "saved with, or start in another --run-dir"
                ) from None
        restore_rng_states(state["rng"])
        return Position(**{field.name: state.get(field.name) for field in dataclasses.fields(Position)})
