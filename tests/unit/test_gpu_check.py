"""torchlab gpu-check: the script `make gpu-check` runs on a GPU host, tried here as a dry run on the CPU (the
"gpu" decoder then runs torchvision's CPU decoder), so that it does not first break on the GPU machine."""

import json
import math
import subprocess

import numpy as np
import pytest
import torch

from conftest import TRAIN_ENV, torchlab_command
from torchlab import machine
from torchlab.data import decode
from torchlab.tools import bench_data, gpu_check


def test_the_dry_run_reports_every_figure(tmp_path):
    out_dir = tmp_path / "out"
    small = "--device cpu --images 24 --batch-size 8 --steps 4 --arch mobilenet_v3_small --samples 8".split()
    command = torchlab_command("gpu-check", *small, "--cache-dir", tmp_path / "cache", "--out-dir", out_dir)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=TRAIN_ENV, check=False)
    assert result.returncode == 0, result.stderr[-2000:]

    report = json.loads((out_dir / "gpu_check.json").read_text())
    assert set(report["decode"]) == {
        f"{source} --decode {decoder}" for source in ("raw", "prepared") for decoder in ("cpu", "gpu")
    }
    assert all(rate > 0 for rate in report["decode"].values())
    counts = sorted({1, 2, 4, 8, machine.usable_cpu_count()} & set(range(1, machine.usable_cpu_count() + 1)))
    assert set(report["scaling"]) == {
        f"{loader_choice} --decode {decoder}"
        for loader_choice in ("threads", "processes")
        for decoder in ("cpu", "gpu")
    }
    assert all(list(map(int, rates)) == counts and min(rates.values()) > 0 for rates in report["scaling"].values())
    # The GIL model's prediction beside them, from the one-thread rate: equal at one CPU, never threads above.
    predicted = report["predicted"]
    assert list(map(int, predicted)) == counts
    one_thread = report["scaling"]["threads --decode cpu"]["1"]
    assert predicted["1"]["processes"] == pytest.approx(one_thread) == pytest.approx(predicted["1"]["threads"])
    assert all(0 < rates["threads"] <= rates["processes"] for rates in predicted.values())
    assert "scaling predicted by pipeline/gil.py" in result.stdout
    assert set(report["model_only"]) == {"--compile off"} and report["model_only"]["--compile off"] > 0
    # train.py refuses --decode gpu without CUDA, and --compile is left to a GPU host
    assert set(report["training"]) == {"threads --decode cpu", "processes --decode cpu"}
    for name, run in report["training"].items():
        assert run["images_per_sec"] > 0 and 0 <= run["data_wait_frac"] < 1
        share = report["share_of_ceiling"][name]
        assert share == pytest.approx(run["images_per_sec"] / report["model_only"]["--compile off"])
    # Same boxes and flips: the paths differ only by JPEG draft decoding (CPU) against full-size decoding.
    assert report["agreement"]["samples"] == 8 and report["agreement"]["min_db"] > 30
    # It names the CPU path's decoder: the region decoder where the package was built with it, as in the image.
    assert report["cpu_decoder"] == ("region decoder (torchlab_jpeg)" if decode.torchlab_jpeg else "Pillow")
    assert report["versions"]["torch"] == torch.__version__
    # The doctor's flavour row: this torch's build against the GPUs it sees (none here).
    assert report["flavour"]["name"] == "flavour" and "no GPU seen to check against" in report["flavour"]["detail"]
    assert f"  flavour ({report['flavour']['status']}): " in result.stdout
    assert "GPU vs CPU crops: PSNR min" in result.stdout and "the CPU (dry run)" in result.stdout


def test_without_cuda_it_says_so_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible here")
    result = subprocess.run(torchlab_command("gpu-check"), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert result.stderr == (
        "torchlab gpu-check: error: no CUDA device is visible (docker run --gpus all ...?); --device cpu is a dry run\n"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--images", "20", "--batch-size", "32"), "--images 20: fewer than one batch (--batch-size 32)"),
        (("--out-dir", "{file}/out"), "--out-dir {file}/out: {file} is a file, not a folder"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, flags, message):
    (tmp_path / "file").write_bytes(b"")
    flags = [flag.format(file=tmp_path / "file") for flag in flags]
    command = torchlab_command("gpu-check", "--device", "cpu", "--cache-dir", str(tmp_path / "cache"), *flags)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"torchlab gpu-check: error: {message.format(file=tmp_path / 'file')}")
    assert not (tmp_path / "cache" / "images-20").exists()  # nothing generated


def test_psnr_of_known_differences():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    assert gpu_check.psnr(image, image.copy()) == math.inf
    one_level = np.full((8, 8, 3), 100, dtype=np.uint8)
    assert gpu_check.psnr(one_level + 1, one_level) == pytest.approx(20 * math.log10(255), abs=1e-9)  # 48.13
    assert gpu_check.psnr(one_level, one_level + 1) == pytest.approx(48.13, abs=0.01)  # no uint8 wrap-around
    assert gpu_check.psnr(np.zeros_like(one_level), np.full_like(one_level, 255)) == pytest.approx(0.0)
    photo = bench_data.natural_image(rng, (96, 80))
    assert gpu_check.psnr(np.roll(photo, 3, axis=1), photo) < 35  # a shifted photo is far from itself
