"""loader.py: CPU counting, the resumable sharded sampler, uint8 batches, and worker memory."""

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import given_plan
from torchlab.data import decode, folder, splits
from torchlab.pipeline import loader, sampler
from torchlab.tools import bench


def shares(sampler_for_rank, world_size):
    return [list(sampler_for_rank(rank)) for rank in range(world_size)]


def test_training_order_is_seeded_sharded_and_resumable():
    def sampler_for_rank(rank, seed=3, epoch=2, skip=0):
        epoch_sampler = sampler.EpochSampler(103, train=True, seed=seed, rank=rank, world_size=4)
        epoch_sampler.set_epoch(epoch, skip)
        return epoch_sampler

    full = shares(sampler_for_rank, 4)
    positions = [position for share in full for position, _ in share]
    assert [len(share) for share in full] == [len(sampler_for_rank(rank)) for rank in range(4)] == [25] * 4
    assert len(set(positions)) == 100 and set(positions) <= set(range(103))
    assert all(epoch == 2 for share in full for _, epoch in share)
    assert shares(sampler_for_rank, 4) == full
    assert shares(lambda rank: sampler_for_rank(rank, epoch=3), 4) != full
    assert shares(lambda rank: sampler_for_rank(rank, seed=4), 4) != full
    resumed = shares(lambda rank: sampler_for_rank(rank, skip=10), 4)
    assert resumed == [share[10:] for share in full]
    assert len(sampler_for_rank(0, skip=10)) == 15


def test_a_skip_starts_the_next_pass_only_and_the_epoch_keeps_its_length():
    """set_epoch's skip is where a resumed pass starts: the pass after it reads the whole share again, and
    samples_per_epoch() is the whole share whatever the skip. train.py took len() for the epoch's length, and
    after a resume it still had the skip taken off in the next epoch (issue 30)."""
    epoch_sampler = sampler.EpochSampler(103, train=True, seed=3, rank=1, world_size=4)
    epoch_sampler.set_epoch(2)
    whole = list(epoch_sampler)

    epoch_sampler.set_epoch(2, skip=10)
    assert len(epoch_sampler) == 15
    assert list(epoch_sampler) == whole[10:]
    assert len(epoch_sampler) == 25
    assert list(epoch_sampler) == whole
    epoch_sampler.set_epoch(2, skip=10)
    assert epoch_sampler.samples_per_epoch() == 25


class KeyDataset(torch.utils.data.Dataset):
    """Stands in for an ImageDataset in build_loader: its samples are the sampler's keys."""

    image_size = 8

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, key):
        return key

    @staticmethod
    def collate(samples):
        return samples


@pytest.mark.parametrize(("train", "rank", "world_size", "batches"), [(True, 1, 4, 6), (False, 0, 3, 9)])
def test_batches_per_epoch_counts_a_whole_epoch_whatever_the_skip(train, rank, world_size, batches):
    """103 samples in batches of 4: training deals 25 to each of 4 processes, 6 full batches; validation 35 of
    them to the first of 3, in 9 batches, the last one short."""
    settings = given_plan(batch_size=4)
    data_loader = loader.build_loader(KeyDataset(103), settings, torch.device("cpu"), train, rank, world_size)
    whole = list(data_loader)
    assert loader.batches_per_epoch(data_loader) == len(data_loader) == len(whole) == batches

    data_loader.sampler.set_epoch(0, skip=2 * 4)
    assert (loader.batches_per_epoch(data_loader), len(data_loader)) == (batches, batches - 2)
    assert list(data_loader) == whole[2:]
    assert loader.batches_per_epoch(data_loader) == len(data_loader) == batches


def test_validation_reads_every_sample_once():
    samplers = [sampler.EpochSampler(10, train=False, seed=0, rank=rank, world_size=3) for rank in range(3)]
    positions = sorted(position for rank_sampler in samplers for position, _ in rank_sampler)
    assert positions == list(range(10))
    assert [len(rank_sampler) for rank_sampler in samplers] == [4, 3, 3]


def test_collate_stacks_uint8_and_drops_unreadable_samples():
    pixels = [np.full((4, 4, 3), value, dtype=np.uint8) for value in (1, 2)]
    images, labels, unreadable = loader.collate_uint8([(pixels[0], 5, 0), (None, 6, 1), (pixels[1], 7, 2)])

    assert images.dtype == torch.uint8 and images.shape == (2, 4, 4, 3)
    assert images[:, 0, 0, 0].tolist() == [1, 2]
    assert labels.tolist() == [5, 7]
    assert unreadable.tolist() == [1]
    empty_images, empty_labels, all_unreadable = loader.collate_uint8([(None, 6, 1)])
    assert (len(empty_images), len(empty_labels), all_unreadable.tolist()) == (0, 0, [1])


def test_batches_are_normalised_on_the_device():
    images = torch.tensor([[[[0, 128, 255]]]], dtype=torch.uint8).expand(2, 5, 6, 3).contiguous()
    normalised, labels = loader.BatchToDevice(torch.device("cpu"))(images, torch.tensor([1, 2]))

    assert normalised.shape == (2, 3, 5, 6) and normalised.dtype == torch.float32
    expected = [
        (value / 255 - mean) / std
        for value, mean, std in zip((0, 128, 255), loader.IMAGENET_MEAN, loader.IMAGENET_STD, strict=True)
    ]
    assert normalised[0, :, 0, 0].tolist() == pytest.approx(expected, abs=1e-5)
    assert labels.tolist() == [1, 2]


def test_the_cpu_step_gives_what_converting_the_interleaved_batch_gives():
    """The per-channel planes (the CPU's fast path) against the plain float conversion, on random batches of
    two shapes in turn (its reused output buffer follows the shape)."""
    to_device = loader.BatchToDevice(torch.device("cpu"))
    mean = torch.tensor(loader.IMAGENET_MEAN).mul(255).view(1, 3, 1, 1)
    std = torch.tensor(loader.IMAGENET_STD).mul(255).view(1, 3, 1, 1)
    generator = torch.Generator().manual_seed(0)
    for shape in ((4, 32, 48, 3), (3, 17, 9, 3), (4, 32, 48, 3)):
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        reference = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std)
        normalised, _ = to_device(images, torch.zeros(shape[0]))
        assert normalised.shape == reference.shape
        torch.testing.assert_close(normalised, reference, rtol=0, atol=1e-5)


def loader_options(workers):
    return given_plan(workers=workers, batch_size=8)


def test_workers_yield_the_same_batches_as_the_main_process(sample_set):
    _, train_index, _ = splits.load_splits(str(sample_set), val_fraction=0.1, seed=0)
    dataset = decode.ImageDataset(train_index.subset(np.arange(24)), image_size=32, train=True, seed=0)

    def epoch_batches(workers, epoch):
        train_loader = loader.build_loader(dataset, loader_options(workers), torch.device("cpu"), shuffle=True)
        train_loader.sampler.set_epoch(epoch)
        return list(train_loader)

    in_main_process, in_two_workers = epoch_batches(0, epoch=1), epoch_batches(2, epoch=1)
    assert len(in_main_process) == 3
    for (images, labels, _), (worker_images, worker_labels, _) in zip(in_main_process, in_two_workers, strict=True):
        assert images.dtype == torch.uint8 and images.shape == (8, 32, 32, 3)
        assert torch.equal(images, worker_images) and torch.equal(labels, worker_labels)
    assert not torch.equal(in_main_process[0][0], epoch_batches(0, epoch=2)[0][0])


def test_worker_memory_does_not_grow_with_the_number_of_samples():
    count = 200_000
    paths = [f"/data/train/n{number % 1000:08d}/n{number % 1000:08d}_{number}.JPEG" for number in range(count)]
    index = folder.SampleIndex(paths, [number % 1000 for number in range(count)])

    def read_index():
        for position in range(count):
            index.path(position)

    def read_list():
        for position in range(count):
            paths[position].encode()

    compact_growth = bench.memory_growth_in_a_fork(read_index)
    list_growth = bench.memory_growth_in_a_fork(read_list)

    # A list of str copies every page of its ~200k objects into the reader (~10 MB and more); the index none.
    assert list_growth > 8 * 2**20, "the measurement does not see copy-on-write"
    assert compact_growth < 2 * 2**20


def thread_options(threads, batches_ahead=2):
    return given_plan("threads", threads, batches_ahead, batch_size=8)


def test_threads_yield_the_batches_worker_processes_yield(sample_set):
    """The same crops and flips for the same (seed, epoch, position): threads writing samples into the ring's
    slots give the process loader's batches exactly, in order, for any number of threads, and a pass resumed
    `skip` samples in gives the rest of them. An epoch longer than the ring reuses its buffers."""
    _, train_index, _ = splits.load_splits(str(sample_set), val_fraction=0.1, seed=0)
    dataset = decode.ImageDataset(train_index.subset(np.arange(44)), image_size=32, train=True, seed=0)

    def epoch_batches(settings, epoch, skip=0):
        data_loader = loader.build_loader(dataset, settings, torch.device("cpu"), shuffle=True)
        data_loader.sampler.set_epoch(epoch, skip)
        return [(images.clone(), labels.clone(), bad.clone()) for images, labels, bad in data_loader]

    in_processes = epoch_batches(loader_options(2), epoch=1)
    assert len(in_processes) == 5
    for settings in (thread_options(0), thread_options(1, 1), thread_options(3), thread_options(4, 5)):
        in_threads = epoch_batches(settings, epoch=1)
        assert len(in_threads) == 5, settings
        for (images, labels, _), (thread_images, thread_labels, bad) in zip(in_processes, in_threads, strict=True):
            assert thread_images.dtype == torch.uint8 and thread_images.shape == (8, 32, 32, 3)
            assert torch.equal(images, thread_images) and torch.equal(labels, thread_labels), settings
            assert bad.tolist() == []
    resumed = epoch_batches(thread_options(2), epoch=1, skip=2 * 8)
    assert [batch[0].tolist() for batch in resumed] == [batch[0].tolist() for batch in in_processes[2:]]
    assert not torch.equal(in_processes[0][0], epoch_batches(thread_options(2), epoch=2)[0][0])


def test_the_ring_holds_no_more_batches_than_a_pass_has(sample_set):
    """50 batches ahead of a 3-batch epoch: the ring is 3 buffers, not 51 (a --prefetch-factor of 3044578022 built
    a ring of that many), and a resumed pass keeps it; collate mode's slots likewise."""
    _, train_index, _ = splits.load_splits(str(sample_set), val_fraction=0.1, seed=0)
    dataset = decode.ImageDataset(train_index.subset(np.arange(24)), image_size=16, train=True, seed=0)
    data_loader = loader.build_loader(dataset, thread_options(2, batches_ahead=50), torch.device("cpu"))
    data_loader.sampler.set_epoch(0, skip=8)
    assert len(list(data_loader)) == 2 and len(data_loader.ring) == 3
    data_loader.sampler.set_epoch(1)
    assert len(list(data_loader)) == 3 and len(data_loader.ring) == 3
    assert (
        loader.build_loader(KeyDataset(24), thread_options(2, batches_ahead=50), torch.device("cpu")).slot_count() == 3
    )


def test_thread_loader_counts_batches_as_the_dataloader_does():
    """KeyDataset has a collate of its own: the threads batch what it gives (as --decode gpu's dataset)."""
    for train, rank, world_size, batches in [(True, 1, 4, 6), (False, 0, 3, 9)]:
        settings = dataclasses.replace(thread_options(2), batch_size=4)
        data_loader = loader.build_loader(KeyDataset(103), settings, torch.device("cpu"), train, rank, world_size)
        whole = list(data_loader)
        reference = loader.build_loader(
            KeyDataset(103),
            dataclasses.replace(settings, loader="processes", workers=0),
            torch.device("cpu"),
            train,
            rank,
            world_size,
        )
        assert whole == list(reference)
        assert loader.batches_per_epoch(data_loader) == len(data_loader) == len(whole) == batches
        data_loader.sampler.set_epoch(0, skip=2 * 4)
        assert (loader.batches_per_epoch(data_loader), len(data_loader)) == (batches, batches - 2)
        assert list(data_loader) == whole[2:]


def test_unreadable_images_are_left_out_and_named_by_the_threads(sample_set, tmp_path):
    _, train_index, _ = splits.load_splits(str(sample_set), val_fraction=0.1, seed=0)
    paths = [train_index.path(position) for position in range(16)]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a JPEG")
    paths[5] = str(broken)
    index = folder.SampleIndex(paths, train_index.labels[:16])
    dataset = decode.ImageDataset(index, image_size=32, train=False, seed=0)
    (images, labels, bad), second = list(
        loader.build_loader(dataset, thread_options(2), torch.device("cpu"), shuffle=False)
    )
    assert bad.tolist() == [5] and images.shape == (7, 32, 32, 3)
    assert labels.tolist() == [int(label) for position, label in enumerate(index.labels[:8]) if position != 5]
    assert second[0].shape == (8, 32, 32, 3)


class Unreliable(KeyDataset):
    """Raises from one sample (not an unreadable image: a bug), or blocks every sample until released."""

    def __init__(self, length, fail_at=None, gate=None):
        super().__init__(length)
        self.fail_at, self.gate = fail_at, gate

    def __getitem__(self, key):
        if self.gate is not None:
            self.gate.wait()
        if key[0] == self.fail_at:
            raise RuntimeError(f"sample {key[0]} failed")
        return key


def decode_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith("torchlab-decode")]


def test_a_loop_that_stops_early_leaves_no_thread_behind():
    """train.py returns from its epoch loop at a SIGTERM: the pass's generator is closed, and its threads (some
    waiting for a free buffer, some inside a sample) must all end with it."""
    data_loader = loader.build_loader(KeyDataset(400), thread_options(3), torch.device("cpu"), shuffle=True)
    batches = iter(data_loader)
    next(batches)
    assert len(decode_threads()) == 3
    batches.close()
    assert decode_threads() == []

    gate = threading.Event()
    blocked = loader.build_loader(Unreliable(400, gate=gate), thread_options(3), torch.device("cpu"), shuffle=True)
    passes = [iter(blocked)]
    opened = threading.Thread(target=lambda: next(passes[0], None))
    opened.start()
    wait_for(lambda: len(decode_threads()) == 3)  # every thread is inside a sample, or waiting for a buffer
    gate.set()
    opened.join()
    passes.clear()  # the pass is dropped, as a loop's generator is when the loop returns
    assert decode_threads() == []


def test_an_error_in_a_thread_reaches_the_loop():
    data_loader = loader.build_loader(Unreliable(64, fail_at=None), thread_options(2), torch.device("cpu"), False)
    data_loader.dataset.fail_at = 20
    with pytest.raises(RuntimeError, match="sample 20 failed"):
        list(data_loader)
    assert decode_threads() == []


def wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class PhotoDataset(torch.utils.data.Dataset):
    """A user's own Dataset of the usual kind: paths in __init__, Image.open in __getitem__."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, number):
        with Image.open(self.paths[number]) as image:
            return image.convert("RGB").resize((40, 32)), number % 3


def test_create_loader_gives_a_users_dataset_the_planned_loader(sample_set):
    from torchlab import pipeline

    _, train_index, _ = splits.load_splits(str(sample_set), val_fraction=0.1, seed=0)
    dataset = PhotoDataset([train_index.path(position) for position in range(20)])
    lines = []
    in_threads = pipeline.create_loader(dataset, batch_size=8, loader="threads", workers=2, print_plan=lines.append)
    in_processes = pipeline.create_loader(dataset, batch_size=8, loader="processes", workers=2, print_plan=None)
    assert lines == [f"torchlab loader: {in_threads.plan.describe()}"] and in_threads.plan.loader == "threads"
    for loaded in (in_threads, in_processes):
        loaded.sampler.set_epoch(3)
    threaded = [(images.clone(), labels.clone()) for images, labels in in_threads]
    processed = [(images, labels) for images, labels in in_processes]
    assert len(threaded) == len(processed) == 2  # 20 in batches of 8, the last partial one dropped
    for (images, labels), (expected_images, expected_labels) in zip(threaded, processed, strict=True):
        assert images.shape == (8, 32, 40, 3) and torch.equal(images, expected_images)
        assert torch.equal(labels, expected_labels)
