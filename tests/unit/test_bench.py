"""bench.py and bench_data.py: the same output from every pipeline, deterministic data, flat worker memory."""

import json

import numpy as np
import pytest
import torch
from PIL import Image, JpegImagePlugin

from torchlab.data import decode, folder, prepared
from torchlab.tools import bench, bench_data


@pytest.fixture(scope="module")
def bench_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench") / "images"
    bench_data.write_bench_data(str(root), images=12, processes=2)
    return root


def test_generated_images_are_deterministic_imagenet_like_jpegs(bench_set, tmp_path):
    files = sorted(path.relative_to(bench_set) for path in bench_set.rglob("*.JPEG"))
    assert len(files) == 12 + bench_data.CLASSES  # train/ and at least one val/ image per class

    for split, number in (("train", 0), ("train", 11), ("val", 3)):
        bench_data.write_image(str(tmp_path), 0, (split, number))  # again, elsewhere
    again = sorted(tmp_path.rglob("*.JPEG"))
    assert len(again) == 3
    assert all(path.read_bytes() == (bench_set / path.relative_to(tmp_path)).read_bytes() for path in again)
    for name in files:
        with Image.open(bench_set / name) as image:
            assert image.mode == "RGB" and JpegImagePlugin.get_sampling(image) == 0  # 4:4:4
            assert min(image.size) >= 300 and max(image.size) <= bench_data.LARGE_LONG_SIDE[1]
            assert np.asarray(image).std() > 20  # texture, not a flat colour
    mean_kb = np.mean([(bench_set / name).stat().st_size for name in files]) / 1000
    assert 80 < mean_kb < 150


def test_every_pipeline_gives_the_same_batch_shape_and_value_range_on_the_device(bench_set, tmp_path):
    prepared_root = tmp_path / "prepared"
    prepared.prepare(str(bench_set), str(prepared_root), processes=2)
    device = torch.device("cpu")
    pipelines = [
        bench.torchvision_pipeline("naive", str(bench_set / "train"), 4, device, workers=0),
        bench.torchvision_pipeline("classic", str(bench_set / "train"), 4, device, workers=2),
        bench.torchlab_pipeline("torchlab", str(bench_set), 4, device),
        bench.torchlab_pipeline("torchlab-prepared", str(prepared_root), 4, device),
    ]
    mean_and_std = list(zip(bench.loader.IMAGENET_MEAN, bench.loader.IMAGENET_STD, strict=True))
    lowest, highest = (
        min(-mean / std for mean, std in mean_and_std),
        max((1 - mean) / std for mean, std in mean_and_std),
    )
    for pipeline in pipelines:
        images, labels = pipeline.to_device(*next(iter(pipeline.data_loader))[:2])
        assert images.shape == (4, 3, 224, 224) and images.dtype == torch.float32, pipeline.name
        assert labels.shape == (4,) and labels.dtype == torch.int64, pipeline.name
        assert lowest - 1e-4 <= images.min() and images.max() <= highest + 1e-4, pipeline.name
        result = bench.measure_pass(pipeline, epoch=1, device=device, consumer_seconds=0.01)
        assert result["images_per_sec"] > 0 and 0 <= result["data_wait_frac"] <= 1, pipeline.name


def crop_statistics(boxes, width, height):
    areas = np.array([(right - left) * (bottom - top) / (width * height) for left, top, right, bottom in boxes])
    log_aspects = np.log([(right - left) / (bottom - top) for left, top, right, bottom in boxes])
    return areas, log_aspects


def test_torchlab_draws_the_same_crop_and_flip_distribution_as_torchvision(monkeypatch):
    """What ImageDataset asks the decoder for (box and flip), over many samples, against what the naive
    pipeline's torchvision transforms draw for the same image size."""
    width, height, samples = 640, 480, 4000
    drawn = []

    def record_crop(source, choose_box, size, flip=False, draft=True):
        drawn.append((choose_box(width, height), flip))
        return np.zeros((size, size, 3), dtype=np.uint8)

    monkeypatch.setattr(decode, "load_crop", record_crop)
    index = folder.SampleIndex(["image.jpg"] * samples, [0] * samples)
    dataset = decode.ImageDataset(index, 224, train=True, seed=0)
    for position in range(samples):
        dataset[(position, 0)]
    boxes, flips = zip(*drawn, strict=True)
    areas, log_aspects = crop_statistics(boxes, width, height)

    crop, horizontal_flip = bench.naive_transform(224).transforms[:2]
    torch.manual_seed(0)
    reference = []
    for _ in range(samples):
        top, left, box_height, box_width = crop.get_params(torch.zeros(3, height, width), crop.scale, crop.ratio)
        reference.append((left, top, left + box_width, top + box_height))
    reference_areas, reference_log_aspects = crop_statistics(reference, width, height)

    # Means within 4 standard errors of torchvision's; the same bounds; flips at torchvision's rate.
    for ours, theirs in ((areas, reference_areas), (log_aspects, reference_log_aspects)):
        assert abs(ours.mean() - theirs.mean()) < 4 * theirs.std() / np.sqrt(samples)
        assert ours.min() >= theirs.min() - 0.02 and ours.max() <= theirs.max() + 0.02
    assert abs(np.mean(flips) - horizontal_flip.p) < 4 * 0.5 / np.sqrt(samples)


def test_worker_memory_does_not_grow_per_epoch_with_a_million_samples(tmp_path):
    (tmp_path / prepared.DATA_FILE).write_bytes(b"\0")
    memory = bench.memory_measurements(str(tmp_path))
    assert memory["samples"] == 1_000_000
    assert memory["sample_index_mb_per_epoch"] < 20 and memory["prepared_index_mb_per_epoch"] < 20


def test_the_ready_rows_read_torchlabs_loaders_without_the_device_step(bench_set, tmp_path):
    prepared.prepare(str(bench_set), str(tmp_path / "prepared"), processes=2)
    pipelines, transports = bench.make_pipelines(str(bench_set), str(tmp_path / "prepared"), 4, torch.device("cpu"), 2)
    for name in ("torchlab", "torchlab-prepared"):
        ready = transports[name + bench.READY_SUFFIX]
        assert ready.data_loader is pipelines[name].data_loader
        images, labels = ready.to_device(*next(iter(ready.data_loader))[:2])
        assert images.dtype == torch.uint8 and images.shape == (4, 224, 224, 3) and len(labels) == 4


def test_a_whole_run_measures_every_row_and_writes_its_report(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        folders = ["--cache-dir", str(tmp_path / "cache"), "--out-dir", str(tmp_path / "out")]
        bench.main([*folders, *"--images 24 --repetitions 1 --batch-size 4 --device cpu".split()])
    finally:
        torch.set_num_threads(threads)  # main runs this process on one thread, as the bench does
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = ["naive", "classic", "torchlab", "torchlab-prepared", "torchlab-threads", "torchlab-threads-prepared"]
    assert set(report["pipelines"]) == {*rows, "own-create_loader", "own-DataLoader"}
    for name, row in report["pipelines"].items():
        assert row["images_per_sec"] > 0 and 0 <= row["data_wait_frac"] <= 1, name
    assert report["pipelines"]["torchlab"]["ready_images_per_sec"] > 0
    threads = report["pipelines"]["torchlab-threads"]
    assert threads["ready_images_per_sec"] > 0 and threads["loader"] == "threads"
    assert "collate" not in report["stages"]["torchlab-threads"]["ms_per_image"]  # written in place
    own = report["pipelines"]["own-create_loader"], report["pipelines"]["own-DataLoader"]
    assert [row["loader"] for row in own] == ["threads", "processes"]  # create_loader's plan; the hand-set one
    assert own[1]["workers"] == report["pipelines"]["classic"]["workers"]  # the seed's settings
    memory = report["loader_memory"]  # each loader in a fresh process, with as many workers as threads
    assert [memory[name]["loader"] for name in ("torchlab", "torchlab-threads")] == ["processes", "threads"]
    assert memory["torchlab"]["workers"] == memory["torchlab-threads"]["workers"] > 0
    assert all(row["rss_mb"] > 0 for row in memory.values())
    assert all(rate > 0 for rate in report["ceilings"].values()), report["ceilings"]
    assert (tmp_path / "out" / "bench.png").stat().st_size > 0
    gil = report["gil"]
    assert list(gil["loader_samples_per_sec"]) == ["2", "8", "32", "64"] and gil["loader_gil_seconds"] > 0
    assert 0 < gil["decode"]["gil_seconds_per_sample"] < gil["decode"]["seconds_per_sample"]
    predicted = gil["predicted_images_per_sec"]
    assert list(predicted) == ["8", "16", "32", "64"] and all(
        0 < row["threads"] <= row["processes"] for row in predicted.values()
    )
    out = capsys.readouterr().out
    assert "torchlab / decode-only ceiling" in out and "predicted images/s by CPUs (threads / processes)" in out


def test_the_gpu_decode_row_is_measured_as_the_others(bench_set, tmp_path):
    # On a CPU device DeviceDecoder decodes with torchvision's CPU decoder: the row's machinery, a dry run.
    prepared.prepare(str(bench_set), str(tmp_path / "prepared"), processes=2)
    folders = str(bench_set), str(tmp_path / "prepared"), str(tmp_path / "out")
    cpu = torch.device("cpu")
    bench.run_bench(*folders, batch_size=4, repetitions=1, device=cpu, print_line=lambda line: None, gpu_decode=True)
    row = json.loads((tmp_path / "out" / "bench.json").read_text())["pipelines"][bench.GPU_DECODE]
    assert row["images_per_sec"] > 0 and row["ready_images_per_sec"] > 0 and 0 <= row["data_wait_frac"] <= 1
    assert row["limit"] in ("read file + augmentation draw", "collate", "transfer", "device step")


def test_data_without_a_train_folder_is_benchmarked_as_train_py_reads_it(tmp_path):
    root = tmp_path / "images"
    for label in range(2):
        (root / f"class_{label}").mkdir(parents=True)
        for number in range(4):
            Image.new("RGB", (64, 48), (60 * label, 40 * number, 90)).save(root / f"class_{label}" / f"{number}.jpg")
    (root / ".ipynb_checkpoints").mkdir()  # Jupyter's: a class to torchvision, with no images
    prepared.prepare(str(root), str(tmp_path / "prepared"), processes=2)
    pipelines, _ = bench.make_pipelines(str(root), str(tmp_path / "prepared"), 4, torch.device("cpu"), 2)
    for name in ("naive", "classic"):
        assert len(pipelines[name].data_loader.dataset) == 8, name
        images, labels = next(iter(pipelines[name].data_loader))
        assert images.shape == (4, 3, 224, 224), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: --device cuda is valid here")
def test_device_cuda_without_a_gpu_is_one_line_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cuda", "--cache-dir", str(tmp_path / "cache")])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err
        == "torchlab bench: error: --device cuda: no CUDA device is visible (docker run --gpus all ...?)\n"
    )
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--images", "5"), "argument --images: expected an integer >= 10, got '5'"),
        (("--cache-dir", "{file}/cache"), "--cache-dir {file}/cache: {file} is a file, not a folder"),
        (("--out-dir", "{file}/out"), "--out-dir {file}/out: {file} is a file, not a folder"),
        (("--data", "{tiny}", "--batch-size", "4"), "{tiny}: 3 training images, fewer than one batch (--batch-size 4)"),
        (
            ("--data", "{bad}", "--batch-size", "4", "--repetitions", "1"),
            "--data {bad}: the reference loaders (naive, classic, decode-only) stop at an unreadable image",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, flags, message):
    (tmp_path / "file").write_bytes(b"")
    for number in range(3):
        (tmp_path / "tiny" / "cat").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32)).save(tmp_path / "tiny" / "cat" / f"{number}.jpg")
    for name in ("cat", "dog"):
        (tmp_path / "bad" / name).mkdir(parents=True)
        for number in range(6):
            Image.new("RGB", (32, 32)).save(tmp_path / "bad" / name / f"{number}.jpg")
    (tmp_path / "bad" / "dog" / "text.jpg").write_text("not a JPEG")
    paths = {"file": tmp_path / "file", "tiny": tmp_path / "tiny", "bad": tmp_path / "bad"}
    threads = torch.get_num_threads()
    with pytest.raises(SystemExit) as exit_info:
        folders = ["--cache-dir", str(tmp_path / "cache"), "--out-dir", str(tmp_path / "out")]
        bench.main([*folders, "--device", "cpu", *(flag.format(**paths) for flag in flags)])
    torch.set_num_threads(threads)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"torchlab bench: error: {message.format(**paths)}"), err
