"""The input pipeline: decode threads or worker processes, uint8 batches, normalising on the device.

build_loader(dataset, plan, device) is the one place a loader is made: a threads.ThreadLoader, or a DataLoader of
worker processes, as the plan (plan.LoaderPlan) says. timed_pass is the one loop that reads a pass as training
does and times it.

Batches stay uint8 (N, H, W, 3) from decoding to the device: a quarter of float32's bytes through the
worker queues, pinned memory and the bus. BatchToDevice turns them into normalised float NCHW tensors in
channels_last memory (the same bytes, seen through permuted strides) on the device.
"""

import dataclasses
import os
import time

import numpy as np
import torch

from torchlab.pipeline import sampler, threads

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_CHANNELS = 3


def batch_bytes(batch_size, image_size):
    """Bytes of one uint8 batch of batch_size x image_size x image_size x 3."""
    return batch_size * image_size * image_size * IMAGE_CHANNELS


def dataset_batch_bytes(dataset, batch_size):
    """Bytes of one of `dataset`'s batches in /dev/shm: uint8 pixels, or what a dataset whose batches are not
    decoded pixels (device_decode.EncodedImageDataset, which also brings its own collate) says."""
    if hasattr(dataset, "batch_bytes"):
        return dataset.batch_bytes(batch_size)
    return batch_bytes(batch_size, dataset.image_size)


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


def worker_form(dataset):
    """(dataset, collate) as worker processes read `dataset`: its own worker form where it has one (create_loader's
    user datasets), else itself with its collate (--decode gpu's) or collate_uint8."""
    if hasattr(dataset, "for_worker_processes"):
        return dataset.for_worker_processes()
    return dataset, getattr(dataset, "collate", collate_uint8)


def build_loader(dataset, plan, device, shuffle=True, rank=0, world_size=1, drop_last=None):
    """The loader of `dataset` as `plan` (a plan.LoaderPlan) says: a threads.ThreadLoader (--loader threads) or a
    DataLoader of worker processes. Training shuffles and drops the last partial batch; validation neither
    (drop_last None: as shuffle). loader.sampler is the EpochSampler: call loader.sampler.set_epoch(epoch, skip)
    before each pass (batches_per_epoch(loader) counts a whole epoch's batches). The plan has fitted the worker
    processes to /dev/shm already."""
    drop_last = shuffle if drop_last is None else drop_last
    epoch_sampler = sampler.EpochSampler(len(dataset), shuffle, plan.seed, rank, world_size)
    if plan.loader == "threads":
        # In place where the dataset writes samples into their slots; else its own collate (--decode gpu's).
        collate = getattr(dataset, "collate", None)
        if collate is None and not hasattr(dataset, "write_sample"):
            collate = collate_uint8
        return threads.ThreadLoader(
            dataset,
            plan.batch_size,
            epoch_sampler,
            plan.workers,
            plan.prefetch_factor,
            pin_memory=plan.pin_memory,
            drop_last=drop_last,
            collate_fn=collate,
            device=device,
        )
    samples, collate = worker_form(dataset)
    return torch.utils.data.DataLoader(
        samples,
        batch_size=plan.batch_size,
        sampler=epoch_sampler,
        num_workers=plan.workers,
        collate_fn=collate,
        pin_memory=plan.pin_memory,
        drop_last=drop_last,
        worker_init_fn=init_worker,
        prefetch_factor=plan.prefetch_factor if plan.workers > 0 else None,
        persistent_workers=plan.persistent_workers and plan.workers > 0,
        # Its own generator: creating an iterator then leaves torch's global RNG (dropout, ...) alone,
        # so a resumed run draws the same random numbers as an uninterrupted one.
        generator=torch.Generator().manual_seed(plan.seed),
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
