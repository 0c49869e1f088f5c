"""How far decode threads in one process scale before the GIL, not the CPUs, limits them: a model, no measuring.

Every sample the thread loader reads holds the GIL for part of its time (the pass's bookkeeping, the Python of
the decode path and the calls into Pillow, torch and numpy); the rest (libjpeg, the resize, the copy) runs
without it. The GIL is one lock: however many CPUs decode, the samples' GIL-held seconds are spent one after
the other. torchlab.tools.bench_gil measures the figures below; `torchlab bench` reports them again on the
machine it runs on.
"""

# Measured by `make bench` (torchlab bench --images 2000, tools/bench_gil.py) on 2026-12-06, commit c5bf2c5, on the
# CI machine (2 CPUs, shared with other sessions' builds: load average about 2, noisy); docs/performance.md.
# The default decode path: decode.ImageDataset, train=True, JPEG draft, 224 px, on the bench's images.
DECODE_SECONDS_PER_SAMPLE = 1.18e-3  # one thread alone, per sample
DECODE_GIL_SHARE = 0.033  # the share of those seconds that holds the GIL (39 us)
# The thread loader's own GIL-held seconds per sample: 1 / its best samples/s (28,212 at 32 threads) on a Dataset
# whose sample is a 1 ms sleep and a 16-byte array; an upper bound, as 2 CPUs also did the loader's work.
LOADER_GIL_SECONDS = 35e-6


def thread_cpu_ceiling(
    seconds_per_sample=DECODE_SECONDS_PER_SAMPLE, gil_share=DECODE_GIL_SHARE, loader_gil_seconds=LOADER_GIL_SECONDS
):
    """CPUs' worth of decoding that one process's threads keep busy before the GIL is the limit: beyond it,
    predicted_rates' threads fall behind its processes. A sample's GIL-held seconds are gil_share of its
    seconds_per_sample plus the loader's own; the GIL is busy all the time once this many CPUs decode."""
    return seconds_per_sample / (gil_share * seconds_per_sample + loader_gil_seconds)


def predicted_rates(
    cpus,
    seconds_per_sample=DECODE_SECONDS_PER_SAMPLE,
    gil_seconds_per_sample=DECODE_GIL_SHARE * DECODE_SECONDS_PER_SAMPLE,
    loader_gil_seconds=LOADER_GIL_SECONDS,
):
    """(threads, processes): predicted samples/s with `cpus` CPUs decoding, one thread or one worker per CPU.

    The model: a sample costs seconds_per_sample of one CPU (one thread alone), gil_seconds_per_sample of it
    holding the GIL, and in threads the loader's bookkeeping holds the GIL loader_gil_seconds more. Processes
    have a GIL each and scale with the CPUs: cpus / seconds_per_sample. Threads scale the same way until the one
    GIL, whose held seconds are spent one after the other, is busy all the time; then they stay at
    1 / (gil_seconds_per_sample + loader_gil_seconds), however many CPUs there are. Both are upper bounds: the
    GIL's hand-overs as it nears saturation, and the processes' pickling and copy through /dev/shm (about 0.1 ms
    per sample in `make bench`'s per-stage timing, against the threads' loader_gil_seconds) are left out.
    """
    processes = cpus / seconds_per_sample
    return min(processes, 1 / (gil_seconds_per_sample + loader_gil_seconds)), processes
