"""train.py's command line: the flags with their defaults, the checks, and the values "auto" resolves to.

Everything here runs before train.py writes anything: a bad value is one line on stderr and exit code 2.
"""

import argparse
import math
import os
import shutil
import sys

import torch

import autotune
import checkpoint
import distributed
import loader
import model

PROG = "train.py"
DEFAULT_PREFETCH_FACTOR = 4
# Runs outlive the container on the /workspace volume, where Jupyter shows them (the image sets it).
DEFAULT_RUN_DIR = os.path.join(os.environ.get("TORCHLAB_RUNS", "runs"), "default")


def exit_with_usage_error(message):
    """Bad input: one line on stderr and exit code 2, argparse's convention. Control characters in what the
    user typed (a newline, say) are shown escaped, so the line stays one line."""
    message = "".join(char if char.isprintable() else repr(char)[1:-1] for char in message)
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage block), like every other input error here."""

    def error(self, message):
        exit_with_usage_error(f"{message} (see --help)")


def number(kind, minimum, *, above=False, below=None, at_most=None):
    """An argparse type: a finite `kind` (int or float) >= minimum (> when `above`), < `below` and
    <= `at_most` when given."""
    bounds = [f"{'>' if above else '>='} {minimum}"] + ([f"< {below}"] if below is not None else [])
    bounds += [f"<= {at_most}"] if at_most is not None else []
    expected = f"{'an integer' if kind is int else 'a number'} {' and '.join(bounds)}"

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if (
            not (math.isfinite(value) and (value > minimum if above else value >= minimum))
            or (below is not None and value >= below)
            or (at_most is not None and value > at_most)
        ):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = number(int, 0, above=True)
non_negative_int = number(int, 0)
positive_float = number(float, 0, above=True)
non_negative_float = number(float, 0)
fraction = number(float, 0, below=1)
# Bounds where larger values only overflow: float32 steps, and the seeds of every RNG (numpy's are 32-bit).
step_size = number(float, 0, above=True, at_most=1000)
decay = number(float, 0, at_most=1000)
seed = number(int, 0, below=2**32)
image_size = number(int, 0, above=True, at_most=4096)


def worker_count(text):
    if text == "auto":
        return text
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer >= 0, got {text!r}") from None


def build_parser():
    parser = OneLineErrorParser(
        prog=PROG,
        description="Train a torchvision classifier on an ImageFolder. Rerunning the same command resumes "
        "from the newest checkpoint in --run-dir. See README.md beside train.py.",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        default="/data",
        help="folder with train/ and val/ folders of class folders, or one folder of class folders (default: /data)",
    )
    data.add_argument(
        "--val-fraction",
        type=fraction,
        default=0.1,
        help="share of the images held out for validation when --data has no val/ folder (default: 0.1)",
    )
    data.add_argument(
        "--image-size", type=image_size, default=224, help="side of the square network input, px (default: 224)"
    )
    data.add_argument(
        "--max-bad-images",
        type=non_negative_int,
        default=100,
        help="stop when more images than this in one epoch cannot be decoded; they are skipped (default: 100)",
    )

    loading = parser.add_argument_group("data loading")
    loading.add_argument(
        "--workers",
        type=worker_count,
        default="auto",
        help="loader processes per training process; auto: what --autotune saved for this --data, --image-size, "
        "--batch-size and device, else min(8, usable CPUs / processes on this machine), counting CPU affinity "
        "and the cgroup CPU quota (default: auto)",
    )
    loading.add_argument(
        "--prefetch-factor",
        type=positive_int,
        default=None,
        help=f"batches each worker loads ahead (default: {DEFAULT_PREFETCH_FACTOR}, or what --autotune saved, "
        "with --workers auto)",
    )
    loading.add_argument(
        "--jpeg-draft",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode JPEGs at 1/2, 1/4 or 1/8 scale when the crop allows (default: on, or what --autotune saved, "
        "with --workers auto)",
    )
    loading.add_argument(
        "--persistent-workers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the workers alive between epochs (default: on)",
    )
    loading.add_argument(
        "--pin-memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="page-locked batches for asynchronous copies to the GPU (default: on with CUDA)",
    )
    loading.add_argument(
        "--autotune",
        action="store_true",
        help="time workers x prefetch factor x JPEG draft on this --data and device for --autotune-seconds, "
        "print the table, save the fastest to --autotune-file for later runs with --workers auto, and exit "
        "(default: off)",
    )
    loading.add_argument(
        "--autotune-seconds",
        type=positive_float,
        default=60.0,
        help="time --autotune spends measuring, in all (default: 60)",
    )
    loading.add_argument(
        "--autotune-file",
        default=autotune.DEFAULT_FILE,
        help=f"where --autotune saves, and --workers auto reads, the tuned settings (default: {autotune.DEFAULT_FILE})",
    )
    loading.add_argument(
        "--loader-only",
        action="store_true",
        help="only read one epoch as training would (decoding, device copy, normalising) and report "
        "images/s (default: off)",
    )

    network = parser.add_argument_group("model")
    network.add_argument(
        "--arch", default="resnet50", help="a torchvision classification model, e.g. resnet18 (default: resnet50)"
    )
    network.add_argument(
        "--weights",
        default=None,
        help="initial weights: a local state dict file (torchvision .pth or a checkpoint of this script); "
        "tensors of another shape, such as the classifier, stay initialised; nothing is downloaded (default: none)",
    )
    network.add_argument(
        "--compile", action="store_true", help="torch.compile the model: slower start, faster steps (default: off)"
    )

    optimisation = parser.add_argument_group("optimisation")
    optimisation.add_argument("--epochs", type=positive_int, default=90, help="epochs to train (default: 90)")
    optimisation.add_argument(
        "--batch-size", type=positive_int, default=64, help="images per step in each process (default: 64)"
    )
    optimisation.add_argument(
        "--max-steps",
        type=positive_int,
        default=None,
        help="stop (with a checkpoint) after this many steps in all; the schedule still spans --epochs "
        "(default: none)",
    )
    optimisation.add_argument(
        "--optimizer", choices=("sgd", "adamw"), default="sgd", help="the optimiser (default: sgd)"
    )
    optimisation.add_argument(
        "--lr",
        type=step_size,
        default=None,
        help="peak learning rate (default: 0.1 for sgd, 0.001 for adamw, each x batch size x processes / 256)",
    )
    optimisation.add_argument("--momentum", type=fraction, default=0.9, help="SGD momentum (default: 0.9)")
    optimisation.add_argument(
        "--weight-decay", type=decay, default=1e-4, help="weight decay of all parameters (default: 1e-4)"
    )
    optimisation.add_argument(
        "--warmup-epochs",
        type=non_negative_float,
        default=1.0,
        help="epochs of linear learning-rate warm-up before the per-step cosine decay (default: 1)",
    )
    optimisation.add_argument(
        "--label-smoothing", type=fraction, default=0.1, help="cross-entropy label smoothing (default: 0.1)"
    )
    optimisation.add_argument(
        "--amp",
        choices=("auto", "bf16", "fp16", "off"),
        default="auto",
        help="mixed precision on CUDA (off on the CPU); auto: bf16 where the GPU has it, else fp16 with "
        "a gradient scaler (default: auto)",
    )

    run = parser.add_argument_group("run")
    run.add_argument(
        "--run-dir",
        default=DEFAULT_RUN_DIR,
        help="where config.json, metrics.jsonl and checkpoints go; use one per experiment (default: %(default)s: "
        "$TORCHLAB_RUNS/default, which the image sets to the /workspace volume, else runs/default)",
    )
    run.add_argument(
        "--resume",
        default="auto",
        help="auto: continue from the newest checkpoint in --run-dir, if any; none: start afresh (refused when "
        "--run-dir has checkpoints); or a checkpoint file (default: auto)",
    )
    run.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA if present (default: auto)"
    )
    run.add_argument("--seed", type=seed, default=0, help="seeds init, split, order, augmentation (default: 0)")
    run.add_argument(
        "--log-interval", type=positive_int, default=50, help="steps between progress lines and records (default: 50)"
    )
    run.add_argument(
        "--checkpoint-minutes",
        type=non_negative_float,
        default=30.0,
        help="also checkpoint every this many minutes within an epoch; 0: at epoch ends only (default: 30)",
    )
    run.add_argument(
        "--keep-checkpoints", type=positive_int, default=3, help="newest checkpoints kept in --run-dir (default: 3)"
    )
    return parser


def resolve_device(choice, processes):
    if choice == "cuda" and not torch.cuda.is_available():
        exit_with_usage_error("--device cuda: no CUDA device is visible (docker run --gpus all ...?)")
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
            exit_with_usage_error(
                f"--resume none, but {run_dir} has checkpoints: pick another --run-dir or --resume auto"
            )
        return None
    if not os.path.isfile(choice):
        exit_with_usage_error(f"--resume {choice}: expected auto, none or a checkpoint file")
    return choice


def parse_args(argv=None, processes=None):
    """Parse and check train.py's flags; returns them with every "auto" resolved, plus resume_path.

    `processes` (distributed.Processes) defaults to what torchrun's environment says.
    """
    processes = processes or distributed.processes_from_environment()
    args = build_parser().parse_args(argv)
    if args.arch not in model.classification_model_names():
        exit_with_usage_error(f"--arch {args.arch}: not a torchvision classification model (e.g. resnet18, resnet50)")
    if args.warmup_epochs > args.epochs:
        exit_with_usage_error(f"--warmup-epochs {args.warmup_epochs}: expected at most --epochs ({args.epochs})")
    if args.compile and not shutil.which(os.environ.get("CXX", "g++")):
        exit_with_usage_error("--compile: torch.compile needs a C++ compiler (g++, or $CXX) and none is on PATH")
    if args.weights is not None and not os.path.isfile(args.weights):
        exit_with_usage_error(f"--weights {args.weights}: no such file")
    args.device = resolve_device(args.device, processes)
    on_cuda = args.device.startswith("cuda")
    args.resume_path = resolve_resume(args.resume, args.run_dir)
    tuned = None
    if args.workers == "auto" and not args.autotune:
        tuned = autotune.saved_setting(args.autotune_file, autotune.setting_key(args, processes))
    if args.workers == "auto":
        args.workers = tuned["workers"] if tuned else loader.auto_worker_count(processes.local_world_size)
    if args.prefetch_factor is None:
        args.prefetch_factor = tuned["prefetch_factor"] if tuned else DEFAULT_PREFETCH_FACTOR
    if args.jpeg_draft is None:
        args.jpeg_draft = tuned["jpeg_draft"] if tuned else True
    args.autotuned = tuned is not None
    if args.pin_memory is None:
        args.pin_memory = on_cuda
    if args.lr is None:
        args.lr = (0.1 if args.optimizer == "sgd" else 0.001) * args.batch_size * processes.world_size / 256
    if args.amp == "auto":
        args.amp = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_cuda else "off"
    elif not on_cuda:
        args.amp = "off"
    return args
