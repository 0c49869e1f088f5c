"""The input pipeline: which samples each process reads, worker processes, uint8 batches, normalising on the device.

build_loader(dataset, options, device, train) is the one place a DataLoader is made: training, validation,
--loader-only and anything that times "this project's pipeline" all call it.

Batches stay uint8 (N, H, W, 3) from decoding to the device: a quarter of float32's bytes through the
worker queues, pinned memory and the bus. BatchToDevice turns them into normalised float NCHW tensors in
channels_last memory (the same bytes, seen through permuted strides) on the device.
"""

import math
import os
import sys

import numpy as np
import torch

CGROUP_ROOT = "/sys/fs/cgroup"
MAX_AUTO_WORKERS = 8
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


def auto_worker_count(processes_on_this_machine):
    """--workers auto: this process's share of the usable CPUs, at most MAX_AUTO_WORKERS."""
    return min(MAX_AUTO_WORKERS, max(1, usable_cpu_count() // processes_on_this_machine))


class EpochSampler(torch.utils.data.Sampler):
    """This process's share of one epoch's samples, from any point in it: a resumable DistributedSampler.

    Training (train=True): the order is a permutation seeded by (seed, epoch), the same in every process
    and every run, dealt round-robin to the ranks; the last len % world_size samples are left out so
    that every rank has as many. set_epoch(epoch, skip) starts `skip` samples into this rank's share
    without reading those samples. Validation: every sample once, in order, dealt round-robin.

    Yields (position, epoch) keys: ImageDataset seeds each sample's augmentation with them.
    """

    def __init__(self, num_samples, train, seed, rank=0, world_size=1):
        self.num_samples = num_samples
        self.train = train
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.set_epoch(0)

    def set_epoch(self, epoch, skip=0):
        self.epoch = epoch
        self.skip = skip

    def __iter__(self):
        if self.train:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        share = order[self.rank : self._used_samples() : self.world_size][self.skip :]
        epoch = self.epoch
        return ((int(position), epoch) for position in share)

    def __len__(self):
        return max(0, len(range(self.rank, self._used_samples(), self.world_size)) - self.skip)

    def _used_samples(self):
        return self.num_samples - self.num_samples % self.world_size if self.train else self.num_samples


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


def shared_memory_needed(workers, prefetch_factor, one_batch_bytes):
    """/dev/shm bytes that the loader's batches take at most: those in flight and those the main process holds."""
    return (workers * prefetch_factor + BATCHES_HELD_BY_MAIN) * one_batch_bytes if workers > 0 else 0


def fit_to_shared_memory(workers, prefetch_factor, one_batch_bytes, free_bytes):
    """The (workers, prefetch_factor) nearest those asked for whose batches fit in free_bytes of /dev/shm:
    prefetch_factor is lowered first, then workers. Raises SharedMemoryError when one batch does not fit."""
    if shared_memory_needed(workers, prefetch_factor, one_batch_bytes) <= free_bytes:
        return workers, prefetch_factor
    # Batches that may be in flight: what fits, less those the main process holds (any flag value, in one step).
    in_flight = free_bytes // one_batch_bytes - BATCHES_HELD_BY_MAIN
    if in_flight >= workers:
        return workers, in_flight // workers
    if in_flight >= 1:
        return in_flight, 1
    raise SharedMemoryError(
        f"/dev/shm has {free_bytes / MB:.0f} MB free: not enough for one loader worker's batches "
        f"({shared_memory_needed(1, 1, one_batch_bytes) / MB:.0f} MB of {one_batch_bytes / MB:.1f} MB each); "
        "start the container with --shm-size=8g (or --ipc=host), or use --workers 0 or a smaller --batch-size"
    )


def collate_uint8(samples):
    """Batch ImageDataset samples: (images uint8 (N, H, W, 3), labels int64 (N,), unreadable positions).

    The images are stacked straight into one preallocated tensor; unreadable samples are left out.
    """
    readable = [sample for sample in samples if sample[0] is not None]
    image_shape = readable[0][0].shape if readable else (0, 0, 3)
    images = torch.empty((len(readable), *image_shape), dtype=torch.uint8)
    if readable:
        np.stack([pixels for pixels, _, _ in readable], out=images.numpy())
    labels = torch.tensor([label for _, label, _ in readable], dtype=torch.int64)
    unreadable = torch.tensor([position for pixels, _, position in samples if pixels is None], dtype=torch.int64)
    return images, labels, unreadable


def init_worker(worker_id):
    """Each worker decodes on one thread: parallelism comes from the workers, not from torch's thread pool."""
    torch.set_num_threads(1)


def build_loader(dataset, options, device, train, rank=0, world_size=1):
    """The DataLoader for `dataset` (an ImageDataset) as training or validation reads it.

    Reads from `options` (train.py's parsed flags): batch_size, workers (a number), prefetch_factor,
    persistent_workers, pin_memory (None: when `device` is CUDA) and seed. loader.sampler is the
    EpochSampler: call loader.sampler.set_epoch(epoch, skip) before each pass.

    Before starting workers, it checks that /dev/shm holds the batches they keep in flight: if not, it
    lowers prefetch_factor, then workers, and says so on stderr; if one batch does not fit, it raises
    SharedMemoryError (a worker would otherwise die of a bus error mid-epoch).
    """
    workers, prefetch_factor = options.workers, options.prefetch_factor
    shm = shared_memory_bytes()
    if workers > 0 and shm is not None:
        one_batch_bytes = batch_bytes(options.batch_size, dataset.image_size)
        fitted = fit_to_shared_memory(workers, prefetch_factor, one_batch_bytes, shm[1])
        if fitted != (workers, prefetch_factor) and rank == 0:
            print(
                f"loader: /dev/shm has {shm[1] / MB:.0f} MB free, too little for {workers} workers x {prefetch_factor} "
                f"prefetched batches of {one_batch_bytes / MB:.1f} MB: using {fitted[0]} workers x {fitted[1]}; "
                "start the container with --shm-size=8g to keep them",
                file=sys.stderr,
            )
        workers, prefetch_factor = fitted
    pin_memory = device.type == "cuda" if options.pin_memory is None else options.pin_memory
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=options.batch_size,
        sampler=EpochSampler(len(dataset), train, options.seed, rank, world_size),
        num_workers=workers,
        collate_fn=collate_uint8,
        pin_memory=pin_memory,
        drop_last=train,
        worker_init_fn=init_worker,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        persistent_workers=options.persistent_workers and workers > 0,
        # Its own generator: creating an iterator then leaves torch's global RNG (dropout, ...) alone,
        # so a resumed run draws the same random numbers as an uninterrupted one.
        generator=torch.Generator().manual_seed(options.seed),
    )


class BatchToDevice:
    """Move a uint8 (N, H, W, 3) batch to the device and normalise it there: float NCHW, channels_last."""

    def __init__(self, device):
        self.device = device
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).mul(255).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, device=device).mul(255).view(1, 3, 1, 1)

    def __call__(self, images, labels):
        # NHWC seen as NCHW is exactly channels_last; .float() keeps that memory format.
        images = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float()
        return images.sub_(self.mean).div_(self.std), labels.to(self.device, non_blocking=True)
