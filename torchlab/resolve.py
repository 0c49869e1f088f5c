"""What "auto" and the checks of train.py's flags need from the machine: CUDA, the CPUs, the checkpoints in
--run-dir, the model names, autotune's saved setting and /dev/shm.

resolve() turns parse_args's TrainConfig into the one the run uses before anything is written; once the data
index is known, resolve_loader() makes the loader plan (pipeline/plan.py) and records it in the TrainConfig,
which config.json then shows. Bad input raises config.ConfigError.
"""

import dataclasses
import os
import shutil

import torch

from torchlab import checkpoint, io, model
from torchlab.config import ConfigError
from torchlab.pipeline import device_decode, loader, plan


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


def resolve(flags, processes, tuning=False):
    """The TrainConfig the run uses: every "auto" resolved (CUDA, checkpoints, the autotune file, CPUs) and the
    checks that need I/O done. `processes` is distributed.Processes; `tuning`: for torchlab autotune, which
    writes no run directory and reads no saved setting. Raises ConfigError."""
    check_flags(flags, writes_run=not tuning)
    if flags.workers != "auto" and flags.workers > loader.max_worker_count():
        raise ConfigError(
            f"--workers {flags.workers}: expected at most {loader.max_worker_count()} ({loader.MAX_WORKERS_PER_CPU} "
            f"per usable CPU, {loader.usable_cpu_count()} here), or auto"
        )
    device = resolve_device(flags.device, processes)
    on_cuda = device.startswith("cuda")
    if flags.decode == "gpu" and not on_cuda:
        reason = "--device cpu" if flags.device == "cpu" else "no CUDA device is visible: docker run --gpus all ...?"
        raise ConfigError(
            f"--decode gpu: needs a CUDA device, and this run is on the CPU ({reason}); use --decode cpu or auto"
        )
    asked = asked_loader(flags)
    tuned = None if tuning else tuned_setting(flags, device, processes.local_world_size)
    # Before the data is known: the plan without /dev/shm's fit (resolve_loader makes the one used).
    decode = tuned.get("decode", "cpu") if flags.decode == "auto" and tuned and flags.workers == "auto" else None
    cpus = loader.usable_cpu_count()
    choice = plan.plan_loader(asked, tuned, cpus, None, 0, processes.local_world_size, on_cuda, decode)
    amp = flags.amp if on_cuda else "off"
    if amp == "auto":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    lr = flags.lr
    if lr is None:
        lr = (0.1 if flags.optimizer == "sgd" else 0.001) * flags.batch_size * processes.world_size / 256
    return with_plan(
        flags,
        choice,
        device=device,
        resume_path=resolve_resume(flags.resume, flags.run_dir),
        asked_loader=dataclasses.asdict(asked),
        lr=lr,
        amp=amp,
    )


def resolve_decoder(cfg, index):
    """The TrainConfig with --decode auto resolved, once the data index is known (after resolve())."""
    return dataclasses.replace(cfg, decode=device_decode.resolve_decoder(cfg.decode, cfg.device, index))


def asked_loader(flags):
    """The loader flags of `flags` (a TrainConfig before resolve()) as plan.AskedLoader."""
    return plan.AskedLoader(
        flags.loader, flags.workers, flags.prefetch_factor, flags.jpeg_draft, flags.decode, flags.pin_memory
    )


def tuned_setting(flags, device, processes_on_machine):
    """What torchlab autotune saved for these flags (read only for --workers auto), or None."""
    if flags.workers != "auto":
        return None
    return plan.tuned_setting(
        flags.autotune_file, flags.data, flags.image_size, flags.batch_size, device, processes_on_machine
    )


def resolve_loader(cfg, index, processes_on_machine=1):
    """(the TrainConfig the loader uses, its plan.LoaderPlan), once the data index is known (after resolve()): the
    decoder resolved, then the one loader plan, /dev/shm included, from the flags as asked; the config's loader
    fields and loader_plan are what is used (config.json shows them). Raises loader.SharedMemoryError."""
    cfg = resolve_decoder(cfg, index)
    asked = plan.AskedLoader(**cfg.asked_loader) if cfg.asked_loader else asked_loader(cfg)
    tuned = tuned_setting(dataclasses.replace(cfg, workers=asked.workers), cfg.device, processes_on_machine)
    dataset = device_decode.make_dataset(cfg.decode, index, cfg.image_size, True, cfg.seed, True)
    one_batch_bytes = loader.dataset_batch_bytes(dataset, cfg.batch_size)
    on_cuda = cfg.device.startswith("cuda")
    used = plan.resolve_plan(asked, tuned, one_batch_bytes, processes_on_machine, on_cuda, cfg.decode)
    return with_plan(cfg, used, loader_plan=used.record()), used


def with_plan(cfg, choice, **fields):
    """cfg with the loader fields of `choice` (a plan.LoaderPlan), and `fields`."""
    return dataclasses.replace(
        cfg,
        loader=choice.backend,
        workers=choice.workers,
        prefetch_factor=choice.prefetch_factor,
        jpeg_draft=choice.jpeg_draft,
        decode=choice.decode,
        pin_memory=choice.pin_memory,
        autotuned=choice.autotuned,
        **fields,
    )


def loader_settings(cfg, processes_on_machine=1):
    """What build_loader takes from a resolved TrainConfig."""
    return loader.LoaderSettings(
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        prefetch_factor=cfg.prefetch_factor,
        backend=cfg.loader,
        persistent_workers=cfg.persistent_workers,
        pin_memory=cfg.pin_memory,
        seed=cfg.seed,
        processes_on_machine=processes_on_machine,
    )
