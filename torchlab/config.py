"""train.py's flags: every flag declared once (TrainConfig), with its default, help and check, and the parser made
from them; the tools that take some of them (doctor, autotune, gpu-check) add them from here.

parse_args reads the command line (and --config FILE) into a TrainConfig: what was asked, frozen, each value's
type and bounds checked. What needs the machine (CUDA, the checkpoints in --run-dir) is resolve.py's; the loader's
flags become the loader plan (pipeline/plan.py). A bad value is ConfigError, which train.py reports as one line
on stderr with exit code 2.
"""

import argparse
import dataclasses
import json
import os

from torchlab import parsing
from torchlab.pipeline import gil, plan

PROG = "train.py"
# Runs outlive the container on the /workspace volume, where Jupyter shows them (the image sets it).
DEFAULT_RUN_DIR = os.path.join(os.environ.get("TORCHLAB_RUNS", "runs"), "default")
# autotune's saved settings: on the work volume where the image's start names one (TORCHLAB_WORK_DIR), so that they
# outlive a re-created container; else in the home's cache.
AUTOTUNE_FILE = os.path.join(os.environ.get("TORCHLAB_WORK_DIR") or "~", ".cache/torchlab/autotune.json")


class ConfigError(ValueError):
    """A flag (or --config value) that cannot be used: one line, exit code 2."""


def flag(default, group, help, parse=None, choices=None, switch=False):
    """A TrainConfig field that is a flag: its default, parser group, help (which states the default), the
    function that parses and checks its text (parse), its choices (checked by a parse of their own), or `switch`
    (--flag / --no-flag; a bool default of False without None means a plain --flag)."""
    if choices is not None:
        parse = parsing.one_of(choices)
    metadata = {"group": group, "help": help, "parse": parse, "choices": choices, "switch": switch}
    return dataclasses.field(default=default, metadata=metadata)


def worker_count(text):
    if text == "auto":
        return text
    try:
        return parsing.non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {worker_count.expected}, got {text!r}") from None


worker_count.expected = "auto or an integer >= 0"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    # data
    data: str = flag(
        "/data",
        "data",
        "folder with train/ and val/ folders of class folders, or one folder of class folders, or a prepared copy "
        "(torchlab prepare) (default: /data)",
    )
    val_fraction: float = flag(
        0.1,
        "data",
        "share of the images held out for validation when --data has no val/ folder; a prepared copy keeps the "
        "split it was prepared with (default: 0.1)",
        parsing.fraction,
    )
    image_size: int = flag(224, "data", "side of the square network input, px (default: 224)", parsing.image_size)
    max_bad_images: int = flag(
        100,
        "data",
        "stop when more images than this in one epoch cannot be decoded; they are skipped (default: 100)",
        parsing.non_negative_int,
    )
    # data loading
    workers: object = flag(
        "auto",
        "data loading",
        "decode threads (--loader threads) or worker processes (--loader processes) per training process; 0: "
        "decoded in the training loop; auto: what torchlab autotune saved for this --data, --image-size, "
        f"--batch-size and device, else min({plan.MAX_AUTO_WORKERS}, usable CPUs / processes on this machine), "
        "counting CPU affinity and the cgroup CPU quota; N: at most "
        f"{plan.MAX_WORKERS_PER_CPU['processes']} worker processes or {plan.MAX_WORKERS_PER_CPU['threads']} decode "
        "threads per usable CPU (default: auto)",
        worker_count,
    )
    prefetch_factor: int = flag(
        None,
        "data loading",
        f"batches loaded ahead: by all the decode threads together (default: {plan.DEFAULT_THREAD_BATCHES_AHEAD}), or "
        f"by each worker process (default: {plan.DEFAULT_PREFETCH_FACTOR}); or what torchlab autotune saved, with "
        "--workers auto",
        parsing.positive_int,
    )
    loader: str = flag(
        "auto",
        "data loading",
        "threads: decode threads in the training process write each sample into a reused batch buffer (nothing "
        "through /dev/shm); processes: DataLoader worker processes, whose batches pass through /dev/shm; auto: "
        "threads where /dev/shm is too small for the workers' batches, else what torchlab autotune saved, else "
        "processes where the decoding spans more CPUs than one process's threads keep busy before the GIL limits "
        f"them (about {gil.thread_cpu_ceiling():.0f}), else {plan.DEFAULT_LOADER} (faster on a 2-CPU machine: "
        "docs/performance.md) (default: auto)",
        choices=("auto", *plan.LOADERS),
    )
    jpeg_draft: bool = flag(
        None,
        "data loading",
        "decode JPEGs at 1/2, 1/4 or 1/8 scale when the crop allows (default: on, or what torchlab autotune "
        "saved, with --workers auto)",
        switch=True,
    )
    decode: str = flag(
        "auto",
        "data loading",
        "where images are decoded: cpu, in the loader threads or workers; gpu, on the CUDA device with nvJPEG "
        "(the threads or workers only read the files; the GPU decodes, crops, resizes and normalises each batch; "
        "files it cannot decode fall back to the CPU); auto: what torchlab autotune saved, else gpu on CUDA when "
        "most images are JPEGs (default: auto)",
        choices=plan.DECODERS,
    )
    persistent_workers: bool = flag(
        True, "data loading", "keep the workers alive between epochs (default: on)", switch=True
    )
    pin_memory: bool = flag(
        None,
        "data loading",
        "page-locked batches for asynchronous copies to the GPU (default: on with CUDA)",
        switch=True,
    )
    autotune_seconds: float = flag(
        60.0,
        "data loading",
        "wall-clock budget of torchlab autotune, from the process's start (torch's import, indexing, every "
        "setting's start-up and measurement) to the saved result; the interpreter's exit comes on top (about 5 s "
        "on 2 CPUs); a budget its start-up leaves under 1 s of saves nothing (default: 60)",
        parsing.positive_float,
    )
    autotune_file: str = flag(
        AUTOTUNE_FILE,
        "data loading",
        f"where torchlab autotune saves, and --workers auto reads, the tuned settings (default: {AUTOTUNE_FILE})",
    )
    loader_only: bool = flag(
        False,
        "data loading",
        "only read one epoch as training would (decoding, device copy, normalising) and report images/s "
        "(default: off)",
    )
    # model
    arch: str = flag("resnet50", "model", "a torchvision classification model, e.g. resnet18 (default: resnet50)")
    weights: str = flag(
        None,
        "model",
        "initial weights: a local state dict file (torchvision .pth or a checkpoint of this script); tensors of "
        "another shape, such as the classifier, stay initialised; nothing is downloaded (default: none)",
    )
    compile: bool = flag(False, "model", "torch.compile the model: slower start, faster steps (default: off)")
    # optimisation
    epochs: int = flag(90, "optimisation", "epochs to train (default: 90)", parsing.positive_int)
    batch_size: int = flag(64, "optimisation", "images per step in each process (default: 64)", parsing.positive_int)
    max_steps: int = flag(
        None,
        "optimisation",
        "stop (with a checkpoint) after this many steps in all; the schedule still spans --epochs (default: none)",
        parsing.positive_int,
    )
    optimizer: str = flag("sgd", "optimisation", "the optimiser (default: sgd)", choices=("sgd", "adamw"))
    lr: float = flag(
        None,
        "optimisation",
        "peak learning rate (default: 0.1 for sgd, 0.001 for adamw, each x batch size x processes / 256)",
        parsing.step_size,
    )
    momentum: float = flag(0.9, "optimisation", "SGD momentum (default: 0.9)", parsing.fraction)
    weight_decay: float = flag(1e-4, "optimisation", "weight decay of all parameters (default: 1e-4)", parsing.decay)
    warmup_epochs: float = flag(
        1.0,
        "optimisation",
        "epochs of linear learning-rate warm-up before the per-step cosine decay (default: 1)",
        parsing.non_negative_float,
    )
    label_smoothing: float = flag(0.1, "optimisation", "cross-entropy label smoothing (default: 0.1)", parsing.fraction)
    amp: str = flag(
        "auto",
        "optimisation",
        "mixed precision on CUDA (off on the CPU); auto: bf16 where the GPU has it, else fp16 with a gradient "
        "scaler (default: auto)",
        choices=("auto", "bf16", "fp16", "off"),
    )
    # run
    run_dir: str = flag(
        DEFAULT_RUN_DIR,
        "run",
        f"where config.json, metrics.jsonl and checkpoints go; use one per experiment (default: {DEFAULT_RUN_DIR}: "
        "$TORCHLAB_RUNS/default, which the image sets to the /workspace volume, else runs/default)",
    )
    resume: str = flag(
        "auto",
        "run",
        "auto: continue from the newest checkpoint in --run-dir, if any; none: start afresh (refused when "
        "--run-dir has checkpoints); or a checkpoint file (default: auto)",
    )
    device: str = flag("auto", "run", "auto: CUDA if present (default: auto)", choices=("auto", "cpu", "cuda"))
    seed: int = flag(0, "run", "seeds init, split, order, augmentation (default: 0)", parsing.seed)
    log_interval: int = flag(50, "run", "steps between progress lines and records (default: 50)", parsing.positive_int)
    checkpoint_minutes: float = flag(
        30.0,
        "run",
        "also checkpoint every this many minutes within an epoch; 0: at epoch ends only (default: 30)",
        parsing.non_negative_float,
    )
    keep_checkpoints: int = flag(3, "run", "newest checkpoints kept in --run-dir (default: 3)", parsing.positive_int)

    def asked_loader(self):
        """The loader flags as the plan takes them (plan.Asked)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(plan.Asked)}
        return plan.Asked(**fields)


FLAGS = dataclasses.fields(TrainConfig)
DEFAULTS = TrainConfig()


DESCRIPTION = (
    "Train a torchvision classifier on an ImageFolder. Rerunning the same command resumes from the newest "
    "checkpoint in --run-dir. In the image, /opt/torchlab/docs/training.md tells more."
)


def option(field):
    return "--" + field.name.replace("_", "-")


def add_flags(parser, names=None):
    """Add train.py's flags (those in `names`, default all), grouped as in --help, to `parser`: a tool that takes
    some of them declares none of its own."""
    groups = {}
    for field in FLAGS:
        if names is not None and field.name not in names:
            continue
        meta = field.metadata
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        if meta["switch"]:
            kind = {"action": argparse.BooleanOptionalAction}
        elif isinstance(field.default, bool):
            kind = {"action": "store_true"}
        else:
            kind = {"type": meta["parse"], "choices": meta["choices"]}
        group.add_argument(option(field), default=field.default, help=meta["help"], **kind)


def build_parser(prog=PROG, description=DESCRIPTION):
    """train.py's parser, made from TrainConfig's fields, grouped as in --help."""
    parser = parsing.OneLineErrorParser(prog=prog, description=description)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help='a YAML or JSON file of flag defaults, e.g. {"arch": "resnet18", "batch-size": 128}; flags on '
        "the command line win (default: none)",
    )
    add_flags(parser)
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
    """What a flag takes, in words: what its parse function expects (one of its choices), or any text."""
    return getattr(meta["parse"], "expected", "a string")


def config_value(field, value, where):
    """A --config value as its flag takes it; null only where the flag's default is none."""
    meta = field.metadata
    if isinstance(field.default, bool) or meta["switch"]:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if value is None and field.default is not None:
        raise ConfigError(
            f"{where}: null is not a value for it: expected {expected_value(meta)}, or remove the line for the "
            f"default ({field.default})"
        )
    if value is None or meta["parse"] is None:
        return value if value is None else str(value)
    try:
        return meta["parse"](str(value))
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_args(argv=None, prog=PROG, description=DESCRIPTION):
    """The command line (and its --config file) as a TrainConfig, before resolve.resolve(). Bad input:
    ConfigError, or argparse's one-line error and exit 2."""
    parser = build_parser(prog, description)
    known, _ = parser.parse_known_args(argv)
    if known.config is not None:
        parser.set_defaults(**config_file_defaults(known.config))
    values = vars(parser.parse_args(argv))
    values.pop("config")
    return TrainConfig(**values)
