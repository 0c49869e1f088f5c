"""benchmarks/resize.py: its reference, torch's resize against Pillow's, and resizers it cannot measure."""

import json
import sys

import numpy as np
import pytest
import torch

from benchmarks import resize as bench_resize


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A short run with what the image has (Pillow, torch): OpenCV hidden, --pillow-simd a folder with no PIL
    in it, so that the child process finds the image's own Pillow."""
    out_dir = tmp_path_factory.mktemp("bench-resize")
    not_simd = tmp_path_factory.mktemp("not-simd")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "cv2", None)  # `import cv2` raises ImportError
        bench_resize.main(
            [
                "--crops",
                "6",
                "--images",
                "1",
                "--passes",
                "1",
                "--pillow-simd",
                str(not_simd),
                "--out-dir",
                str(out_dir),
            ]
        )
    torch.set_num_threads(threads)
    return json.loads((out_dir / bench_resize.RESULT_FILE).read_text())


def test_resizers_give_size_x_size_rgb():
    crop = bench_resize.draw_crops(465, 384, crops=1, images=1, seed=0)[0]
    for resize in (bench_resize.pillow_resize, bench_resize.torch_resize):
        resized = resize(crop, 64)
        assert resized.shape == (64, 64, 3) and resized.dtype == np.uint8


def test_the_reference_is_pillow_and_torch_is_within_40_db_of_it(report):
    rows = report["resizers"]
    assert list(rows)[0] == bench_resize.REFERENCE == "pillow"
    reference = rows["pillow"]
    assert reference["available"] and reference["reference"] and reference["verdict"] == "reference"
    assert "reducing_gap=3.0" in reference["method"]
    assert reference["psnr_db"] == {"min": None, "median": None}  # identical to itself
    torch_row = rows["torch"]
    assert torch_row["available"] and not torch_row["reference"]
    assert torch_row["psnr_db"]["min"] >= bench_resize.REQUIRED_PSNR_DB == 40
    assert torch_row["psnr_db"]["median"] >= torch_row["psnr_db"]["min"]
    assert set(torch_row["psnr_db_by_size"]) == set(torch_row["ms_per_image"]) == set(bench_resize.IMAGE_SIZES)
    assert all(ms > 0 for ms in torch_row["ms_per_image"].values())


def test_resizers_that_cannot_be_measured_are_listed_with_the_reason(report):
    rows = report["resizers"]
    assert set(rows) == {"pillow", "torch", "opencv", "pillow-simd"}
    assert rows["opencv"]["available"] is False
    assert "cv2 does not import" in rows["opencv"]["reason"]
    assert rows["pillow-simd"]["available"] is False
    assert "not Pillow-SIMD" in rows["pillow-simd"]["reason"] and "PIL is Pillow" in rows["pillow-simd"]["reason"]


def test_not_asked_for_pillow_simd_and_a_missing_folder(tmp_path, capsys):
    with pytest.raises(bench_resize.Unavailable, match="not asked for"):
        bench_resize.pillow_simd_resizer(None, {}, 224, 1)
    with pytest.raises(SystemExit) as exit_info:
        bench_resize.main(["--pillow-simd", str(tmp_path / "absent")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--pillow-simd" in error and "not a folder" in error
