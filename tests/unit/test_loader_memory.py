"""The thread loader's memory stays flat over an epoch of a 1-million-sample index: nothing it keeps grows with the
samples it has handed out (a list of keys, of finished batches, of per-sample results would)."""

import sys

import numpy as np
import torch

from conftest import given_plan
from torchlab.data import folder
from torchlab.pipeline import loader

SAMPLES = 1_000_000
BATCH_SIZE = 1000
GROWTH_LIMIT_MB = 16  # buffers: one batch of a 224 px ImageNet loader is 9.6 MB
# Python objects: the heap keeps freed memory for reuse, so resident memory alone would not show one object per
# sample kept; the count of allocated blocks does (it would grow by about a million).
GROWTH_LIMIT_BLOCKS = 10_000


def resident_bytes():
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields["VmRSS"].split()[0]) * 1024


class IndexReadingDataset:
    """What ImageDataset reads of each sample (its index entry), written in place as a tiny image."""

    batch_fields = [((1, 1, 3), torch.uint8), ((), torch.int64)]

    def __init__(self, index):
        self.index = index

    def __len__(self):
        return len(self.index)

    def write_sample(self, key, slots, row):
        position = key[0]
        slots[0][row] = len(self.index.source(position)) % 256
        slots[1][row] = self.index.labels[position]
        return True

    @staticmethod
    def batch_of(fields, unreadable):
        return (*fields, unreadable)


def million_sample_index():
    """Built in numpy, with no Python object per sample: freed ones would leave room in the interpreter's heap
    that a leak could fill unseen."""
    numbers = np.arange(SAMPLES)
    paths = np.char.add(np.char.mod(b"/data/train/n%03d/", numbers % 1000), np.char.mod(b"img_%07d.JPEG", numbers))
    return folder.SampleIndex.from_arrays(
        np.frombuffer(paths.tobytes(), dtype=np.uint8),
        np.arange(SAMPLES + 1, dtype=np.int64) * paths.itemsize,
        numbers % 1000,
    )


def test_thread_loader_memory_is_flat_over_an_epoch_of_a_million_samples():
    dataset = IndexReadingDataset(million_sample_index())
    settings = given_plan("threads", 2, 2, batch_size=BATCH_SIZE)
    data_loader = loader.build_loader(dataset, settings, torch.device("cpu"), shuffle=True)
    data_loader.sampler.set_epoch(0)
    last = SAMPLES // BATCH_SIZE
    batches = 0
    for images, labels, _ in data_loader:
        batches += 1
        assert images.shape == (len(labels), 1, 1, 3)
        if batches == 50:  # the pass is under way: its order, ring and threads exist
            start, start_blocks = resident_bytes(), sys.getallocatedblocks()
        if batches == last:  # measured in the pass: what it keeps is freed with it when it ends
            growth_blocks, growth_mb = sys.getallocatedblocks() - start_blocks, (resident_bytes() - start) / 1e6
    assert batches == last
    assert growth_blocks < GROWTH_LIMIT_BLOCKS, f"{growth_blocks} more Python objects over the epoch"
    assert growth_mb < GROWTH_LIMIT_MB, f"resident memory grew {growth_mb:.1f} MB over the epoch"
