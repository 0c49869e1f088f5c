"""Whether a torch build runs on the GPUs and driver it sees, and which flavour to use where it does not: with the
flavour table the repository holds and fake capabilities, drivers and arch flags (there is no GPU here)."""

import os

import pytest
import torch

from conftest import ROOT
from torchlab import environment, flavour
from torchlab.tools import doctor

TABLE = str(ROOT / "buildtools/flavours.tsv")
FLAVOURS = flavour.read_flavours(TABLE)
# What torch._C._cuda_getArchFlags() says, seen here, of each flavour's torch: 2.5.1 (PyPI's, CUDA 12.4) and
# 2.15.0 (CUDA 13.2). Neither ships PTX; PTX_FLAGS is a build that does.
COMPAT_FLAGS = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"
CURRENT_FLAGS = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
PTX_FLAGS = "sm_80 sm_90 compute_90"


def test_the_table_holds_both_flavours_with_their_ranges():
    by_name = {f.name: f for f in FLAVOURS}
    assert list(by_name) == ["compat", "current"]
    assert by_name["compat"].cuda == (11, 8) and by_name["compat"].highest == (9, 0)
    assert by_name["current"].cuda[0] >= 12 and by_name["current"].highest >= (10, 0)


def test_arch_flags_parse_into_kernels_and_ptx():
    kernels, ptx = flavour.build_targets("sm_80 sm_90a sm_100f sm_120 compute_120")
    assert kernels == {(8, 0), (9, 0), (10, 0), (12, 0)} and ptx == {(12, 0)}


@pytest.mark.parametrize(
    ("capability", "flags", "runs"),
    [
        ((9, 0), COMPAT_FLAGS, "kernels"),
        ((8, 9), COMPAT_FLAGS, "kernels"),  # an RTX 40 runs sm_86's kernels
        ((10, 0), PTX_FLAGS, "ptx"),  # a B200: compute_90 compiled at first use
        ((10, 0), COMPAT_FLAGS, None),
        ((12, 0), CURRENT_FLAGS, "kernels"),
        ((7, 0), CURRENT_FLAGS, None),  # a V100: CUDA 13 has no Volta
        ((6, 1), "sm_80 sm_90", None),
    ],
)
def test_a_build_runs_on_a_device_by_kernels_or_ptx(capability, flags, runs):
    assert flavour.build_runs_on(capability, *flavour.build_targets(flags)) == runs


def test_an_rtx_5090_on_the_compat_flavour_is_told_to_use_current():
    problems, notes, fix = flavour.fit([(12, 0)], "sm_50 sm_90", (11, 8), (13, 2), FLAVOURS, "compat")
    assert problems == ["gpu 0 (sm_120) has no kernels in this build"] and notes == []
    assert fix.startswith("use the current flavour instead (make build FLAVOUR=current: CUDA 13.2, ")
    # With a driver for CUDA 12.8, the current flavour needs a newer one first.
    _, _, fix = flavour.fit([(12, 0)], "sm_50 sm_90", (11, 8), (12, 8), FLAVOURS, "compat")
    assert fix == (
        "update the host's NVIDIA driver to >= 580 (CUDA 13), then use the current flavour (make build FLAVOUR=current)"
    )


def test_a_v100_on_the_current_flavour_is_told_to_use_compat():
    problems, _, fix = flavour.fit([(8, 0), (7, 0)], CURRENT_FLAGS, (13, 2), (13, 2), FLAVOURS, "current")
    assert problems == ["gpu 1 (sm_70) has no kernels in this build"]
    assert fix.startswith("use the compat flavour instead (make build FLAVOUR=compat: CUDA 11.8, ")


def test_an_old_driver_under_the_current_flavour_is_told_to_use_compat():
    problems, _, fix = flavour.fit([(9, 0)], CURRENT_FLAGS, (13, 2), (12, 4), FLAVOURS, "current")
    assert problems == ["the driver supports CUDA 12.4, this build needs CUDA 13.x"]
    assert "FLAVOUR=compat" in fix


def test_a_driver_too_old_for_every_flavour_is_told_to_update_it():
    _, _, fix = flavour.fit([(9, 0)], CURRENT_FLAGS, (13, 2), (10, 2), FLAVOURS, "current")
    assert fix == "update the host's NVIDIA driver to >= 580 (CUDA 13)"


def test_a_gpu_no_flavour_has_kernels_for_says_so():
    _, _, fix = flavour.fit([(3, 7)], CURRENT_FLAGS, (13, 2), (13, 2), FLAVOURS, "current")
    assert fix == "no flavour of this image has kernels for these GPUs"


def test_a_device_that_only_runs_ptx_is_a_note_with_the_better_flavour():
    problems, notes, fix = flavour.fit([(10, 0)], PTX_FLAGS, (11, 8), (13, 0), FLAVOURS, "compat")
    assert problems == [] and notes == ["gpu 0 (sm_100) runs PTX compiled at first use (slow start)"]
    assert "FLAVOUR=current" in fix


def test_a_fitting_build_has_nothing_to_say():
    assert flavour.fit([(9, 0), (8, 6)], COMPAT_FLAGS, (11, 8), (12, 4), FLAVOURS, "compat") == ([], [], "")


def test_the_doctor_row_names_the_flavour_and_checks_what_torch_sees(monkeypatch):
    """The doctor's row, with torch's answers replaced by an H100-less host's: an RTX 5090 and a 12.8 driver."""
    monkeypatch.setattr(doctor.environment, "image", lambda: {"flavour": "compat"})
    monkeypatch.setattr(doctor.torch.version, "cuda", "11.8")
    monkeypatch.setattr(doctor.torch._C, "_cuda_getArchFlags", lambda: COMPAT_FLAGS)
    monkeypatch.setattr(doctor, "driver_cuda_version", lambda: (12, 8))
    monkeypatch.setattr(doctor, "gpu_capabilities", lambda: [(12, 0)])
    check = doctor.check_flavour(TABLE)
    assert check.status == doctor.FAIL
    assert check.detail.startswith(f"compat: torch {torch.__version__} for CUDA 11.8, built for sm_50 ")
    assert check.detail.endswith(
        "GPUs of compute 12.0, driver's CUDA 12.8: gpu 0 (sm_120) has no kernels in this build"
    )
    assert "then use the current flavour (make build FLAVOUR=current)" in check.fix and "\n" not in check.fix


def test_the_doctor_row_here_names_this_images_flavour():
    """On this machine (no GPU): the flavour from the image's labels, and nothing to check against."""
    check = doctor.check_flavour(TABLE)
    assert check.status == doctor.OK
    if torch.version.cuda is not None:
        assert check.detail.endswith("no GPU seen to check against")
    assert check.detail.startswith(flavour.this_flavour(doctor.environment.image()) + ": ")


def test_every_runs_environment_record_names_the_images_flavour():
    """The record's `image` part is the image's labels (environment.image()), the flavour among them."""
    if not os.path.exists(environment.IMAGE_FILE):
        pytest.skip(f"outside the image: no {environment.IMAGE_FILE}")
    assert environment.image()["flavour"] == os.environ["TORCHLAB_FLAVOUR"] in {f.name for f in FLAVOURS}
