"""build.build_input (pipeline/build.py): the one place a loader plan becomes the loaders and the device step."""

import dataclasses

import numpy as np
import torch

from conftest import given_plan
from torchlab.data import decode, splits
from torchlab.pipeline import build, device_decode, loader

CPU = torch.device("cpu")


def test_the_plan_alone_says_the_datasets_loaders_and_device_step(sample_set):
    _, train_index, val_index = splits.load_splits(str(sample_set), 0.1, 0)
    used = dataclasses.replace(given_plan("threads", workers=2, batch_size=8, seed=5), jpeg_draft=False)

    train_loader, val_loader, to_device = build.build_input(used, 32, CPU, train_index, val_index)

    assert type(to_device) is loader.BatchToDevice and to_device.device == CPU
    for data_loader, index, train in ((train_loader, train_index, True), (val_loader, val_index, False)):
        dataset = data_loader.dataset
        assert type(dataset) is decode.ImageDataset and dataset.index is index
        assert (dataset.train, dataset.seed, dataset.draft, dataset.image_size) == (train, 5, False, 32)
        assert data_loader.batch_size == 8 and data_loader.drop_last == train
    images, labels, _ = next(iter(train_loader))
    assert images.shape == (8, 32, 32, 3) and to_device(images, labels)[0].dtype == torch.float32


def test_the_gpu_decoder_gets_encoded_files_and_its_device_step_and_no_val_index_no_val_loader(sample_set):
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    used = dataclasses.replace(given_plan("threads", workers=1, batch_size=4), decode="gpu")

    built = build.build_input(used, 32, CPU, train_index, train_index.subset(np.arange(0)))

    assert type(built.to_device) is device_decode.DeviceDecoder and built.val is None
    assert type(built.train.dataset) is device_decode.EncodedImageDataset and built.train.dataset.draft
    assert build.build_input(used, 32, CPU, train_index).val is None
