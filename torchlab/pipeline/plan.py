"""The loader plan: one function turns the flags, autotune's saved setting, the CPUs and /dev/shm into what the
loader does (backend, workers or threads, batches in flight, decoder, JPEG draft), with the reason for each.

plan_loader is that function (pure: its inputs are given); resolve_plan gathers them on this machine (the
settings file, usable CPUs, /dev/shm, one batch's bytes) and calls it. A run records the plan as used: its
start line, metrics.jsonl's first record and config.json.

--loader auto: threads wherever /dev/shm is too small for the worker processes' batches; else what torchlab
autotune saved; else config.DEFAULT_BACKEND, the one `make bench` measured faster on a 2-CPU machine of this
kind (decode threads share one process's memory and pass nothing through /dev/shm: docs/performance.md gives
the figures).
"""

import dataclasses

from torchlab import config
from torchlab.pipeline import loader, settings


@dataclasses.dataclass(frozen=True)
class AskedLoader:
    """The loader flags as given: loader (auto, threads, processes), workers (auto or N), prefetch_factor and
    jpeg_draft (None: not given), decode (auto, cpu, gpu), pin_memory (None: with CUDA)."""

    loader: str = "auto"
    workers: object = "auto"
    prefetch_factor: int = None
    jpeg_draft: bool = None
    decode: str = "auto"
    pin_memory: bool = None


@dataclasses.dataclass(frozen=True)
class LoaderPlan:
    """What the loader does, and why where it is not simply what was asked (reasons: field -> why)."""

    backend: str
    workers: int  # decode threads, or worker processes; 0: decoded in the training loop
    prefetch_factor: int  # threads: batches decoded ahead; processes: batches each worker loads ahead
    decode: str
    jpeg_draft: bool
    pin_memory: bool
    autotuned: bool = False
    reasons: dict = dataclasses.field(default_factory=dict)

    @property
    def batches_in_flight(self):
        """Batches decoded ahead of the one in use: all the threads' together, or workers x prefetch_factor."""
        if self.workers == 0:
            return 0
        return self.prefetch_factor if self.backend == "threads" else self.workers * self.prefetch_factor

    def describe(self):
        """The plan in one line, e.g. "threads: 2 decode threads, 2 batches ahead, --decode cpu, JPEG draft on"
        with each reason in brackets."""

        def why(field):
            return f" ({self.reasons[field]})" if field in self.reasons else ""

        if self.workers == 0:
            parallel = "decoded in the training loop"
        elif self.backend == "threads":
            parallel = f"{self.workers} decode threads, {self.prefetch_factor} batches ahead"
        else:
            parallel = f"{self.workers} worker processes x {self.prefetch_factor} batches ahead"
        parts = [
            f"{self.backend}{why('backend')}",
            f"{parallel}{why('workers')}",
            f"--decode {self.decode}{why('decode')}",
            f"JPEG draft {'on' if self.jpeg_draft else 'off'}",
        ]
        return "; ".join(parts)

    def record(self):
        """The plan as config.json and metrics.jsonl keep it."""
        return {**dataclasses.asdict(self), "batches_in_flight": self.batches_in_flight}

    def settings(self, batch_size, seed, processes_on_machine=1, persistent_workers=True):
        """The LoaderSettings that build_loader takes for this plan."""
        return loader.LoaderSettings(
            batch_size=batch_size,
            workers=self.workers,
            prefetch_factor=self.prefetch_factor,
            backend=self.backend,
            persistent_workers=persistent_workers,
            pin_memory=self.pin_memory,
            seed=seed,
            processes_on_machine=processes_on_machine,
        )


def tuned_reason(tuned):
    """How the plan names a saved setting: "autotuned (saved DATE, for these flags)"."""
    saved = tuned.get("tuned_at", "")[:10] or "at an unknown date"
    return f"autotuned (saved {saved}, for these flags)"


def planned_workers(asked_workers, tuned, cpus, processes_on_machine, reasons):
    """--workers as given, else the saved setting's (`tuned`, which only --workers auto uses; None: none), else
    one per usable CPU of this process's share, at most MAX_AUTO_WORKERS; the reason goes into `reasons` where
    it was not given."""
    if asked_workers != "auto":
        return asked_workers
    if tuned is not None:
        reasons["workers"] = tuned_reason(tuned)
        return tuned["workers"]
    reasons["workers"] = f"auto: {cpus} usable CPUs / {processes_on_machine} processes"
    return min(loader.MAX_AUTO_WORKERS, max(1, cpus // processes_on_machine))


def no_worker_fits(shm_free, one_batch_bytes, processes_on_machine):
    """The SharedMemoryError of a /dev/shm that cannot hold even one worker process's batches."""
    needed = loader.shared_memory_needed(1, 1, one_batch_bytes, processes_on_machine)
    return loader.SharedMemoryError(
        f"/dev/shm has {shm_free / loader.MB:.0f} MB free: not enough for one loader worker's batches "
        f"({needed / loader.MB:.0f} MB of {one_batch_bytes / loader.MB:.1f} MB each); use --loader threads "
        "(or auto), or start the container with --shm-size=8g (or --ipc=host)"
    )


def plan_loader(asked, tuned, cpus, shm_free, one_batch_bytes, processes_on_machine=1, on_cuda=False, decode=None):
    """The LoaderPlan for `asked` (AskedLoader), from `tuned` (the setting autotune saved for these flags, used
    with --workers auto; None if none), the usable CPUs, /dev/shm's free bytes (None: no /dev/shm), one batch's
    bytes, the training processes on this machine, CUDA, and `decode` (--decode as resolved; None: asked's).
    Raises loader.SharedMemoryError where --loader processes cannot fit one worker's batches."""
    reasons = {}
    use_tuned = tuned is not None and asked.workers == "auto"
    workers = planned_workers(asked.workers, tuned, cpus, processes_on_machine, reasons)

    def processes_fit(prefetch):
        """loader.fit_shared_memory for worker processes, and the words for not fitting."""
        fit = loader.fit_shared_memory(workers, prefetch, one_batch_bytes, shm_free, processes_on_machine)
        too_small = (
            f"/dev/shm has {shm_free / loader.MB:.0f} MB free, too little for {workers} workers x "
            f"{prefetch} batches of {one_batch_bytes / loader.MB:.1f} MB"
        )
        return fit, too_small

    def asked_prefetch(backend):
        if asked.prefetch_factor is not None:
            return asked.prefetch_factor
        if use_tuned and tuned.get("loader", "processes") == backend:
            return tuned["prefetch_factor"]
        return config.DEFAULT_THREAD_BATCHES_AHEAD if backend == "threads" else config.DEFAULT_PREFETCH_FACTOR

    checks_shm = workers > 0 and shm_free is not None
    if asked.loader != "auto":
        backend = asked.loader
    elif workers == 0:
        backend, reasons["backend"] = "threads", "--workers 0: decoded in the training loop"
    elif checks_shm and not processes_fit(asked_prefetch("processes"))[0].fits:
        backend = "threads"
        reasons["backend"] = f"{processes_fit(asked_prefetch('processes'))[1]}: threads need no /dev/shm"
    elif use_tuned and tuned.get("loader", "processes") in config.BACKENDS:
        # A saved setting that names no loader timed worker processes.
        backend, reasons["backend"] = tuned.get("loader", "processes"), tuned_reason(tuned)
    else:
        backend, reasons["backend"] = config.DEFAULT_BACKEND, "auto: faster in make bench on this kind of machine"
    prefetch_factor = asked_prefetch(backend)

    if backend == "processes" and checks_shm:
        fit, too_small = processes_fit(prefetch_factor)
        if not fit.possible:
            raise no_worker_fits(shm_free, one_batch_bytes, processes_on_machine)
        if not fit.fits:
            reasons["workers"] = f"lowered from {workers} x {prefetch_factor}: {too_small}; --loader threads needs none"
            workers, prefetch_factor = fit.workers, fit.prefetch_factor

    jpeg_draft = asked.jpeg_draft
    if jpeg_draft is None:
        jpeg_draft = tuned["jpeg_draft"] if use_tuned else True
    decode = asked.decode if decode is None else decode
    if asked.decode == "auto":
        reasons["decode"] = tuned_reason(tuned) if use_tuned and "decode" in tuned else "auto"
    pin_memory = on_cuda if asked.pin_memory is None else asked.pin_memory
    return LoaderPlan(backend, workers, prefetch_factor, decode, jpeg_draft, pin_memory, use_tuned, reasons)


def tuned_setting(settings_file, data, image_size, batch_size, device, processes_on_machine):
    """The setting autotune saved for these flags, or None (settings_file None: none read)."""
    key = settings.setting_key(data, image_size, batch_size, device, processes_on_machine)
    return settings.saved_setting(settings_file, key)


def resolve_plan(asked, tuned, one_batch_bytes, processes_on_machine=1, on_cuda=False, decode=None):
    """plan_loader with this machine's usable CPUs and /dev/shm."""
    shm = loader.shared_memory_bytes()
    return plan_loader(
        asked,
        tuned,
        loader.usable_cpu_count(),
        None if shm is None else shm[1],
        one_batch_bytes,
        processes_on_machine,
        on_cuda,
        decode,
    )
