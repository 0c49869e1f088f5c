"""train.py's configuration: every flag declared once (TrainConfig), the parser made from it, and resolve().

parse_args reads the command line (and --config FILE) into a TrainConfig, checking each value's type and
bounds; resolve() then does the I/O that "auto" needs (CUDA, the checkpoints in --run-dir, the autotune file,
the CPUs) and returns the TrainConfig the run uses. Both run before train.py writes anything: a bad value is
ConfigError, which train.py reports as one line on stderr with exit code 2.
"""

import argparse
import dataclasses
import json
import math
import os
import shutil

import torch

from torchlab import checkpoint, io, model
from torchlab.data import device_decode
from torchlab.pipeline import loader, plan, settings

PROG = "train.py"
# Runs outlive the container on the /workspace volume, where Jupyter shows them (the image sets it).
DEFAULT_RUN_DIR = os.path.join(os.environ.get("TORCHLAB_RUNS", "runs"), "default")
AUTOTUNE_FILE = settings.DEFAULT_FILE


class ConfigError(ValueError):
    """A flag (or --config value) that cannot be used: one line, exit code 2."""


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

    parse.expected = expected  # what a --config null is told to give instead
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
        raise argparse.ArgumentTypeError(f"expected {worker_count.expected}, got {text!r}") from None


worker_count.expected = "auto or an integer >= 0"


def flag(default, group, help, parse=None, choices=None, switch=False):
    """A TrainConfig field that is a flag: its default, parser group, help (which states the default), the
    function that parses and checks its text (parse), its choices, or `switch` (--flag / --no-flag; a bool
    default of False without None means a plain --flag)."""
    metadata = {"group": group, "help": help, "parse": parse, "choices": choices, "switch": switch}
    return dataclasses.field(default=default, metadata=metadata)


def derived(default=None):
    """A TrainConfig field that resolve() fills in: no flag, but saved in config.json."""
    return dataclasses.field(default=default, metadata={"group": None})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # data
    data: str = flag("/data", "data", "folder with train/ and val/ folders of class folders, or one folder of "
                     "class folders, or a prepared copy (torchlab prepare) (default: /data)")  # fmt: skip
    val_fraction: float = flag(0.1, "data", "share of the images held out for validation when --data has no "
                               "val/ folder; a prepared copy keeps the split it was prepared with (default: 0.1)",
                               fraction)  # fmt: skip
    image_size: int = flag(224, "data", "side of the square network input, px (default: 224)", image_size)
    max_bad_images: int = flag(100, "data", "stop when more images than this in one epoch cannot be decoded; "
                               "they are skipped (default: 100)", non_negative_int)  # fmt: skip
    # data loading
    workers: object = flag("auto", "data loading", "decode threads (--loader threads) or worker processes (--loader "
                           "processes) per training process; 0: decoded in the training loop; auto: what "
                           "--autotune saved for this --data, --image-size, --batch-size and device, else min(8, "
                           "usable CPUs / processes on this machine), counting CPU affinity and the cgroup CPU "
                           "quota; N: at most 4 per usable CPU (default: auto)", worker_count)  # fmt: skip
    prefetch_factor: int = flag(None, "data loading", "batches loaded ahead: by all the decode threads together "
                                f"(default: {loader.DEFAULT_THREAD_BATCHES_AHEAD}), or by each worker process "
                                f"(default: {loader.DEFAULT_PREFETCH_FACTOR}); or what --autotune saved, with "
                                "--workers auto", positive_int)  # fmt: skip
    loader: str = flag("auto", "data loading", "threads: decode threads in the training process write each sample "
                       "into a reused batch buffer (nothing through /dev/shm); processes: DataLoader worker "
                       "processes, whose batches pass through /dev/shm; auto: threads where /dev/shm is too small "
                       f"for the workers' batches, else what --autotune saved, else {plan.DEFAULT_BACKEND} (faster "
                       "on a 2-CPU machine: docs/performance.md) (default: auto)",
                       choices=("auto", *loader.BACKENDS))  # fmt: skip
    jpeg_draft: bool = flag(None, "data loading", "decode JPEGs at 1/2, 1/4 or 1/8 scale when the crop allows "
                            "(default: on, or what --autotune saved, with --workers auto)", switch=True)  # fmt: skip
    decode: str = flag("auto", "data loading", "where images are decoded: cpu, in the loader threads or workers; gpu, "
                       "on the CUDA device with nvJPEG (the threads or workers only read the files; the GPU decodes, "
                       "crops, resizes and normalises each batch; files it cannot decode fall back to the CPU); "
                       "auto: what --autotune saved, else gpu on CUDA when most images are JPEGs (default: auto)",
                       choices=device_decode.DECODERS)  # fmt: skip
    persistent_workers: bool = flag(True, "data loading", "keep the workers alive between epochs (default: on)",
                                    switch=True)  # fmt: skip
    pin_memory: bool = flag(None, "data loading", "page-locked batches for asynchronous copies to the GPU "
                            "(default: on with CUDA)", switch=True)  # fmt: skip
    autotune: bool = flag(False, "data loading", "time decoder (cpu; gpu too on CUDA with JPEGs) x loader (threads, "
                          "processes) x workers x prefetch factor x JPEG draft on this --data and device within "
                          "--autotune-seconds, print "
                          "the table, save the fastest to --autotune-file for later runs with --workers auto, and "
                          "exit (default: off)")  # fmt: skip
    autotune_seconds: float = flag(60.0, "data loading", "wall-clock budget of the whole --autotune run, from the "
                                   "process's start (torch's import, indexing, every setting's start-up and "
                                   "measurement) to the saved result; the interpreter's exit comes on top (about "
                                   "5 s on 2 CPUs); a budget its start-up leaves under 1 s of saves nothing "
                                   "(default: 60)",
                                   positive_float)  # fmt: skip
    autotune_file: str = flag(AUTOTUNE_FILE, "data loading", "where --autotune saves, and --workers auto reads, "
                              f"the tuned settings (default: {AUTOTUNE_FILE})")  # fmt: skip
    loader_only: bool = flag(False, "data loading", "only read one epoch as training would (decoding, device "
                             "copy, normalising) and report images/s (default: off)")  # fmt: skip
    # model
    arch: str = flag("resnet50", "model", "a torchvision classification model, e.g. resnet18 (default: resnet50)")
    weights: str = flag(None, "model", "initial weights: a local state dict file (torchvision .pth or a "
                        "checkpoint of this script); tensors of another shape, such as the classifier, stay "
                        "initialised; nothing is downloaded (default: none)")  # fmt: skip
    compile: bool = flag(False, "model", "torch.compile the model: slower start, faster steps (default: off)")
    # optimisation
    epochs: int = flag(90, "optimisation", "epochs to train (default: 90)", positive_int)
    batch_size: int = flag(64, "optimisation", "images per step in each process (default: 64)", positive_int)
    max_steps: int = flag(None, "optimisation", "stop (with a checkpoint) after this many steps in all; the "
                          "schedule still spans --epochs (default: none)", positive_int)  # fmt: skip
    optimizer: str = flag("sgd", "optimisation", "the optimiser (default: sgd)", choices=("sgd", "adamw"))
    lr: float = flag(None, "optimisation", "peak learning rate (default: 0.1 for sgd, 0.001 for adamw, each x "
                     "batch size x processes / 256)", step_size)  # fmt: skip
    momentum: float = flag(0.9, "optimisation", "SGD momentum (default: 0.9)", fraction)
    weight_decay: float = flag(1e-4, "optimisation", "weight decay of all parameters (default: 1e-4)", decay)
    warmup_epochs: float = flag(1.0, "optimisation", "epochs of linear learning-rate warm-up before the per-step "
                                "cosine decay (default: 1)", non_negative_float)  # fmt: skip
    label_smoothing: float = flag(0.1, "optimisation", "cross-entropy label smoothing (default: 0.1)", fraction)
    amp: str = flag("auto", "optimisation", "mixed precision on CUDA (off on the CPU); auto: bf16 where the GPU "
                    "has it, else fp16 with a gradient scaler (default: auto)",
                    choices=("auto", "bf16", "fp16", "off"))  # fmt: skip
    # run
    run_dir: str = flag(DEFAULT_RUN_DIR, "run", "where config.json, metrics.jsonl and checkpoints go; use one per "
                        f"experiment (default: {DEFAULT_RUN_DIR}: $TORCHLAB_RUNS/default, which the image sets to "
                        "the /workspace volume, else runs/default)")  # fmt: skip
    resume: str = flag("auto", "run", "auto: continue from the newest checkpoint in --run-dir, if any; none: "
                       "start afresh (refused when --run-dir has checkpoints); or a checkpoint file "
                       "(default: auto)")  # fmt: skip
    device: str = flag("auto", "run", "auto: CUDA if present (default: auto)", choices=("auto", "cpu", "cuda"))
    seed: int = flag(0, "run", "seeds init, split, order, augmentation (default: 0)", seed)
    log_interval: int = flag(50, "run", "steps between progress lines and records (default: 50)", positive_int)
    checkpoint_minutes: float = flag(30.0, "run", "also checkpoint every this many minutes within an epoch; 0: "
                                     "at epoch ends only (default: 30)", non_negative_float)  # fmt: skip
    keep_checkpoints: int = flag(3, "run", "newest checkpoints kept in --run-dir (default: 3)", positive_int)
    # filled in by resolve()
    resume_path: str = derived()
    autotuned: bool = derived(False)
    asked_loader: dict = derived()  # the loader flags as given, before resolve(): plan.AskedLoader's fields
    loader_plan: dict = derived()  # the plan the loader used (resolve_loader): LoaderPlan.record()

    def loader_settings(self, processes_on_machine=1):
        """What build_loader takes from this configuration."""
        return loader.LoaderSettings(
            batch_size=self.batch_size, workers=self.workers, prefetch_factor=self.prefetch_factor,
            backend=self.loader, persistent_workers=self.persistent_workers, pin_memory=self.pin_memory,
            seed=self.seed, processes_on_machine=processes_on_machine,
        )  # fmt: skip


FLAGS = [field for field in dataclasses.fields(TrainConfig) if field.metadata["group"] is not None]
DEFAULTS = TrainConfig()


def option(field):
    return "--" + field.name.replace("_", "-")


def build_parser(prog=PROG):
    """train.py's parser, made from TrainConfig's fields, grouped as in --help."""
    parser = io.OneLineErrorParser(
        prog=prog,
        description="Train a torchvision classifier on an ImageFolder. Rerunning the same command resumes "
        "from the newest checkpoint in --run-dir. In the image, /opt/torchlab/docs/training.md tells more.",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help='a YAML or JSON file of flag defaults, e.g. {"arch": "resnet18", "batch-size": 128}; flags on '
        "the command line win (default: none)",
    )
    groups = {}
    for field in FLAGS:
        meta = field.metadata
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        if meta["switch"]:
            kind = {"action": argparse.BooleanOptionalAction}
        elif isinstance(field.default, bool):
            kind = {"action": "store_true"}
        else:
            kind = {"type": meta["parse"], "choices": meta["choices"]}
        group.add_argument(option(field), default=field.default, help=meta["help"], **kind)
    return parser


def yaml_values(text):
    """The YAML document `text`; ValueError where it is not valid YAML, naming the problem and where it is."""
    import yaml  # only for YAML files

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"not valid YAML: {getattr(error, 'problem', None) or error}{where}") from None


def config_file_defaults(path):
    """The flag defaults in a --config file: {dest: value}, each checked as its flag would be."""
    try:
        with open(path) as config_file:
            text = config_file.read()
        values = yaml_values(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError
        raise ConfigError(f"--config {path}: {error}".splitlines()[0]) from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values")
    fields = {field.name: field for field in FLAGS}
    defaults = {}
    for key, value in values.items():
        field = fields.get(str(key).replace("-", "_"))
        if field is None:
            raise ConfigError(f"--config {path}: {key!r} is not a flag of {PROG} (see --help)")
        defaults[field.name] = config_value(field, value, f"--config {path}: {key}")
    return defaults


def expected_value(meta):
    """What a flag takes, in words: one of its choices, what its parse function expects, or any text."""
    if meta["choices"] is not None:
        return f"one of {', '.join(meta['choices'])}"
    return getattr(meta["parse"], "expected", "a string")


def config_value(field, value, where):
    """A --config value as its flag takes it; null only where the flag's default is none."""
    meta = field.metadata
    if isinstance(field.default, bool) or meta["switch"]:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if value is None and field.default is not None:
        raise ConfigError(f"{where}: null is not a value for it: expected {expected_value(meta)}, or remove the "
                          f"line for the default ({field.default})")  # fmt: skip
    if value is None or (meta["parse"] is None and meta["choices"] is None):
        return value if value is None else str(value)
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"{where}: expected {expected_value(meta)}, got {value!r}")
    try:
        return meta["parse"](str(value)) if meta["parse"] else value
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_args(argv=None, prog=PROG):
    """The command line (and its --config file) as a TrainConfig, before resolve(). Bad input: ConfigError,
    or argparse's one-line error and exit 2."""
    parser = build_parser(prog)
    known, _ = parser.parse_known_args(argv)
    if known.config is not None:
        parser.set_defaults(**config_file_defaults(known.config))
    values = vars(parser.parse_args(argv))
    values.pop("config")
    return TrainConfig(**values)


def check_flags(flags):
    """The checks that need more than a flag's own text: model names, files, the compiler."""
    if flags.arch not in model.classification_model_names():
        raise ConfigError(f"--arch {flags.arch}: not a torchvision classification model (e.g. resnet18, resnet50)")
    if flags.warmup_epochs > flags.epochs:
        raise ConfigError(f"--warmup-epochs {flags.warmup_epochs}: expected at most --epochs ({flags.epochs})")
    if flags.compile and not shutil.which(os.environ.get("CXX", "g++")):
        raise ConfigError("--compile: torch.compile needs a C++ compiler (g++, or $CXX) and none is on PATH")
    if flags.weights is not None and not os.path.isfile(flags.weights):
        raise ConfigError(f"--weights {flags.weights}: no such file")
    run_dir_problem = None if flags.autotune else io.unwritable_reason(flags.run_dir)  # --autotune writes no run
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


def resolve(flags, processes):
    """The TrainConfig the run uses: every "auto" resolved (CUDA, checkpoints, the autotune file, CPUs) and the
    checks that need I/O done. `processes` is distributed.Processes. Raises ConfigError."""
    check_flags(flags)
    if flags.workers != "auto" and flags.workers > loader.max_worker_count():
        raise ConfigError(
            f"--workers {flags.workers}: expected at most {loader.max_worker_count()} ({loader.MAX_WORKERS_PER_CPU} "
            f"per usable CPU, {loader.usable_cpu_count()} here), or auto"
        )
    device = resolve_device(flags.device, processes)
    on_cuda = device.startswith("cuda")
    if flags.decode == "gpu" and not on_cuda:
        reason = "--device cpu" if flags.device == "cpu" else "no CUDA device is visible: docker run --gpus all ...?"
        raise ConfigError(f"--decode gpu: needs a CUDA device, and this run is on the CPU ({reason}); "
                          "use --decode cpu or auto")  # fmt: skip
    asked = asked_loader(flags)
    tuned = tuned_setting(flags, device, processes.local_world_size)
    # Before the data is known: the plan without /dev/shm's fit (resolve_loader makes the one used).
    decode = tuned.get("decode", "cpu") if flags.decode == "auto" and tuned and flags.workers == "auto" else None
    choice = plan.plan_loader(asked, tuned, loader.usable_cpu_count(), None, 0, processes.local_world_size, on_cuda,
                              decode)  # fmt: skip
    amp = flags.amp if on_cuda else "off"
    if amp == "auto":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    lr = flags.lr
    if lr is None:
        lr = (0.1 if flags.optimizer == "sgd" else 0.001) * flags.batch_size * processes.world_size / 256
    return dataclasses.replace(
        flags, device=device, resume_path=resolve_resume(flags.resume, flags.run_dir), workers=choice.workers,
        prefetch_factor=choice.prefetch_factor, jpeg_draft=choice.jpeg_draft, decode=choice.decode,
        loader=choice.backend, autotuned=choice.autotuned, asked_loader=dataclasses.asdict(asked),
        pin_memory=on_cuda if flags.pin_memory is None else flags.pin_memory, lr=lr, amp=amp,
    )  # fmt: skip


def resolve_decoder(cfg, index):
    """The TrainConfig with --decode auto resolved, once the data index is known (after resolve())."""
    return dataclasses.replace(cfg, decode=device_decode.resolve_decoder(cfg.decode, cfg.device, index))


def asked_loader(flags):
    """The loader flags of `flags` (a TrainConfig before resolve()) as plan.AskedLoader."""
    return plan.AskedLoader(flags.loader, flags.workers, flags.prefetch_factor, flags.jpeg_draft, flags.decode,
                            flags.pin_memory)  # fmt: skip


def tuned_setting(flags, device, processes_on_machine):
    """What --autotune saved for these flags (read only for --workers auto, and not by --autotune), or None."""
    if flags.workers != "auto" or flags.autotune:
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
    used = plan.resolve_plan(
        asked, tuned, loader.dataset_batch_bytes(dataset, cfg.batch_size), processes_on_machine,
        cfg.device.startswith("cuda"), cfg.decode,
    )  # fmt: skip
    cfg = dataclasses.replace(
        cfg, loader=used.backend, workers=used.workers, prefetch_factor=used.prefetch_factor,
        jpeg_draft=used.jpeg_draft, pin_memory=used.pin_memory, autotuned=used.autotuned, loader_plan=used.record(),
    )  # fmt: skip
    return cfg, used
