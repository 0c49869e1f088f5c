"""The thread loader: decode threads in the training process, each sample written straight into its slot of a
preallocated batch, and a ring of those batches (pinned on CUDA) handed to the training loop in order.

Nothing passes through /dev/shm and nothing is collated: a thread takes the next sample of the pass, waits until
the batch buffer that sample belongs to is free, decodes, crops, resizes and flips into the slot (libjpeg-turbo,
torch's resize and numpy's copy all run without the GIL), and the thread that fills a batch's last slot wakes
the loop. The ring holds `batches_ahead` batches besides the one the loop is using (no more than a pass has); a
batch's buffer is refilled only once the loop has asked for the next batch (and, on CUDA, once the copy it queued
from it has finished: a CUDA event). So a batch is valid until the next one is asked for: .clone() one to keep it.

The samples, their order and their augmentation are the sampler's and the dataset's, as with DataLoader: the
same batches for the same (seed, epoch, position), however many threads, and a resumed pass (set_epoch's skip)
gives what an uninterrupted one gives from there. Threads stop when the pass ends, is abandoned (a loop that
breaks early: the generator is closed) or the interpreter exits; they are daemons, and never outlive a pass.

Datasets that can write a sample in place (decode.ImageDataset, create_loader's view of a user's Dataset) have
batch_fields (the (shape, dtype) of each part of a sample: each gets a tensor (batch, *shape) of that dtype in
every batch buffer; dtype None, a list of Python objects), write_sample(key, slots, row) -> readable (the sample
written into row `row` of each part's slot) and batch_of(fields, unreadable positions) -> the batch. Any other
dataset is read with dataset[key] in the threads and batched by collate_fn (by the thread that completes the
batch), as --decode gpu's EncodedImageDataset is.
"""

import atexit
import math
import threading
import weakref

import numpy as np
import torch

STOP_JOIN_SECONDS = 10  # a thread inside a hung read is left behind (a daemon) rather than hanging the loop
_live_passes = weakref.WeakSet()


def pinned(value):
    """`value` (tensors, in tuples, lists, named tuples or dicts) with its tensors in page-locked memory."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(pinned(item) for item in value))
    if isinstance(value, list | tuple):
        return type(value)(pinned(item) for item in value)
    if isinstance(value, dict):
        return {key: pinned(item) for key, item in value.items()}
    return value


# torch dtypes that numpy has too: their slots are written through numpy views (no torch call per sample).
NUMPY_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
}


def batch_tensor(shape, dtype, pin_memory=False):
    """An empty batch tensor; in a DataLoader worker, in shared memory already (as torch's default_collate makes
    its batches), so that sending it to the training process copies nothing."""
    if torch.utils.data.get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape)
    return torch.empty(shape, dtype=dtype, pin_memory=pin_memory)


class BatchBuffer:
    """One batch of a dataset's batch_fields: `fields`, a tensor (batch, *shape) of its dtype for each (a list
    for dtype None); `slots`, what a sample is written into (the tensors' numpy views where numpy has the dtype);
    readable flags and sample positions."""

    def __init__(self, batch_size, batch_fields, pin_memory=False):
        self.fields = [
            [None] * batch_size if dtype is None else batch_tensor((batch_size, *shape), dtype, pin_memory)
            for shape, dtype in batch_fields
        ]
        self.slots = [
            field.numpy() if isinstance(field, torch.Tensor) and field.dtype in NUMPY_DTYPES else field
            for field in self.fields
        ]
        self.readable = np.ones(batch_size, dtype=bool)
        self.positions = np.zeros(batch_size, dtype=np.int64)
        self.event = None  # CUDA: recorded when the loop lets the buffer go, after the copy it queued


class ThreadLoader:
    """A DataLoader-like loader of `dataset`'s batches in `threads` decode threads (0: decoded in the loop).

    loader.sampler is the sampler (an EpochSampler: set_epoch(epoch, skip) before each pass); len(loader) is
    the batches the next pass yields. Batches are what the dataset's batch_of makes of a batch's readable samples
    where it writes in place (ImageDataset: images uint8 (N, H, W, 3), labels int64 (N,), unreadable positions),
    else what collate_fn makes of the samples.
    """

    def __init__(
        self,
        dataset,
        batch_size,
        sampler,
        threads,
        batches_ahead=2,
        pin_memory=False,
        drop_last=False,
        collate_fn=None,
        device=None,
    ):
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.threads = threads
        self.batches_ahead = max(1, batches_ahead)
        self.pin_memory = pin_memory and torch.cuda.is_available()  # without CUDA, DataLoader only warns
        self.drop_last = drop_last
        self.in_place = collate_fn is None
        self.collate_fn = collate_fn
        self.device = device
        self.ring = None  # made by the first pass, reused by the next ones

    def __len__(self):
        return self._batch_count(len(self.sampler))

    def _batch_count(self, samples):
        batches, rest = divmod(samples, self.batch_size)
        return batches + int(rest > 0 and not self.drop_last)

    def slot_count(self):
        """Batches a pass holds at once: those ahead and the one in use, but no more than a whole pass has."""
        return max(1, min(self.batches_ahead + 1, self._batch_count(self.sampler.samples_per_epoch())))

    def _make_ring(self):
        if self.ring is None and self.in_place:
            self.ring = [
                BatchBuffer(self.batch_size, self.dataset.batch_fields, self.pin_memory)
                for _ in range(self.slot_count())
            ]
        return self.ring

    def __iter__(self):
        samples = len(self.sampler)  # before iterating: the sampler's skip is used up by its first sample
        one_pass = Pass(self, iter(self.sampler), samples)
        _live_passes.add(one_pass)
        try:
            yield from one_pass.batches()
        finally:
            one_pass.stop()


class Pass:
    """One pass of a ThreadLoader: its threads, the samples they have taken, and the batches ready."""

    def __init__(self, loader, keys, samples):
        self.loader = loader
        self.keys = keys
        self.batch_count = loader._batch_count(samples)
        self.samples = min(samples, self.batch_count * loader.batch_size)
        self.ring = loader._make_ring()
        self.slots = len(self.ring) if self.ring else loader.slot_count()
        self.condition = threading.Condition()
        self.next_sample = 0
        self.usable_from = list(range(self.slots))  # ring slot r may take batch usable_from[r] and none later
        self.done = [0] * self.slots
        self.collated = {}  # batch number -> collate_fn's batch (collate mode)
        self.samples_of = [None] * self.slots  # collate mode: each slot's samples
        self.error = None
        self.stopping = False
        self.threads = [
            threading.Thread(target=self.work, name=f"torchlab-decode-{number}", daemon=True)
            for number in range(loader.threads)
        ]
        for thread in self.threads:
            thread.start()

    def batch_size_of(self, batch):
        return min(self.loader.batch_size, self.samples - batch * self.loader.batch_size)

    def take_sample(self):
        """(sample number, key, ring slot) of the next sample once its batch's slot is free; None when the pass
        has handed out every sample or is stopping. Called holding the condition's lock."""
        if self.stopping or self.next_sample >= self.samples:
            return None
        number = self.next_sample
        self.next_sample += 1
        key = next(self.keys)
        batch = number // self.loader.batch_size
        slot = batch % self.slots
        while self.usable_from[slot] < batch and not self.stopping:
            self.condition.wait()
        return None if self.stopping else (number, key, slot)

    def work(self):
        """A decode thread: take samples and write them until the pass has none left or stops. A written sample
        is counted in the same hold of the lock as the next one is taken: one hold per sample, as the lock
        and the GIL are what the threads wait for on a machine with many CPUs."""
        try:
            written = None
            while True:
                with self.condition:
                    to_collate = None if written is None else self.count(*written)
                    taken = None if to_collate is not None else self.take_sample()
                written = None
                if to_collate is not None:
                    self.collate(to_collate)
                elif taken is None:
                    return
                else:
                    written = self.write(*taken)
        except BaseException as error:  # handed to the loop, which raises it
            with self.condition:
                self.error = self.error or error
                self.stopping = True
                self.condition.notify_all()

    def write(self, number, key, slot):
        """Decode sample `number` (`key`) into its ring slot, or read it (collate mode): (number, slot, the
        sample read or None), for count."""
        if self.ring is None:
            return number, slot, self.loader.dataset[key]
        buffer, in_batch = self.ring[slot], number % self.loader.batch_size
        if buffer.event is not None:
            buffer.event.synchronize()
        buffer.readable[in_batch] = self.loader.dataset.write_sample(key, buffer.slots, in_batch)
        buffer.positions[in_batch] = key[0] if isinstance(key, tuple) else key
        return number, slot, None

    def count(self, number, slot, sample):
        """Count a written sample (holding the lock); the loop is woken when it completes its batch. Collate
        mode: the batch number when collate_fn is now to batch the slot's samples, else None."""
        batch, in_batch = divmod(number, self.loader.batch_size)
        if self.ring is None:
            if self.samples_of[slot] is None:
                self.samples_of[slot] = [None] * self.batch_size_of(batch)
            self.samples_of[slot][in_batch] = sample
        self.done[slot] += 1
        if self.done[slot] < self.batch_size_of(batch):
            return None
        if self.ring is not None:
            self.condition.notify_all()
            return None
        return batch

    def collate(self, batch):
        collated = self.loader.collate_fn(self.samples_of[batch % self.slots])
        if self.loader.pin_memory:
            collated = pinned(collated)
        with self.condition:
            self.collated[batch] = collated
            self.condition.notify_all()

    def ready(self, batch):
        slot = batch % self.slots
        if self.usable_from[slot] != batch:
            return False
        if self.ring is None:
            return batch in self.collated
        return self.done[slot] == self.batch_size_of(batch)

    def release(self, batch):
        """The loop is done with `batch`: its slot may take the batch `slots` later."""
        slot = batch % self.slots
        if self.ring is not None and self.loader.device is not None and self.loader.device.type == "cuda":
            self.ring[slot].event = torch.cuda.current_stream(self.loader.device).record_event()
        self.done[slot] = 0
        self.samples_of[slot] = None
        self.collated.pop(batch, None)
        self.usable_from[slot] = batch + self.slots
        self.condition.notify_all()

    def batches(self):
        for batch in range(self.batch_count):
            with self.condition:
                if batch > 0:
                    self.release(batch - 1)
                if not self.threads:  # decoded here, in the loop
                    self.condition.release()
                    try:
                        self.work_inline(batch)
                    finally:
                        self.condition.acquire()
                while not self.ready(batch) and self.error is None:
                    self.condition.wait()
                if self.error is not None:
                    raise self.error
            yield self.batch(batch)

    def work_inline(self, batch):
        for _ in range(self.batch_size_of(batch)):
            with self.condition:
                taken = self.take_sample()
            written = self.write(*taken)
            with self.condition:
                to_collate = self.count(*written)
            if to_collate is not None:
                self.collate(to_collate)

    def batch(self, batch):
        """The dataset's batch_of `batch`'s fields (views of its ring buffer, or copies of the readable samples
        alone where some were unreadable; lists copied) and its unreadable positions; or collate_fn's batch."""
        if self.ring is None:
            return self.collated[batch]
        buffer, size = self.ring[batch % self.slots], self.batch_size_of(batch)
        fields = [field[:size] for field in buffer.fields]
        readable = buffer.readable[:size]
        if readable.all():
            return self.loader.dataset.batch_of(fields, torch.empty(0, dtype=torch.int64))
        keep = torch.from_numpy(readable.copy())
        fields = [field[keep] if isinstance(field, torch.Tensor) else kept(field, readable) for field in fields]
        unreadable = torch.from_numpy(buffer.positions[:size][~readable].copy())
        return self.loader.dataset.batch_of(fields, unreadable)

    def stop(self):
        """End the pass: its threads finish the sample they are on and exit; joined here."""
        with self.condition:
            self.stopping = True
            if self.ring is not None and self.loader.device is not None and self.loader.device.type == "cuda":
                for buffer in self.ring:
                    buffer.event = torch.cuda.current_stream(self.loader.device).record_event()
            self.condition.notify_all()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(STOP_JOIN_SECONDS)


def kept(items, readable):
    return [item for item, keep in zip(items, readable, strict=True) if keep]


@atexit.register
def _stop_live_passes():
    for one_pass in list(_live_passes):
        one_pass.stop()
