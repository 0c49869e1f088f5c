"""The loader plan: plan(asked, tuned, machine, data) turns the loader flags as asked, autotune's saved setting, the
machine (usable CPUs, /dev/shm, training processes, CUDA) and the data (one batch's bytes, whether it is mostly
JPEGs) into what the loader does, with the reason for each choice. It is pure and runs once per loader; train.py,
the doctor, bench, autotune and create_loader all call it, and build.build_input (loader.build_loader for
create_loader) takes nothing but its answer.
A run records the plan as used: its start line, metrics.jsonl's first record, config.json and environment.json.

The pipeline's vocabulary and defaults live here too, so that train.py's flags (config.py) are declared in its
terms. Nothing here imports torch.

--loader auto: threads wherever /dev/shm is too small for the worker processes' batches; else what torchlab
autotune saved; else worker processes where the decoding spans more CPUs than one process's threads keep busy
before the GIL limits them (gil.py's model, from `make bench`'s measurements); else DEFAULT_LOADER, the one
`make bench` measured faster on a 2-CPU machine of this kind (decode threads share one process's memory and pass
nothing through /dev/shm: docs/performance.md gives the figures).
"""

import dataclasses
import numbers

from torchlab.pipeline import gil

LOADERS = ("threads", "processes")
DEFAULT_LOADER = "threads"
DECODERS = ("auto", "cpu", "gpu")
DEFAULT_PREFETCH_FACTOR = 4  # batches each worker process loads ahead
DEFAULT_THREAD_BATCHES_AHEAD = 2  # the thread loader's batches decoded ahead of the one in use
MAX_AUTO_WORKERS = 8
# --workers N above these per usable CPU is refused. Each worker process is a copy of the training process
# (hundreds of MB), so more only add memory and start-up time; decode threads cost a stack each, and more of them
# help only samples that mostly wait (reading from slow storage), up to the GIL's ceiling (gil.py).
MAX_WORKERS_PER_CPU = {"processes": 4, "threads": 32}
UNITS = {"processes": "worker processes", "threads": "decode threads"}
# Besides the workers x prefetch_factor batches in flight, the main process holds the batch it is using and
# the one it has just received, both still in /dev/shm.
BATCHES_HELD_BY_MAIN = 2
MB = 1e6


class PlanError(Exception):
    """The loader flags cannot be used on this machine: one line that says what to give instead."""


class SharedMemoryError(PlanError):
    """/dev/shm cannot hold even one worker process's batches: the message says how to fix it."""


def is_count(value, least=0):
    """Whether `value` is a whole number (a bool is not one) of at least `least`."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least


def is_optional_bool(value):
    return value is None or isinstance(value, bool)


def check_fields(record, checks):
    """ValueError in one line naming `record`'s first field whose value fails its check, the value and what is
    expected; `checks` maps each field to (whether its value is right, what is expected)."""
    for name, (right, expected) in checks.items():
        if not right:
            raise ValueError(f"{type(record).__name__}: {name}={getattr(record, name)!r}; expected {expected}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asked:
    """The loader flags as given: loader (auto, threads, processes), workers (auto or N), prefetch_factor and
    jpeg_draft (None: not given), decode (auto, cpu, gpu), pin_memory (None: with CUDA), and the batches' size,
    seed and whether worker processes live across passes. An autotune setting is one with every choice made."""

    loader: str = "auto"
    workers: object = "auto"
    prefetch_factor: int = None
    jpeg_draft: bool = None
    decode: str = "auto"
    pin_memory: bool = None
    batch_size: int = 64
    seed: int = 0
    persistent_workers: bool = True

    def __post_init__(self):
        check_fields(
            self,
            {
                "loader": (self.loader in ("auto", *LOADERS), f"one of auto, {', '.join(LOADERS)}"),
                "workers": (self.workers == "auto" or is_count(self.workers), "auto or an integer >= 0"),
                "prefetch_factor": (
                    self.prefetch_factor is None or is_count(self.prefetch_factor, 1),
                    "None or an integer >= 1",
                ),
                "jpeg_draft": (is_optional_bool(self.jpeg_draft), "None, True or False"),
                "decode": (self.decode in DECODERS, f"one of {', '.join(DECODERS)}"),
                "pin_memory": (is_optional_bool(self.pin_memory), "None, True or False"),
                "batch_size": (is_count(self.batch_size, 1), "an integer >= 1"),
                "seed": (is_count(self.seed), "an integer >= 0"),
                "persistent_workers": (isinstance(self.persistent_workers, bool), "True or False"),
            },
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Data:
    """What the plan takes of the data: one batch's bytes in /dev/shm for each decoder it may pick (cpu: decoded
    pixels; gpu: the encoded files), and whether most files are JPEGs (--decode auto's gpu needs that)."""

    batch_bytes: dict
    mostly_jpegs: bool = False

    def __post_init__(self):
        decoders = DECODERS[1:]
        check_fields(
            self,
            {
                "batch_bytes": (
                    isinstance(self.batch_bytes, dict)
                    and "cpu" in self.batch_bytes
                    and all(name in decoders and is_count(size, 1) for name, size in self.batch_bytes.items()),
                    f"bytes >= 1 by decoder ({', '.join(decoders)}), cpu's at least",
                ),
                "mostly_jpegs": (isinstance(self.mostly_jpegs, bool), "True or False"),
            },
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderPlan:
    """What the loader does, and why where it is not simply what was asked (reasons: field -> why)."""

    loader: str
    workers: int  # decode threads, or worker processes; 0: decoded in the training loop
    prefetch_factor: int  # threads: batches decoded ahead; processes: batches each worker loads ahead
    decode: str
    jpeg_draft: bool
    pin_memory: bool
    batch_size: int = 64
    seed: int = 0
    persistent_workers: bool = True
    autotuned: bool = False
    batch_bytes: int = 0  # one batch's bytes, as /dev/shm holds it between worker processes
    # /dev/shm bytes the worker processes' batches need at most as asked (before any lowering to fit), over the
    # training processes on this machine
    shm_needed: int = 0
    reasons: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        decoders = DECODERS[1:]
        check_fields(
            self,
            {
                "loader": (self.loader in LOADERS, f"one of {', '.join(LOADERS)}"),
                "workers": (is_count(self.workers), "an integer >= 0"),
                "prefetch_factor": (is_count(self.prefetch_factor, 1), "an integer >= 1"),
                "decode": (self.decode in decoders, f"one of {', '.join(decoders)}"),
                "jpeg_draft": (isinstance(self.jpeg_draft, bool), "True or False"),
                "pin_memory": (isinstance(self.pin_memory, bool), "True or False"),
                "batch_size": (is_count(self.batch_size, 1), "an integer >= 1"),
                "seed": (is_count(self.seed), "an integer >= 0"),
                "persistent_workers": (isinstance(self.persistent_workers, bool), "True or False"),
                "autotuned": (isinstance(self.autotuned, bool), "True or False"),
                "batch_bytes": (is_count(self.batch_bytes), "an integer >= 0"),
                "shm_needed": (is_count(self.shm_needed), "an integer >= 0"),
                "reasons": (isinstance(self.reasons, dict), "a dict of field -> why"),
            },
        )

    @property
    def batches_in_flight(self):
        """Batches decoded ahead of the one in use: all the threads' together, or workers x prefetch_factor."""
        if self.workers == 0:
            return 0
        return self.prefetch_factor if self.loader == "threads" else self.workers * self.prefetch_factor

    def describe(self):
        """The plan in one line, e.g. "threads: 2 decode threads, 2 batches ahead, --decode cpu, JPEG draft on"
        with each reason in brackets."""

        def why(field):
            return f" ({self.reasons[field]})" if field in self.reasons else ""

        if self.workers == 0:
            parallel = "decoded in the training loop"
        elif self.loader == "threads":
            parallel = f"{self.workers} decode threads, {self.prefetch_factor} batches ahead"
        else:
            parallel = f"{self.workers} worker processes x {self.prefetch_factor} batches ahead"
        parts = [
            f"{self.loader}{why('loader')}",
            f"{parallel}{why('workers')}",
            f"--decode {self.decode}{why('decode')}",
            f"JPEG draft {'on' if self.jpeg_draft else 'off'}",
        ]
        return "; ".join(parts)

    def record(self):
        """The plan as config.json, metrics.jsonl and environment.json keep it."""
        return {**dataclasses.asdict(self), "batches_in_flight": self.batches_in_flight}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedMemoryFit:
    """fit_shared_memory's answer: the /dev/shm bytes the asked settings need (all processes on the machine),
    whether they fit, and the (workers, prefetch_factor) the loader uses, or possible=False when not even one
    worker's batches fit."""

    needed: int
    fits: bool
    workers: int
    prefetch_factor: int
    possible: bool


def batches_held(loader, workers, prefetch_factor):
    """Batches a loader holds at once: the thread loader's ring (those ahead and the one in use); worker
    processes' in flight and those the main process holds; or, with no worker processes, the one being made."""
    if loader == "threads":
        return prefetch_factor + 1
    return workers * prefetch_factor + BATCHES_HELD_BY_MAIN if workers > 0 else 1


def shared_memory_needed(workers, prefetch_factor, one_batch_bytes, processes=1):
    """/dev/shm bytes that the loaders' batches take at most: the batches worker processes hold (none without
    them), in each training process."""
    return processes * batches_held("processes", workers, prefetch_factor) * one_batch_bytes if workers > 0 else 0


def fit_shared_memory(workers, prefetch_factor, one_batch_bytes, free_bytes, processes=1):
    """The (workers, prefetch_factor) nearest those asked for whose batches fit in free_bytes of /dev/shm
    (None: no /dev/shm, nothing fits but no workers), shared by the processes on this machine: prefetch_factor
    is lowered first, then workers. Works in one step for any flag values."""
    needed = shared_memory_needed(workers, prefetch_factor, one_batch_bytes, processes)
    if needed == 0 or (free_bytes is not None and needed <= free_bytes):
        return SharedMemoryFit(
            needed=needed, fits=True, workers=workers, prefetch_factor=prefetch_factor, possible=True
        )
    # Batches that may be in flight in each process: what fits, less those its main process holds.
    in_flight = (free_bytes or 0) // processes // one_batch_bytes - BATCHES_HELD_BY_MAIN
    if in_flight >= workers:
        return SharedMemoryFit(
            needed=needed, fits=False, workers=workers, prefetch_factor=in_flight // workers, possible=True
        )
    if in_flight >= 1:
        return SharedMemoryFit(needed=needed, fits=False, workers=in_flight, prefetch_factor=1, possible=True)
    return SharedMemoryFit(needed=needed, fits=False, workers=0, prefetch_factor=prefetch_factor, possible=False)


def tuned_reason(tuned):
    """How the plan names a saved setting: "autotuned (saved DATE, for these flags)"."""
    saved = tuned.get("tuned_at", "")[:10] or "at an unknown date"
    return f"autotuned (saved {saved}, for these flags)"


def check_workers(asked_workers, loader, machine):
    """PlanError where --workers N is more than MAX_WORKERS_PER_CPU allows `loader` on this machine."""
    most = MAX_WORKERS_PER_CPU[loader] * machine.cpus
    if asked_workers != "auto" and asked_workers > most:
        raise PlanError(
            f"--workers {asked_workers}: expected at most {most} {UNITS[loader]} ({MAX_WORKERS_PER_CPU[loader]} "
            f"per usable CPU, {machine.cpus} here), or auto"
        )


def auto_workers(cpus, processes=1):
    """--workers auto without a saved setting: one per usable CPU of this process's share (`processes` training
    processes on the machine), at least one, at most MAX_AUTO_WORKERS."""
    return min(MAX_AUTO_WORKERS, max(1, cpus // processes))


def auto_decoder(cuda, mostly_jpegs):
    """--decode auto without a saved setting: gpu on CUDA where most files are JPEGs, else cpu."""
    return "gpu" if cuda and mostly_jpegs else "cpu"


def planned_workers(asked_workers, tuned, machine, reasons):
    """--workers as given, else the saved setting's (`tuned`, None: none), else auto_workers; the reason goes
    into `reasons` where it was not given."""
    if asked_workers != "auto":
        return asked_workers
    if tuned is not None:
        reasons["workers"] = tuned_reason(tuned)
        return tuned["workers"]
    reasons["workers"] = f"auto: {machine.cpus} usable CPUs / {machine.processes} processes"
    return auto_workers(machine.cpus, machine.processes)


def decoders_possible(asked_decode, cuda):
    """The decoders a plan for --decode `asked_decode` may pick: those whose figures its Data needs."""
    if asked_decode != "auto":
        return (asked_decode,)
    return ("cpu", "gpu") if cuda else ("cpu",)


def planned_decode(asked, tuned, machine, data, reasons):
    """--decode as given; auto: the saved setting's, else gpu on CUDA where most files are JPEGs, else cpu."""
    if asked.decode != "auto":
        return asked.decode
    if tuned is not None and "decode" in tuned:
        reasons["decode"] = tuned_reason(tuned)
        return tuned["decode"]
    if not machine.cuda:
        reasons["decode"] = "auto: no CUDA device"
        return "cpu"
    reasons["decode"] = f"auto: on CUDA, {'most' if data.mostly_jpegs else 'not most'} files are JPEGs"
    return auto_decoder(machine.cuda, data.mostly_jpegs)


def no_worker_fits(machine, one_batch_bytes):
    """The one wording of a /dev/shm that cannot hold even one worker process's batches."""
    needed = shared_memory_needed(1, 1, one_batch_bytes, machine.processes)
    return SharedMemoryError(
        f"/dev/shm has {machine.shm_free / MB:.0f} MB free: not enough for one loader worker's batches "
        f"({needed / MB:.0f} MB of {one_batch_bytes / MB:.1f} MB each); use --loader threads (or auto), or start "
        "the container with --shm-size=8g (or --ipc=host)"
    )


def too_little(machine, workers, prefetch_factor, one_batch_bytes):
    """Why worker processes' batches do not fit: the reason a plan gives for threads, or for lowering them."""
    return (
        f"/dev/shm has {machine.shm_free / MB:.0f} MB free, too little for {workers} workers x {prefetch_factor} "
        f"batches of {one_batch_bytes / MB:.1f} MB"
    )


def planned_prefetch(asked, tuned, loader):
    """--prefetch-factor as given, else the saved setting's where it timed this loader, else the default."""
    if asked.prefetch_factor is not None:
        return asked.prefetch_factor
    if tuned is not None and tuned.get("loader", "processes") == loader:
        return tuned["prefetch_factor"]
    return DEFAULT_THREAD_BATCHES_AHEAD if loader == "threads" else DEFAULT_PREFETCH_FACTOR


def gil_capped(workers, machine):
    """Why decode threads would fall behind worker processes here (the GIL: gil.py's model), or None: where the
    CPUs the loader decodes on (its workers, at most this process's share of the CPUs) are more than one
    process's threads keep busy."""
    decoding_cpus = min(workers, machine.cpus / machine.processes)
    if decoding_cpus <= gil.thread_cpu_ceiling():
        return None
    threads, processes = gil.predicted_rates(decoding_cpus)
    return (
        f"auto: on {decoding_cpus:g} CPUs of decoding, threads would cap at {threads:,.0f} images/s (the GIL, from "
        f"{gil.thread_cpu_ceiling():.0f} CPUs on) and processes reach {processes:,.0f}"
    )


def planned_loader(asked, tuned, machine, workers, one_batch_bytes, reasons):
    """--loader as given; auto: threads for --workers 0 and where /dev/shm cannot hold the worker processes'
    batches, else the saved setting's, else processes where the GIL caps threads below them, else
    DEFAULT_LOADER."""
    if asked.loader != "auto":
        return asked.loader
    if workers == 0:
        reasons["loader"] = "--workers 0: decoded in the training loop"
        return "threads"
    prefetch = planned_prefetch(asked, tuned, "processes")
    shm = machine.shm_free
    if shm is not None and not fit_shared_memory(workers, prefetch, one_batch_bytes, shm, machine.processes).fits:
        reasons["loader"] = f"{too_little(machine, workers, prefetch, one_batch_bytes)}: threads need no /dev/shm"
        return "threads"
    if tuned is not None and tuned.get("loader", "processes") in LOADERS:
        reasons["loader"] = tuned_reason(tuned)  # a saved setting that names no loader timed worker processes
        return tuned.get("loader", "processes")
    capped = gil_capped(workers, machine) if shm is not None else None
    if capped is not None:
        reasons["loader"] = capped
        return "processes"
    reasons["loader"] = "auto: faster in make bench on this kind of machine"
    return DEFAULT_LOADER


def fitted_processes(machine, workers, prefetch_factor, one_batch_bytes, reasons):
    """(workers, prefetch_factor) of worker processes, lowered where /dev/shm cannot hold their batches (the
    reason goes into `reasons`); SharedMemoryError where not even one worker's batches fit."""
    if workers == 0 or machine.shm_free is None:
        return workers, prefetch_factor
    fitted = fit_shared_memory(workers, prefetch_factor, one_batch_bytes, machine.shm_free, machine.processes)
    if not fitted.possible:
        raise no_worker_fits(machine, one_batch_bytes)
    if not fitted.fits:
        too_small = too_little(machine, workers, prefetch_factor, one_batch_bytes)
        reasons["workers"] = f"lowered from {workers} x {prefetch_factor}: {too_small}; --loader threads needs none"
    return fitted.workers, fitted.prefetch_factor


def check_memory(machine, loader, workers, prefetch_factor, one_batch_bytes, batch_size):
    """PlanError where the batches the loaders of this machine's training processes hold at once need more
    memory than is free: a run that would fail later, or swap, is refused now with what would fit."""
    free, held = machine.memory_free, batches_held(loader, workers, prefetch_factor)
    needed = machine.processes * held * one_batch_bytes
    if free is None or needed <= free:
        return
    batches_fit = free // machine.processes // one_batch_bytes
    most = batches_fit - 1 if loader == "threads" else (batches_fit - BATCHES_HELD_BY_MAIN) // max(1, workers)
    expected = f"--prefetch-factor at most {most}" if most >= 1 else "a smaller --batch-size"
    over = f" for {machine.processes} training processes" if machine.processes > 1 else ""
    raise PlanError(
        f"--prefetch-factor {prefetch_factor} (--batch-size {batch_size}): the loader would hold {held:,} batches "
        f"of {one_batch_bytes / MB:.3g} MB at once, {needed / MB:,.0f} MB{over}, more than the {free / MB:,.0f} MB "
        f"of memory free here; expected {expected}"
    )


def planned_draft(asked, tuned):
    """--jpeg-draft as given, else the saved setting's, else on."""
    if asked.jpeg_draft is not None:
        return asked.jpeg_draft
    return tuned["jpeg_draft"] if tuned is not None else True


def plan(asked, tuned, machine, data):
    """The LoaderPlan for `asked` (Asked) with `tuned` (the setting autotune saved for these flags, used with
    --workers auto; None: none), on `machine` (machine.Machine) for `data` (Data). Raises PlanError for --workers
    beyond the machine and for batches held at once beyond its free memory, SharedMemoryError where --loader
    processes cannot fit one worker's batches."""
    reasons = {}
    tuned = tuned if asked.workers == "auto" else None
    workers = planned_workers(asked.workers, tuned, machine, reasons)
    decode = planned_decode(asked, tuned, machine, data, reasons)
    one_batch_bytes = data.batch_bytes[decode]
    loader = planned_loader(asked, tuned, machine, workers, one_batch_bytes, reasons)
    check_workers(asked.workers, loader, machine)
    prefetch_factor = planned_prefetch(asked, tuned, loader)
    shm_needed = 0
    if loader == "processes":
        shm_needed = shared_memory_needed(workers, prefetch_factor, one_batch_bytes, machine.processes)
        workers, prefetch_factor = fitted_processes(machine, workers, prefetch_factor, one_batch_bytes, reasons)
    check_memory(machine, loader, workers, prefetch_factor, one_batch_bytes, asked.batch_size)
    return LoaderPlan(
        loader=loader,
        workers=workers,
        prefetch_factor=prefetch_factor,
        decode=decode,
        jpeg_draft=planned_draft(asked, tuned),
        pin_memory=machine.cuda if asked.pin_memory is None else asked.pin_memory,
        batch_size=asked.batch_size,
        seed=asked.seed,
        persistent_workers=asked.persistent_workers,
        autotuned=tuned is not None,
        batch_bytes=one_batch_bytes,
        shm_needed=shm_needed,
        reasons=reasons,
    )
