"""create_loader: the tuned loader for a user's own map-style Dataset, the way train.py loads its images.

    loader = torchlab.pipeline.create_loader(MyDataset(...), batch_size=64)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for images, labels, unreadable in loader:
            ...

dataset[i] returns (image, label): the image a PIL image, numpy array or tensor of one fixed shape (e.g. a
224 x 224 RGB crop), the label an int. The loader plan (plan.plan_loader: threads or worker processes, how
many, batches ahead, with the reasons) is printed once. With threads, each sample is written into its slot of a
reused batch buffer: a batch is valid until the next one is asked for (.clone() it to keep it).
"""

import numpy as np
import torch

from torchlab.pipeline import loader, plan, sampler, threads


class SlotWriter:
    """A user's Dataset seen as the thread loader's in-place dataset: dataset[position] written into a slot."""

    def __init__(self, dataset):
        self.dataset = dataset
        image, _ = dataset[0]
        self.sample_shape = np.asarray(image).shape

    def __len__(self):
        return len(self.dataset)

    def write_sample(self, key, out):
        image, label = self.dataset[key[0]]
        np.copyto(out, np.asarray(image), casting="unsafe")
        return int(label), True


def plain_collate(samples):
    """(images, labels, unreadable) as the processes backend's batches of a user's (image, label) samples."""
    images = torch.from_numpy(np.stack([np.asarray(dataset_image) for (dataset_image, _), _ in samples]))
    labels = torch.tensor([int(label) for (_, label), _ in samples], dtype=torch.int64)
    return images, labels, torch.empty(0, dtype=torch.int64)


class KeyedDataset(torch.utils.data.Dataset):
    """The user's dataset read by (position, epoch) keys, as the EpochSampler yields them."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        return self.dataset[key[0]], key[0]


def create_loader(
    dataset,
    batch_size,
    shuffle=True,
    drop_last=None,
    backend="auto",
    workers="auto",
    prefetch_factor=None,
    seed=0,
    device="cpu",
    print_plan=print,
):
    """The loader of `dataset` (map-style; dataset[i] -> (image, label)) with the plan train.py would make on
    this machine for --loader `backend`, --workers `workers` and --prefetch-factor; print_plan(line) is called
    with the plan (None: quiet). loader.plan is the plan. Batches: (images uint8 (N, *image shape), labels,
    unreadable positions (none here))."""
    device = torch.device(device)
    image, _ = dataset[0]
    one_batch_bytes = batch_size * np.asarray(image).nbytes
    asked = plan.AskedLoader(backend, workers, prefetch_factor, None, "cpu")
    used = plan.resolve_plan(asked, None, one_batch_bytes, 1, device.type == "cuda", "cpu")
    epoch_sampler = sampler.EpochSampler(len(dataset), shuffle, seed)
    drop_last = shuffle if drop_last is None else drop_last
    pin_memory = used.pin_memory
    if used.backend == "threads":
        made = threads.ThreadLoader(
            SlotWriter(dataset),
            batch_size,
            epoch_sampler,
            used.workers,
            used.prefetch_factor,
            pin_memory=pin_memory,
            drop_last=drop_last,
            device=device,
        )
    else:
        made = torch.utils.data.DataLoader(
            KeyedDataset(dataset),
            batch_size=batch_size,
            sampler=epoch_sampler,
            num_workers=used.workers,
            collate_fn=plain_collate,
            pin_memory=pin_memory,
            drop_last=drop_last,
            worker_init_fn=loader.init_worker,
            prefetch_factor=used.prefetch_factor if used.workers else None,
            persistent_workers=used.workers > 0,
        )
    made.plan = used
    if print_plan is not None:
        print_plan(f"torchlab loader: {used.describe()}")
    return made
