"""build_input(used, image_size, device, train_index, val_index): the one place a loader plan becomes the input
pipeline: the dataset of the plan's decoder (its JPEG draft included), the loaders (loader.build_loader) and
the device step that takes their batches to the device, normalised. train.py, bench, autotune and gpu-check
all call it.
"""

import typing

from torchlab.data import decode
from torchlab.pipeline import device_decode, loader


class Input(typing.NamedTuple):
    """What build_input makes: the training loader, the validation loader (None: no validation index) and the
    device step (loader.BatchToDevice, or device_decode.DeviceDecoder for --decode gpu)."""

    train: object
    val: object
    to_device: loader.BatchToDevice


def make_dataset(used, index, image_size, train):
    """The dataset of `index` for the plan `used`: decoded pixels (decode.ImageDataset), or encoded files for
    DeviceDecoder (--decode gpu)."""
    dataset_class = device_decode.EncodedImageDataset if used.decode == "gpu" else decode.ImageDataset
    return dataset_class(index, image_size, train=train, seed=used.seed, draft=used.jpeg_draft)


def build_input(used, image_size, device, train_index, val_index=None, rank=0, world_size=1):
    """The Input of the loader plan `used` (plan.LoaderPlan) for `image_size` px on `device` (torch.device): the
    training loader of `train_index` (shuffled, the last partial batch dropped), the validation loader of
    `val_index` (in order; None where it is None or empty), each reading its share for process `rank` of
    `world_size`."""
    gpu = used.decode == "gpu"
    to_device = device_decode.DeviceDecoder(device, image_size) if gpu else loader.BatchToDevice(device)

    def loader_of(index, train):
        dataset = make_dataset(used, index, image_size, train)
        return loader.build_loader(dataset, used, device, train, rank=rank, world_size=world_size)

    train = loader_of(train_index, train=True)
    val = loader_of(val_index, train=False) if val_index is not None and len(val_index) > 0 else None
    return Input(train, val, to_device)
