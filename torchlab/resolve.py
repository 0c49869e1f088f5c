"""What a run needs from the machine besides its flags: CUDA, mixed precision, the learning rate, the checkpoint
--resume picks (Setup, beside the TrainConfig, which stays as asked); and, once the data index is known, the one
loader plan (loader_plan: pipeline/plan.py on this machine, with what torchlab autotune saved). Bad input raises
config.ConfigError, or plan.PlanError for the loader's flags.
"""

import dataclasses
import os
import shutil

import torch

from torchlab import checkpoint, io, machine, model
from torchlab.config import ConfigError
from torchlab.pipeline import device_decode, plan, settings


def check_flags(flags, writes_run):
    """The checks that need more than a flag's own text: model names, files, the compiler, and (`writes_run`)
    a --run-dir this user can write in."""
    if flags.arch not in model.classification_model_names():
        raise ConfigError(f"--arch {flags.arch}: not a torchvision classification model (e.g. resnet18, resnet50)")
    if flags.warmup_epochs > flags.epochs:
        raise ConfigError(f"--warmup-epochs {flags.warmup_epochs}: expected at most --epochs ({flags.epochs})")
    if flags.compile and not shutil.which(os.environ.get("CXX", "g++")):
        raise ConfigError("--compile: torch.compile needs a C++ compiler (g++, or $CXX) and none is on PATH")
    if flags.weights is not None and not os.path.isfile(flags.weights):
        raise ConfigError(f"--weights {flags.weights}: no such file")
    run_dir_problem = io.unwritable_reason(flags.run_dir) if writes_run else None
    if run_dir_problem is not None:
        raise ConfigError(f"--run-dir {flags.run_dir}: {run_dir_problem}")


NO_CUDA_DEVICE = "no CUDA device is visible (docker run --gpus all ...?)"


def resolve_device(choice, processes):
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: {NO_CUDA_DEVICE}")
    if choice == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{processes.local_rank}"


def resolve_resume(choice, run_dir):
    """The checkpoint file to start from, or None."""
    newest = checkpoint.latest_checkpoint(run_dir)
    if choice == "auto":
        return newest
    if choice == "none":
        if newest is not None:
            raise ConfigError(f"--resume none, but {run_dir} has checkpoints: pick another --run-dir or --resume auto")
        return None
    if not os.path.isfile(choice):
        raise ConfigError(f"--resume {choice}: expected auto, none or a checkpoint file")
    try:
        checkpoint.check_readable(choice)
    except checkpoint.CheckpointReadError as error:
        raise ConfigError(f"--resume {error}") from None
    return choice


@dataclasses.dataclass(frozen=True)
class Setup:
    """What resolve() found for a TrainConfig: the device (cpu or cuda:N), mixed precision (off, bf16, fp16), the
    peak learning rate, and the checkpoint to start from (None: afresh)."""

    device: str
    amp: str
    lr: float
    resume_path: str = None


def resolve(flags, processes, writes_run=True):
    """The Setup of a run of `flags` (a TrainConfig, as asked), and the checks that need I/O (`writes_run`: a
    --run-dir this user can write in). `processes` is distributed.Processes. Raises ConfigError."""
    check_flags(flags, writes_run)
    device = resolve_device(flags.device, processes)
    on_cuda = device.startswith("cuda")
    if flags.decode == "gpu" and not on_cuda:
        reason = "--device cpu" if flags.device == "cpu" else "no CUDA device is visible: docker run --gpus all ...?"
        raise ConfigError(
            f"--decode gpu: needs a CUDA device, and this run is on the CPU ({reason}); use --decode cpu or auto"
        )
    amp = flags.amp if on_cuda else "off"
    if amp == "auto":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    lr = flags.lr
    if lr is None:
        lr = (0.1 if flags.optimizer == "sgd" else 0.001) * flags.batch_size * processes.world_size / 256
    return Setup(device, amp, lr, resolve_resume(flags.resume, flags.run_dir))


def loader_plan(flags, device, index, processes_on_machine=1, read_tuned=True):
    """The loader plan for `flags` (a TrainConfig) on `device` with the data of `index`: this machine's CPUs and
    /dev/shm for `processes_on_machine` training processes, and (`read_tuned`) what torchlab autotune saved for
    these flags, which the plan uses for --workers auto. Raises plan.PlanError (SharedMemoryError included)."""
    tuned = None
    if read_tuned:
        key = (flags.data, flags.image_size, flags.batch_size, device, processes_on_machine)
        tuned = settings.saved_for(flags.autotune_file, *key)
    here = machine.probe(processes_on_machine, str(device).startswith("cuda"))
    decoders = plan.decoders_possible(flags.decode, here.cuda)
    data = device_decode.plan_data(index, flags.image_size, flags.batch_size, decoders)
    return plan.plan(flags.asked_loader(), tuned, here, data)
