"""The input pipeline: decode threads or worker processes, uint8 batches, the /dev/shm budget, normalising on the
device.

build_loader(dataset, settings, device, train) is the one place a loader is made (a threads.ThreadLoader, or a
DataLoader of worker processes, as settings.backend says, from a LoaderSettings). fit_shared_memory is the one
answer to "do the batches fit in /dev/shm, and if not, what does". timed_pass is the one loop that reads a pass
as training does and times it.

Batches stay uint8 (N, H, W, 3) from decoding to the device: a quarter of float32's bytes through the
worker queues, pinned memory and the bus. BatchToDevice turns them into normalised float NCHW tensors in
channels_last memory (the same bytes, seen through permuted strides) on the device.
"""

import dataclasses
import math
import os
import sys
import time

import numpy as np
import torch

from torchlab import config
from torchlab.pipeline import sampler, threads

CGROUP_ROOT = "/sys/fs/cgroup"
MAX_AUTO_WORKERS = 8
MAX_WORKERS_PER_CPU = 4  # --workers N above this per usable CPU is refused
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SHM_PATH = "/dev/shm"
IMAGE_CHANNELS = 3
# Besides the workers x prefetch_factor batches in flight, the main process holds the batch it is using and
# the one it has just received, both still in /dev/shm.
BATCHES_HELD_BY_MAIN = 2
MB = 1e6


class SharedMemoryError(RuntimeError):
    """/dev/shm cannot hold even one worker's batch: the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
    """What build_loader needs to know besides the dataset: train.py's loader flags, resolved (workers a number):
    plan.LoaderPlan.settings makes them. backend "threads": `workers` decode threads (0: decoded in the loop)
    and `prefetch_factor` batches decoded ahead; "processes": a DataLoader of `workers` worker processes, each
    `prefetch_factor` batches ahead."""

    batch_size: int = 64
    workers: int = 0
    prefetch_factor: int = config.DEFAULT_PREFETCH_FACTOR
    backend: str = "processes"
    persistent_workers: bool = True
    pin_memory: bool = None  # None: when the device is CUDA
    seed: int = 0
    processes_on_machine: int = 1  # training processes sharing this machine's /dev/shm


@dataclasses.dataclass(frozen=True)
class SharedMemoryFit:
    """fit_shared_memory's answer: the /dev/shm bytes the asked settings need (all processes on the machine),
    whether they fit, and the (workers, prefetch_factor) the loader uses, or possible=False when not even one
    worker's batches fit."""

    needed: int
    fits: bool
    workers: int
    prefetch_factor: int
    possible: bool


def cgroup_cpu_limit(root=CGROUP_ROOT):
    """CPUs the cgroup CPU quota allows (e.g. 1.5 for docker run --cpus=1.5), or None without a quota."""
    try:  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
        with open(os.path.join(root, "cpu.max")) as cpu_max:
            quota, period = cpu_max.read().split()
        return None if quota == "max" else int(quota) / int(period)
    except FileNotFoundError:
        pass
    for controller in ("cpu", "cpu,cpuacct"):  # cgroup v1: a quota of -1 means none
        try:
            with open(os.path.join(root, controller, "cpu.cfs_quota_us")) as quota_file:
                quota = int(quota_file.read())
            with open(os.path.join(root, controller, "cpu.cfs_period_us")) as period_file:
                period = int(period_file.read())
        except FileNotFoundError:
            continue
        return None if quota <= 0 else quota / period
    return None


def usable_cpu_count(cgroup_root=CGROUP_ROOT):
    """CPUs this process may run on: its CPU affinity, capped by the cgroup quota (not os.cpu_count())."""
    cpus = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(cgroup_root)
    return cpus if limit is None else max(1, min(cpus, math.floor(limit)))


def max_worker_count():
    """The most loader processes --workers N may start: MAX_WORKERS_PER_CPU per usable CPU. Each worker is a
    copy of the training process (hundreds of MB), so more only add memory and start-up time."""
    return MAX_WORKERS_PER_CPU * usable_cpu_count()


def shared_memory_bytes(path=SHM_PATH):
    """(size, free) of /dev/shm in bytes, or None where there is none."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def batch_bytes(batch_size, image_size):
    """Bytes of one uint8 batch of batch_size x image_size x image_size x 3."""
    return batch_size * image_size * image_size * IMAGE_CHANNELS


def dataset_batch_bytes(dataset, batch_size):
    """Bytes of one of `dataset`'s batches in /dev/shm: uint8 pixels, or what a dataset whose batches are not
    decoded pixels (device_decode.EncodedImageDataset, which also brings its own collate) says."""
    if hasattr(dataset, "batch_bytes"):
        return dataset.batch_bytes(batch_size)
    return batch_bytes(batch_size, dataset.image_size)


def shared_memory_needed(workers, prefetch_factor, one_batch_bytes, processes_on_machine=1):
    """/dev/shm bytes that the loaders' batches take at most: those in flight and those each main process holds."""
    per_process = (workers * prefetch_factor + BATCHES_HELD_BY_MAIN) * one_batch_bytes if workers > 0 else 0
    return processes_on_machine * per_process


def fit_shared_memory(workers, prefetch_factor, one_batch_bytes, free_bytes, processes_on_machine=1):
    """The (workers, prefetch_factor) nearest those asked for whose batches fit in free_bytes of /dev/shm
    (None: no /dev/shm, nothing fits but no workers), shared by the processes on this machine: prefetch_factor
    is lowered first, then workers. Works in one step for any flag values."""
    needed = shared_memory_needed(workers, prefetch_factor, one_batch_bytes, processes_on_machine)
    if needed == 0 or (free_bytes is not None and needed <= free_bytes):
        return SharedMemoryFit(needed, True, workers, prefetch_factor, possible=True)
    # Batches that may be in flight in each process: what fits, less those its main process holds.
    in_flight = (free_bytes or 0) // processes_on_machine // one_batch_bytes - BATCHES_HELD_BY_MAIN
    if in_flight >= workers:
        return SharedMemoryFit(needed, False, workers, in_flight // workers, possible=True)
    if in_flight >= 1:
        return SharedMemoryFit(needed, False, in_flight, 1, possible=True)
    return SharedMemoryFit(needed, False, 0, prefetch_factor, possible=False)


def collate_uint8(samples):
    """Batch ImageDataset samples: (images uint8 (N, H, W, 3), labels int64 (N,), unreadable positions).

    The images are stacked straight into one preallocated tensor (threads.batch_tensor: in a worker, in shared
    memory already). Unreadable samples are left out.
    """
    readable = [sample for sample in samples if sample[0] is not None]
    image_shape = readable[0][0].shape if readable else (0, 0, 3)
    images = threads.batch_tensor((len(readable), *image_shape), torch.uint8)
    if readable:
        np.stack([pixels for pixels, _, _ in readable], out=images.numpy())
    labels = torch.tensor([label for _, label, _ in readable], dtype=torch.int64)
    unreadable = torch.tensor([position for pixels, _, position in samples if pixels is None], dtype=torch.int64)
    return images, labels, unreadable


def init_worker(worker_id):
    """Each worker decodes on one thread: parallelism comes from the workers, not from torch's thread pool.

    Each is also a process group of its own. A signal sent to the training process's group (`docker stop`
    through `tini -g`, Ctrl-C in a terminal) must reach the training process alone: it ends the step,
    checkpoints and shuts its workers down; a worker killed by it first would end the run in an error.
    A worker whose training process is gone exits by itself (torch's worker watchdog)."""
    torch.set_num_threads(1)
    os.setpgid(0, 0)


def fitted_workers(settings, one_batch_bytes, rank):
    """(workers, prefetch_factor) for the loader: as asked when /dev/shm holds their batches, else lowered,
    saying so on stderr (rank 0); SharedMemoryError when not one worker's batches fit."""
    shm = shared_memory_bytes()
    if settings.workers == 0 or shm is None:
        return settings.workers, settings.prefetch_factor
    free = shm[1]
    fit = fit_shared_memory(
        settings.workers, settings.prefetch_factor, one_batch_bytes, free, settings.processes_on_machine
    )
    if not fit.possible:
        needed = shared_memory_needed(1, 1, one_batch_bytes, settings.processes_on_machine)
        raise SharedMemoryError(
            f"/dev/shm has {free / MB:.0f} MB free: not enough for one loader worker's batches "
            f"({needed / MB:.0f} MB of {one_batch_bytes / MB:.1f} MB each); start the container with "
            "--shm-size=8g (or --ipc=host), or use --workers 0 or a smaller --batch-size"
        )
    if not fit.fits and rank == 0:
        print(
            f"loader: /dev/shm has {free / MB:.0f} MB free, too little for {settings.workers} workers x "
            f"{settings.prefetch_factor} prefetched batches of {one_batch_bytes / MB:.1f} MB: using {fit.workers} "
            f"workers x {fit.prefetch_factor}; start the container with --shm-size=8g to keep them",
            file=sys.stderr,
        )
    return fit.workers, fit.prefetch_factor


def build_loader(dataset, settings, device, train, rank=0, world_size=1):
    """The loader for `dataset` (an ImageDataset) as training or validation reads it, with `settings` (a
    LoaderSettings): a threads.ThreadLoader (backend "threads") or a DataLoader. loader.sampler is the
    EpochSampler: call loader.sampler.set_epoch(epoch, skip) before each pass (batches_per_epoch(loader) counts a
    whole epoch's batches). Before starting worker processes it fits them to /dev/shm (fitted_workers): a worker
    would otherwise die of a bus error mid-epoch; threads need none.
    """
    pin_memory = device.type == "cuda" if settings.pin_memory is None else settings.pin_memory
    epoch_sampler = sampler.EpochSampler(len(dataset), train, settings.seed, rank, world_size)
    if settings.backend == "threads":
        # In place where the dataset writes samples into their slots; else its own collate (--decode gpu's).
        collate = getattr(dataset, "collate", None)
        if collate is None and not hasattr(dataset, "write_sample"):
            collate = collate_uint8
        return threads.ThreadLoader(
            dataset,
            settings.batch_size,
            epoch_sampler,
            settings.workers,
            settings.prefetch_factor,
            pin_memory=pin_memory,
            drop_last=train,
            collate_fn=collate,
            device=device,
        )
    workers, prefetch_factor = fitted_workers(settings, dataset_batch_bytes(dataset, settings.batch_size), rank)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=epoch_sampler,
        num_workers=workers,
        collate_fn=getattr(dataset, "collate", collate_uint8),
        pin_memory=pin_memory,
        drop_last=train,
        worker_init_fn=init_worker,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        persistent_workers=settings.persistent_workers and workers > 0,
        # Its own generator: creating an iterator then leaves torch's global RNG (dropout, ...) alone,
        # so a resumed run draws the same random numbers as an uninterrupted one.
        generator=torch.Generator().manual_seed(settings.seed),
    )


def batches_per_epoch(data_loader):
    """Batches in a whole epoch of a loader build_loader made, however far into the epoch set_epoch's skip starts
    its next pass: len(data_loader) is what that pass yields, fewer after a resume."""
    batches, rest = divmod(data_loader.sampler.samples_per_epoch(), data_loader.batch_size)
    return batches + int(rest > 0 and not data_loader.drop_last)


class BatchToDevice:
    """Move a uint8 (N, H, W, 3) batch to the device and normalise it there: float NCHW, (x - mean) / std.

    On CUDA the result is channels_last (the NHWC bytes seen through permuted strides), as the model is. On
    the CPU, where this step competes with the loader for the cores, the batch is converted and transposed to
    contiguous NCHW float in one copy, then scaled and shifted in place (x * scale + shift), into one output
    buffer that is reused while batches keep their shape: a fresh 38 MB tensor per batch costs more in page
    faults than the arithmetic. So on the CPU a result is valid until the next call (as the training loop,
    evaluation and loader.timed_pass use it).
    """

    def __init__(self, device):
        self.device = device
        std = torch.tensor(IMAGENET_STD, dtype=torch.float64) * 255
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float64) * 255
        # x * scale + shift == (x - mean) / std, per channel
        self.scale = (1 / std).float().view(1, 3, 1, 1)
        self.shift = (-mean / std).float().view(1, 3, 1, 1)
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).mul(255).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, device=device).mul(255).view(1, 3, 1, 1)
        self.cpu_output = None

    def __call__(self, images, labels):
        labels = labels.to(self.device, non_blocking=True)
        if self.device.type == "cpu":
            planes = images.permute(0, 3, 1, 2)  # NCHW strides over the NHWC bytes
            if self.cpu_output is None or self.cpu_output.shape != planes.shape:
                self.cpu_output = torch.empty(planes.shape, dtype=torch.float32)
            return self.cpu_output.copy_(planes).mul_(self.scale).add_(self.shift), labels
        # NHWC seen as NCHW is exactly channels_last; .float() keeps that memory format.
        images = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float()
        return images.sub_(self.mean).div_(self.std), labels

    def take_unreadable(self):
        """Positions of samples this step found unreadable since the last call: none here (the workers find
        them); device_decode.DeviceDecoder, which decodes, can find some."""
        return []

    def batches(self, loader_batches):
        """A loader's (images, labels, unreadable positions) batches as training reads them: (images, labels,
        the batch's unreadable positions as a list), images and labels on the device. A batch is valid until
        the next one is asked for (the CPU output buffer is reused)."""
        for host_images, host_labels, unreadable in loader_batches:
            images, labels = self(host_images, host_labels)
            yield images, labels, unreadable.tolist() + self.take_unreadable()


@dataclasses.dataclass
class PassTiming:
    """What timed_pass saw: images and batches, seconds from asking for the first batch to the last, the wait
    for the first batch (the pipeline filling up) and the waits for the later ones."""

    images: int = 0
    batches: int = 0
    first_batch_images: int = 0
    seconds: float = 0.0
    fill_seconds: float = 0.0
    wait_seconds: float = 0.0

    @property
    def images_per_sec(self):
        return self.images / self.seconds if self.seconds > 0 else 0.0


def timed_pass(batches, to_device, device, after_batch=None):
    """Read one pass of `batches` (a loader's batches) as training does, through to_device.batches (a
    BatchToDevice's, or one like it), then after_batch(timing) (a consumer, or a stop test: True ends the pass);
    the device is synchronised before the clock stops. Returns the PassTiming."""
    timing = PassTiming()
    start = tick = time.perf_counter()
    for _, labels, _ in to_device.batches(batches):
        waited = time.perf_counter() - tick
        if timing.batches == 0:
            timing.fill_seconds, timing.first_batch_images = waited, len(labels)
        else:
            timing.wait_seconds += waited
        timing.batches += 1
        timing.images += len(labels)
        timing.seconds = time.perf_counter() - start
        if after_batch is not None and after_batch(timing):
            break
        tick = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timing.seconds = time.perf_counter() - start
    return timing
