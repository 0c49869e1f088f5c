"""--decode gpu's pipeline (pipeline/device_decode.py), run on the CPU: the workers send encoded files and the
augmentation drawn for them, DeviceDecoder decodes (torchvision's decode_jpeg, here its CPU decoder; on a GPU
nvJPEG, which `make gpu-check` measures), crops, resizes, flips and normalises. It must give what --decode cpu
gives for the same (seed, epoch, position), fall back to the CPU for files the device does not decode, and
report the files nothing decodes."""

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import given_plan, run_train
from torchlab import config, distributed, machine, resolve
from torchlab.data import decode, folder, prepared, splits
from torchlab.pipeline import device_decode, loader, plan
from torchlab.tools import gpu_check

CPU = torch.device("cpu")
# DeviceDecoder runs on the CPU everywhere (torchvision's CPU decoder), and on the GPU where CUDA is visible.
DEVICES = [CPU, *([torch.device("cuda")] if torch.cuda.is_available() else [])]
SIZE = 64
# Pixel levels (0-255) between the two paths on the CPU: both decode with libjpeg-turbo at full size and resize
# with the same antialiased filter; the CPU path rounds to uint8 after resizing, the device path does not.
LEVELS = 1.5
# nvJPEG decodes otherwise (its IDCT, its chroma upsampling): each crop within this PSNR of the CPU path's.
# Measured on an H200: 46.9 dB at least over 64 crops of the sample set (55.5 dB median, 7.2 levels at most),
# 39.2 dB at least on its prepared copy (short side 96, crops enlarged).
NVJPEG_MIN_DB = 35


def assert_same_crops(device, device_images, cpu_images):
    """The device path's normalised batch against the CPU path's, in 0-255 levels."""
    device_images, cpu_images = levels(device_images.cpu()), levels(cpu_images)
    if device.type == "cpu":
        assert (device_images - cpu_images).abs().max() <= LEVELS
    else:
        crops_db = [gpu_check.psnr(ours, theirs) for ours, theirs in zip(device_images, cpu_images, strict=True)]
        assert min(crops_db) >= NVJPEG_MIN_DB, crops_db


def levels(normalised):
    """Normalised NCHW images back to 0-255 levels, for comparing paths."""
    std = torch.tensor(loader.IMAGENET_STD).view(1, 3, 1, 1) * 255
    mean = torch.tensor(loader.IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    return normalised * std + mean


def batches(dataset, step, workers, epoch, batch_size=8):
    settings = given_plan(workers=workers, batch_size=batch_size)
    train_loader = loader.build_loader(dataset, settings, CPU, shuffle=dataset.train)
    train_loader.sampler.set_epoch(epoch)
    # clone: BatchToDevice reuses its CPU output buffer; clone keeps the memory format.
    return [(normalised.clone(), labels.cpu(), bad) for normalised, labels, bad in step.batches(train_loader)]


def both_paths(index, train, epoch, workers=0, device=CPU):
    cpu = decode.ImageDataset(index, SIZE, train=train, seed=3, draft=False)
    encoded = device_decode.EncodedImageDataset(index, SIZE, train=train, seed=3, draft=False)
    return (
        batches(cpu, loader.BatchToDevice(CPU), 0, epoch),
        batches(encoded, device_decode.DeviceDecoder(device, SIZE), workers, epoch),
    )


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize(("train", "epoch", "workers"), [(True, 0, 0), (True, 5, 2), (False, 0, 2)])
def test_the_device_path_gives_the_cpu_paths_crops_and_flips(sample_set, train, epoch, workers, device):
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    index = train_index.subset(np.arange(32))
    on_cpu, on_device = both_paths(index, train, epoch, workers, device)

    assert len(on_cpu) == len(on_device) == 4
    for (cpu_images, cpu_labels, _), (device_images, device_labels, bad) in zip(on_cpu, on_device, strict=True):
        assert device_images.shape == cpu_images.shape == (8, 3, SIZE, SIZE) and bad == []
        assert device_images.is_contiguous(memory_format=torch.channels_last)
        assert device_images.device.type == device.type
        assert torch.equal(cpu_labels, device_labels)
        assert_same_crops(device, device_images, cpu_images)
    # Another epoch draws other boxes: the comparison above can tell them apart.
    other_epoch = both_paths(index, train, epoch + 1, device=device)[1]
    if train:
        assert (levels(other_epoch[0][0].cpu()) - levels(on_device[0][0].cpu())).abs().max() > 50


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_prepared_copies_go_through_the_device_path_too(sample_set, tmp_path, device):
    prepared.prepare(str(sample_set), str(tmp_path / "prepared"), short_side=96, processes=1)
    _, train_index, _ = splits.load_splits(str(tmp_path / "prepared"), 0.1, 0)
    on_cpu, on_device = both_paths(train_index.subset(np.arange(16)), train=True, epoch=2, workers=2, device=device)

    for (cpu_images, _, _), (device_images, _, _) in zip(on_cpu, on_device, strict=True):
        assert_same_crops(device, device_images, cpu_images)


def odd_files(root, sample_set):
    """A class folder of files the device path must not decode itself, and a JPEG whose body is cut off."""
    source = next(sample_set.rglob("*.JPEG"))
    with Image.open(source) as opened:
        image = opened.convert("RGB")
    kinds = root / "train" / "odd"
    kinds.mkdir(parents=True)
    image.save(kinds / "a.png")
    image.save(kinds / "b.jpg", progressive=True, quality=90)
    image.convert("CMYK").save(kinds / "c.jpg", quality=90)
    image.convert("L").save(kinds / "d.jpg", quality=90)
    (kinds / "e.jpg").write_bytes(source.read_bytes()[:4000])  # a whole header, half a scan: only decoding fails
    (kinds / "f.jpg").write_bytes(b"not an image")
    shutil.copytree(source.parent, root / "train" / "plain")
    return folder.index_image_folder(str(root), 0.0, 0)[1]


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_files_the_device_does_not_decode_fall_back_and_unreadable_ones_are_reported(sample_set, tmp_path, device):
    index = odd_files(tmp_path / "data", sample_set)
    paths = [index.path(position) for position in range(len(index))]
    encoded = device_decode.EncodedImageDataset(index, SIZE, train=False, seed=0)
    samples = [encoded[(position, 0)] for position in range(len(index))]
    by_name = {path.rsplit("/", 1)[1]: sample for path, sample in zip(paths, samples, strict=True)}

    assert by_name["d.jpg"].data is not None  # grey baseline JPEGs: nvJPEG's
    assert all(by_name[name].pixels is not None for name in ("a.png", "b.jpg", "c.jpg"))  # decoded in the worker
    # Cut off before its end-of-image marker (nvJPEG would decode it without a word): the worker finds out.
    assert all(by_name[name].data is None and by_name[name].pixels is None for name in ("e.jpg", "f.jpg"))

    on_cpu, on_device = both_paths(index, train=False, epoch=0, device=device)
    cpu_images = torch.cat([images for images, _, _ in on_cpu])
    device_images = torch.cat([images.cpu() for images, _, _ in on_device])
    bad = sorted(paths[position] for _, _, unreadable in on_device for position in unreadable)
    assert bad == sorted(str(tmp_path / "data/train/odd" / name) for name in ("e.jpg", "f.jpg"))
    assert sorted(paths[p] for _, _, unreadable in on_cpu for p in unreadable) == bad
    assert device_images.shape == cpu_images.shape == (len(index) - 2, 3, SIZE, SIZE)
    assert_same_crops(device, device_images, cpu_images)


def test_a_file_the_device_refuses_goes_to_the_cpu_path_and_is_reported_when_that_fails_too(sample_set):
    whole = next(sample_set.rglob("*.JPEG")).read_bytes()
    with Image.open(next(sample_set.rglob("*.JPEG"))) as opened:
        box = (0, 0, *opened.size)
    samples = [
        device_decode.EncodedSample(data, box, False, None, label, position)
        for data, label, position in ((whole, 1, 10), (whole[:4000], 2, 11))
    ]
    batch, labels, _ = device_decode.EncodedImageDataset.collate(samples)
    step = device_decode.DeviceDecoder(CPU, SIZE)  # torchvision's CPU decoder refuses the cut-off file

    images, kept_labels = step(batch, labels)
    assert images.shape == (1, 3, SIZE, SIZE) and kept_labels.tolist() == [1] and step.take_unreadable() == [11]


def test_batches_decodes_the_next_batch_ahead_in_order_and_stops_when_the_caller_does(sample_set):
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    dataset = device_decode.EncodedImageDataset(train_index.subset(np.arange(24)), SIZE, train=True, seed=1)
    host_batches = [
        dataset.collate([dataset[(position, 0)] for position in range(start, start + 6)]) for start in range(0, 24, 6)
    ]
    step = device_decode.DeviceDecoder(CPU, SIZE)
    one_at_a_time = [step(batch, labels)[0] for batch, labels, _ in host_batches]
    taken = []

    def counted():
        for host_batch in host_batches:
            taken.append(host_batch)
            yield host_batch

    ahead = step.batches(counted())
    first, _, _ = next(ahead)
    deadline = time.monotonic() + 30
    while len(taken) < 2 and time.monotonic() < deadline:  # the thread takes the next batch meanwhile
        time.sleep(0.01)
    assert len(taken) == 2 and torch.equal(first, one_at_a_time[0])
    rest = [images for images, _, _ in ahead]
    assert len(rest) == 3 and all(map(torch.equal, rest, one_at_a_time[1:]))

    early = step.batches(host_batches)
    next(early)
    early.close()  # the caller stops (--max-steps, a signal): the thread ends with it
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("torchlab-decode")]


def test_batches_passes_on_a_loader_error(sample_set):
    def failing():
        raise OSError("the data went away")
        yield

    with pytest.raises(OSError, match="the data went away"):
        next(device_decode.DeviceDecoder(CPU, SIZE).batches(failing()))


def test_collate_keeps_each_sample_in_its_slot():
    pixels = np.full((SIZE, SIZE, 3), 7, dtype=np.uint8)
    samples = [
        device_decode.EncodedSample(b"\xff\xd8abc", (0, 0, 5, 5), True, None, 1, 10),
        device_decode.EncodedSample(None, (), False, None, 2, 11),  # unreadable
        device_decode.EncodedSample(None, (), False, pixels, 3, 12),
        device_decode.EncodedSample(b"xy", (1, 2, 3, 4), False, None, 4, 13),
    ]
    batch, labels, unreadable = device_decode.EncodedImageDataset.collate(samples)

    assert labels.tolist() == [1, 3, 4] and unreadable.tolist() == [11]
    assert batch.data.numpy().tobytes() == b"\xff\xd8abcxy" and batch.offsets.tolist() == [0, 5, 7]
    assert batch.slots.tolist() == [0, 2] and batch.flips.tolist() == [True, False]
    assert batch.boxes.tolist() == [[0, 0, 5, 5], [1, 2, 3, 4]]
    assert batch.pixel_slots.tolist() == [1] and torch.equal(batch.pixels[0], torch.from_numpy(pixels))
    assert batch.positions.tolist() == [10, 12, 13]


def test_auto_means_gpu_only_on_cuda_with_jpegs(sample_set, tmp_path):
    _, jpegs, _ = splits.load_splits(str(sample_set), 0.1, 0)
    pngs = tmp_path / "pngs" / "train" / "a"
    pngs.mkdir(parents=True)
    for number in range(4):
        Image.new("RGB", (20, 20)).save(pngs / f"{number}.png")
    png_index = folder.index_image_folder(str(tmp_path / "pngs"), 0.0, 0)[1]

    def decoder(asked, cuda, index):
        data = device_decode.plan_data(index, 32, 8)
        return plan.plan(plan.Asked(decode=asked), None, machine.Machine(2, None, 1, cuda), data).decode

    assert decoder("auto", True, jpegs) == "gpu"
    assert decoder("auto", True, png_index) == "cpu"
    assert decoder("auto", False, jpegs) == "cpu"
    assert decoder("cpu", True, jpegs) == "cpu"
    assert device_decode.mostly_jpegs(jpegs) and not device_decode.mostly_jpegs(png_index)


def test_train_py_decodes_on_the_cpu_without_cuda_and_saves_the_choice(sample_set, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible: --decode auto may mean gpu here")
    run_dir = tmp_path / "run"
    small = "--loader-only --batch-size 8 --workers 1 --image-size 32".split()
    result = run_train("--data", sample_set, "--run-dir", run_dir, *small, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "; --decode cpu (auto: no CUDA device);" in result.stdout
    assert "(1 decode threads, --decode cpu)" in result.stdout
    record = json.loads((run_dir / "config.json").read_text())
    assert (record["decode"], record["loader_plan"]["decode"]) == ("auto", "cpu")  # as asked, and as used


def test_decode_gpu_without_cuda_is_one_line_and_exit_2(sample_set, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible here")
    result = run_train("--data", sample_set, "--run-dir", tmp_path / "run", "--decode", "gpu", timeout=120)
    assert result.returncode == 2
    assert result.stderr == (
        "train.py: error: --decode gpu: needs a CUDA device, and this run is on the CPU (no CUDA device is "
        "visible: docker run --gpus all ...?); use --decode cpu or auto\n"
    )
    assert not (tmp_path / "run").exists()


def test_the_resolved_decoder_follows_the_flags(sample_set, tmp_path):
    argv = ["--data", str(sample_set), "--run-dir", str(tmp_path / "run"), "--device", "cpu"]
    processes = distributed.processes_from_environment()
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    for flags, expected in (([], "cpu"), (["--decode", "cpu"], "cpu")):
        cfg = config.parse_args([*argv, *flags])
        setup = resolve.resolve(cfg, processes)
        assert cfg.decode == ("auto" if not flags else "cpu")
        assert resolve.loader_plan(cfg, setup.device, train_index).decode == expected


def test_the_encoded_batch_budget_covers_large_files(sample_set):
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    encoded = device_decode.EncodedImageDataset(train_index, 16, train=True, seed=0)
    mean_file = np.mean([os.path.getsize(train_index.path(p)) for p in range(min(64, len(train_index)))])
    assert loader.dataset_batch_bytes(encoded, 8) == 8 * 2 * int(mean_file)  # files larger than 16x16x3 crops
    small = device_decode.EncodedImageDataset(train_index, 512, train=True, seed=0)
    assert loader.dataset_batch_bytes(small, 8) == loader.batch_bytes(8, 512)
