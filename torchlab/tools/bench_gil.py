"""What limits decode threads on a machine with many CPUs: the GIL-held seconds of each sample (`torchlab bench`).

Two measurements, and the prediction pipeline/gil.py makes of them:

- the loader's own ceiling: samples/s through create_loader's thread loader on a Dataset whose sample is a
  1 ms sleep (outside the GIL) and a small uint8 array, at 2 to 64 threads (ideal: 1000/s per thread). The
  samples cost nothing but the sleep, so the best rate is bounded by the loader's serial part, the GIL:
  1 / that rate is the loader's GIL-held seconds per sample (an upper bound on a machine with few CPUs).
- the GIL-held seconds per sample of a sample function (the default decode path: decode.ImageDataset's
  write_sample, as the thread loader calls it): its CPU seconds less those of the parts that let the GIL go.
  A profiler splits the sample's CPU time into units (each Python function's own time, each C function called
  from Python). An observer thread, woken every 50 us, then waiting for the GIL, with CPython's forced
  switching turned off, can only get the GIL where the sample's thread lets it go: a unit during which it got
  it lets the GIL go (libjpeg's decode, torch's resize, numpy's copy, a file's read, a sleep). It needs no CPU
  of its own, so a busy machine delays it but does not make it wrong. The rest of the CPU time holds the GIL.
  A sample that holds the GIL throughout (a Python loop) gives a share near 1, one that sleeps or hashes
  (hashlib lets the GIL go) near 0 (tests/unit/test_gil.py). What it leaves out: the hand-over of the GIL,
  which the loader's ceiling above includes, and C that lets the GIL go inside a Python function's own time
  (numpy's dispatched functions, tensor indexing), counted as letting it go: an underestimate of a few us.
"""

import collections
import sys
import threading
import time

import numpy as np
import torch

from torchlab import machine
from torchlab.pipeline import gil, plan, public

LOADER_THREADS = (2, 8, 32, 64)
SLEEP_SECONDS = 0.001  # the loader ceiling's sample: a sleep outside the GIL
LOADER_SAMPLES_PER_THREAD = 250
LOADER_PASSES = 3
OBSERVER_SLEEP = 50e-6
UNFORCED_SWITCH_INTERVAL = 1000.0  # seconds: no thread is made to let the GIL go while releasing_units runs
PREDICTED_CPUS = (8, 16, 32, 64)


class SleepingSamples(torch.utils.data.Dataset):
    """`length` samples of 16 bytes, each taking SLEEP_SECONDS outside the GIL."""

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, position):
        time.sleep(SLEEP_SECONDS)
        return np.full(16, position % 256, dtype=np.uint8)


def loader_rate(threads, batch_size=64):
    """Samples/s through create_loader's thread loader with `threads` threads on SleepingSamples (best pass)."""
    samples = SleepingSamples(LOADER_SAMPLES_PER_THREAD * threads)
    loader = public.create_loader(
        samples, batch_size, shuffle=False, loader="threads", workers=threads, print_plan=None
    )
    rates = []
    for _ in range(LOADER_PASSES):
        start = time.perf_counter()
        for _ in loader:
            pass
        rates.append(len(samples) / (time.perf_counter() - start))
    return max(rates)


def seconds_alone(sample, keys, passes=3):
    """(wall, CPU) seconds per sample(key) over `keys`, in this thread with nothing beside it: the least of
    `passes` passes (a pass in which the machine's other work took the CPU gives more)."""
    times = []
    for _ in range(passes):
        wall, cpu = time.perf_counter(), time.thread_time()
        for key in keys:
            sample(key)
        times.append(((time.perf_counter() - wall) / len(keys), (time.thread_time() - cpu) / len(keys)))
    return min(times)


def unit_of(frame, event, arg):
    """What runs after a profiler event: a C function (by name: a bound method is a new object at each call),
    or the Python function of `frame`, or its caller after a return."""
    if event == "c_call":
        return getattr(arg, "__qualname__", None) or repr(arg)
    if event == "return":
        return None if frame.f_back is None else frame.f_back.f_code
    return frame.f_code


class Profile:
    """CPU seconds of each unit (unit_of) of what runs while it is set (sys.setprofile), its own time left out,
    and whether the unit let the GIL go, by the observer's turns where one runs (see releasing_units)."""

    def __init__(self, turns=(0,)):
        self.units, self.turns, self.at = collections.defaultdict(lambda: [0.0, False]), turns, [None, 0.0, 0]

    def __call__(self, frame, event, arg):
        now = time.thread_time()
        if self.at[0] is not None:
            self.units[self.at[0]][0] += now - self.at[1]
            self.units[self.at[0]][1] |= self.turns[0] != self.at[2]
        self.at[:] = unit_of(frame, event, arg), time.thread_time(), self.turns[0]

    def run(self, call):
        sys.setprofile(self)
        try:
            call()
        finally:
            sys.setprofile(None)
            self.at[0] = None


def releasing_units(sample, keys):
    """The units of sample(key) over `keys` that let the GIL go. The observer, a thread that wakes every
    OBSERVER_SLEEP and then waits for the GIL, counts a turn each time it gets it; with switching forced off it
    gets it only where this thread lets it go, so a unit during which its count moved let the GIL go."""
    stop, turns = threading.Event(), [0]

    def observe():
        while not stop.is_set():
            turns[0] += 1
            time.sleep(OBSERVER_SLEEP)

    interval, observer, profile = sys.getswitchinterval(), threading.Thread(target=observe), Profile(turns)
    sys.setswitchinterval(UNFORCED_SWITCH_INTERVAL)
    observer.start()
    try:
        profile.run(lambda: [sample(key) for key in keys])
    finally:
        stop.set()
        observer.join()
        sys.setswitchinterval(interval)
    return {unit for unit, (_, released) in profile.units.items() if released}


def gil_share(sample, keys):
    """{seconds_per_sample (wall, alone), gil_seconds_per_sample, share: their ratio} of sample(key) over `keys`.
    The GIL-held seconds are the sample's CPU seconds less those of its releasing_units, each key run once plain
    and once profiled, one after the other (the machine's speed drifts between passes; a profiler slows Python,
    not the C that lets the GIL go). So a sample that sleeps holds the GIL for the little CPU it uses, one that
    runs Python for all of it. A Python function whose own time calls C that lets the GIL go (numpy's
    dispatched functions, tensor indexing: no profiler event) counts as letting it go: a few microseconds less."""
    seconds_per_sample, _ = seconds_alone(sample, keys)
    releasing, profile, plain = releasing_units(sample, keys), Profile(), 0.0
    for key in keys:
        start = time.thread_time()
        sample(key)
        plain += time.thread_time() - start
        profile.run(lambda key=key: sample(key))
    free = sum(cpu for unit, (cpu, _) in profile.units.items() if unit in releasing)
    held = max(0.0, plain - free) / len(keys)
    return {
        "seconds_per_sample": seconds_per_sample,
        "gil_seconds_per_sample": held,
        "share": held / seconds_per_sample,
    }


def decode_sample(dataset):
    """sample(key) for `dataset` (a decode.ImageDataset): write_sample into a batch row, as the thread loader does."""
    slots = [np.empty((1, dataset.image_size, dataset.image_size, 3), np.uint8), np.empty(1, np.int64)]
    return lambda key: dataset.write_sample(key, slots, 0)


def measure(dataset, samples=256):
    """The report's "gil" part: the loader's ceiling, the decode path's GIL share on `samples` of `dataset`
    (epoch 0) and the prediction at PREDICTED_CPUS of threads beside processes."""
    most = plan.MAX_WORKERS_PER_CPU["threads"] * machine.usable_cpu_count()  # what create_loader's plan allows
    rates = {threads: loader_rate(threads) for threads in LOADER_THREADS if threads <= most}
    loader_gil_seconds = 1 / max(rates.values())
    keys = [(position, 0) for position in range(min(samples, len(dataset)))]
    decode_sample(dataset)(keys[0])  # the first call imports and allocates: not the per-sample cost
    decode = gil_share(decode_sample(dataset), keys)
    prediction = {
        cpus: gil.predicted_rates(
            cpus, decode["seconds_per_sample"], decode["gil_seconds_per_sample"], loader_gil_seconds
        )
        for cpus in PREDICTED_CPUS
    }
    ceiling = gil.thread_cpu_ceiling(decode["seconds_per_sample"], decode["share"], loader_gil_seconds)
    return {
        "loader_samples_per_sec": rates,
        "loader_gil_seconds": loader_gil_seconds,
        "decode": {**decode, "samples": len(keys)},
        "thread_cpu_ceiling": ceiling,
        "predicted_images_per_sec": {cpus: {"threads": t, "processes": p} for cpus, (t, p) in prediction.items()},
    }


def report_lines(result):
    """The bench report's lines of measure()'s result."""
    decode = result["decode"]
    rates = ", ".join(f"{threads} {rate:,.0f}" for threads, rate in result["loader_samples_per_sec"].items())
    return [
        f"thread loader's own ceiling, samples/s of a 1 ms sleep by threads (ideal 1,000 each): {rates}; "
        f"GIL-held {result['loader_gil_seconds'] * 1e6:.0f} us/sample",
        f"decode path: {decode['seconds_per_sample'] * 1000:.2f} ms/sample alone, GIL-held "
        f"{decode['gil_seconds_per_sample'] * 1e6:.0f} us ({decode['share']:.1%}); threads keep "
        f"{result['thread_cpu_ceiling']:.1f} CPUs busy before the GIL limits them",
        "predicted images/s by CPUs (threads / processes): "
        + ", ".join(
            f"{cpus} {row['threads']:,.0f} / {row['processes']:,.0f}"
            for cpus, row in result["predicted_images_per_sec"].items()
        ),
    ]
