"""What limits decode threads on a machine with many CPUs: the GIL-held seconds of each sample (`torchlab bench`).

Two measurements, and the prediction pipeline/gil.py makes of them:

- the loader's own ceiling: samples/s through create_loader's thread backend on a Dataset whose sample is a
  1 ms sleep (outside the GIL) and a small uint8 array, at 2 to 64 threads (ideal: 1000/s per thread). The
  samples cost nothing but the sleep, so the best rate is bounded by the loader's serial part, the GIL:
  1 / that rate is the loader's GIL-held seconds per sample (an upper bound on a machine with few CPUs).
- the GIL-held seconds per sample of a sample function (the default decode path: decode.ImageDataset's
  write_sample, as the thread loader calls it), by a meter thread: a pure Python loop, which holds the GIL
  whenever it runs and so runs whenever no other thread holds it. One thread takes samples beside it; over the
  window, the meter's wall less its CPU seconds is the time it could not run, per sample done: the sample's
  GIL-held time plus two hand-overs of the GIL (to the sample thread and back) at each stretch the sample
  holds it. The meter counts those stretches (the stalls of its loop), and a sample that releases the GIL once
  and holds nothing (time.sleep(0)) gives the cost of a hand-over on this machine; one hand-over per stretch
  is kept, as threads that all want the GIL pay one each time it changes hands. So the result is the serial
  seconds per sample of a saturated thread loader. A sample that holds the GIL throughout (a Python loop)
  gives a share near 1, one that sleeps near 0 (tests/unit/test_gil.py). The meter needs a CPU of its own
  beside the sample thread: on a busy machine it runs less, and the GIL-held time comes out too high.
"""

import itertools
import sys
import threading
import time

import numpy as np
import torch

from torchlab.pipeline import gil, public

LOADER_THREADS = (2, 8, 32, 64)
SLEEP_SECONDS = 0.001  # the loader ceiling's sample: a sleep outside the GIL
LOADER_SAMPLES_PER_THREAD = 250
LOADER_PASSES = 3
METER_SECONDS = 3.0
METER_WINDOWS = 3
# The meter forces a sample thread that wants the GIL back to wait this long at most (CPython's default, 5 ms,
# would leave a few dozen samples in the window); it does not change what is held, only how often it is handed.
METER_SWITCH_INTERVAL = 0.0005
# The meter found the GIL taken where its loop (a fraction of a microsecond a turn) stalls longer than this.
METER_GAP_SECONDS = 4e-6
CALIBRATION_SECONDS = 0.3
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
    """Samples/s through create_loader's thread backend with `threads` threads on SleepingSamples (best pass)."""
    samples = SleepingSamples(LOADER_SAMPLES_PER_THREAD * threads)
    loader = public.create_loader(
        samples, batch_size, shuffle=False, backend="threads", workers=threads, print_plan=None
    )
    rates = []
    for _ in range(LOADER_PASSES):
        start = time.perf_counter()
        for _ in loader:
            pass
        rates.append(len(samples) / (time.perf_counter() - start))
    return max(rates)


def seconds_alone(sample, keys):
    """Mean wall seconds of sample(key) over `keys`, in this thread with nothing beside it."""
    start = time.perf_counter()
    for key in keys:
        sample(key)
    return (time.perf_counter() - start) / len(keys)


def meter_run(sample, keys, seconds):
    """(meter-lost seconds, GIL episodes) per call of sample(key), `keys` taken in turn in one thread beside the
    meter (above): its wall seconds less its CPU seconds, and the times it found the GIL taken, per sample done."""
    stop, finished, meter = threading.Event(), [], {}

    def take_samples():
        for key in itertools.cycle(keys):
            if stop.is_set():
                return
            sample(key)
            finished.append(time.perf_counter())

    def run_meter():
        clock = time.perf_counter
        start, cpu, episodes = clock(), time.thread_time(), 0
        last = start
        while last - start < seconds:
            now = clock()
            episodes += now - last > METER_GAP_SECONDS
            last = now
        meter.update(start=start, wall=last - start, ran=time.thread_time() - cpu, episodes=episodes)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(METER_SWITCH_INTERVAL)
    try:
        workers = [threading.Thread(target=run_meter), threading.Thread(target=take_samples)]
        for worker in workers:
            worker.start()
        workers[0].join()
        stop.set()
        workers[1].join()
    finally:
        sys.setswitchinterval(interval)
    done = max(1, sum(meter["start"] <= moment <= meter["start"] + meter["wall"] for moment in finished))
    return (meter["wall"] - meter["ran"]) / done, meter["episodes"] / done


def hand_over():
    """time.sleep(0)'s meter-lost seconds per episode: a release and a take of the GIL that hold nothing."""
    lost, episodes = meter_run(lambda key: time.sleep(0), [None], CALIBRATION_SECONDS)
    return lost / max(episodes, 1.0)


def gil_held_seconds(sample, keys, seconds=METER_SECONDS):
    """The serial seconds per call of sample(key): what the meter lost less half a hand-over per episode (the
    meter hands the GIL over twice per episode, where threads that all want it pay once). The least of
    METER_WINDOWS windows of `seconds` each: a window in which the meter also waited for a CPU gives more."""
    windows = (meter_run(sample, keys, seconds / METER_WINDOWS) for _ in range(METER_WINDOWS))
    return max(0.0, min(lost - episodes * hand_over() / 2 for lost, episodes in windows))


def gil_share(sample, keys, seconds=METER_SECONDS):
    """{seconds_per_sample (alone), gil_seconds_per_sample, share: their ratio} of sample(key) over `keys`."""
    seconds_per_sample = seconds_alone(sample, keys)
    held = gil_held_seconds(sample, keys, seconds)
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
    rates = {threads: loader_rate(threads) for threads in LOADER_THREADS}
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
        "decode": decode,
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
            f"{cpus} {rates['threads']:,.0f} / {rates['processes']:,.0f}"
            for cpus, rates in result["predicted_images_per_sec"].items()
        ),
    ]
