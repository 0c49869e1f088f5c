"""The thread loader: decode threads in the training process, each sample written straight into its slot of a
preallocated uint8 batch, and a ring of those batches (pinned on CUDA) handed to the training loop in order.

Nothing passes through /dev/shm and nothing is collated: a thread takes the next sample of the pass, waits until
the batch buffer that sample belongs to is free, decodes, crops, resizes and flips into the slot (libjpeg-turbo,
torch's resize and numpy's copy all run without the GIL), and the thread that fills a batch's last slot wakes
the loop. The ring holds `batches_ahead` batches besides the one the loop is using; a batch's buffer is refilled
only once the loop has asked for the next batch (and, on CUDA, once the copy it queued from it has finished: a
CUDA event). So a batch is valid until the next one is asked for: .clone() one to keep it.

The samples, their order and their augmentation are the sampler's and the dataset's, as with DataLoader: the
same batches for the same (seed, epoch, position), however many threads, and a resumed pass (set_epoch's skip)
gives what an uninterrupted one gives from there. Threads stop when the pass ends, is abandoned (a loop that
breaks early: the generator is closed) or the interpreter exits; they are daemons, and never outlive a pass.

Datasets that can write a sample in place have write_sample(key, out) -> (label, readable) and sample_shape
(decode.ImageDataset); any other is read with dataset[key] in the threads and batched by collate_fn (by the
thread that completes the batch), as --decode gpu's EncodedImageDataset is.
"""

import atexit
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


class BatchBuffer:
    """One batch of the ring: images (batch, *sample_shape) uint8, labels, readable flags and sample positions."""

    def __init__(self, batch_size, sample_shape, pin_memory):
        self.images = torch.empty((batch_size, *sample_shape), dtype=torch.uint8, pin_memory=pin_memory)
        self.labels = torch.empty(batch_size, dtype=torch.int64, pin_memory=pin_memory)
        self.image_slots = self.images.numpy()
        self.label_slots = self.labels.numpy()
        self.readable = np.ones(batch_size, dtype=bool)
        self.positions = np.zeros(batch_size, dtype=np.int64)
        self.event = None  # CUDA: recorded when the loop lets the buffer go, after the copy it queued


class ThreadLoader:
    """A DataLoader-like loader of `dataset`'s batches in `threads` decode threads (0: decoded in the loop).

    loader.sampler is the sampler (an EpochSampler: set_epoch(epoch, skip) before each pass); len(loader) is
    the batches the next pass yields. Batches are (images uint8 (N, *sample_shape), labels int64 (N,), unreadable
    positions int64) where the dataset writes in place, else what collate_fn makes of the samples.
    """

    backend = "threads"

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

    def _make_ring(self):
        if self.ring is None and self.in_place:
            self.ring = [
                BatchBuffer(self.batch_size, self.dataset.sample_shape, self.pin_memory)
                for _ in range(self.batches_ahead + 1)
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
        self.slots = len(self.ring) if self.ring else loader.batches_ahead + 1
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
        """A decode thread: take samples and write them until the pass has none left or stops."""
        try:
            while True:
                with self.condition:
                    taken = self.take_sample()
                if taken is None:
                    return
                self.decode(*taken)
        except BaseException as error:  # handed to the loop, which raises it
            with self.condition:
                self.error = self.error or error
                self.stopping = True
                self.condition.notify_all()

    def decode(self, number, key, slot):
        batch, in_batch = divmod(number, self.loader.batch_size)
        if self.ring is not None:
            buffer = self.ring[slot]
            if buffer.event is not None:
                buffer.event.synchronize()
            label, readable = self.loader.dataset.write_sample(key, buffer.image_slots[in_batch])
            buffer.label_slots[in_batch] = label
            buffer.readable[in_batch] = readable
            buffer.positions[in_batch] = key[0] if isinstance(key, tuple) else key
        else:
            sample = self.loader.dataset[key]
            with self.condition:
                if self.samples_of[slot] is None:
                    self.samples_of[slot] = [None] * self.batch_size_of(batch)
                self.samples_of[slot][in_batch] = sample
        with self.condition:
            self.done[slot] += 1
            complete = self.done[slot] == self.batch_size_of(batch)
            if complete and self.ring is not None:
                self.condition.notify_all()
        if complete and self.ring is None:
            collated = self.loader.collate_fn(self.samples_of[slot])
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
            self.decode(*taken)

    def batch(self, batch):
        """The (images, labels, unreadable positions) of `batch`: views of its ring buffer, or copies of the
        readable samples alone where some were unreadable; or collate_fn's batch."""
        if self.ring is None:
            return self.collated[batch]
        buffer, size = self.ring[batch % self.slots], self.batch_size_of(batch)
        images, labels = buffer.images[:size], buffer.labels[:size]
        readable = buffer.readable[:size]
        if readable.all():
            return images, labels, torch.empty(0, dtype=torch.int64)
        keep = torch.from_numpy(readable.copy())
        unreadable = torch.from_numpy(buffer.positions[:size][~readable].copy())
        return images[keep], labels[keep], unreadable

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


@atexit.register
def _stop_live_passes():
    for one_pass in list(_live_passes):
        one_pass.stop()
