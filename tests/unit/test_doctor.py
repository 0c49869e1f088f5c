"""doctor.py: each check's ok / warn / fail on real small inputs, the report's forms, and the exit status."""

import json
import os
import shutil
import subprocess

import pytest
import torch

from conftest import ROOT, torchlab_command
from torchlab import config, machine
from torchlab.data import prepared, splits
from torchlab.pipeline import device_decode, loader, plan
from torchlab.tools import doctor

MIB = 2**20
BATCH_BYTES = 64 * 224 * 224 * 3  # train.py's default batch: 64 uint8 images of 224 x 224 x 3
AUTO_WORKERS = plan.planned_workers("auto", None, machine.probe(), {})  # the plan's, for one process


def run_doctor(*args):
    command = torchlab_command("doctor", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


# ---------------------------------------------------------------- data
def test_a_missing_data_folder_fails_with_the_mount_to_add(tmp_path):
    check = doctor.check_data(str(tmp_path / "missing"), batch_size=64, val_fraction=0.1, seed=0)
    assert check.status == doctor.FAIL
    assert "no such folder" in check.detail
    assert f"-v /path/to/images:{tmp_path / 'missing'}" in check.fix


def test_a_file_or_an_empty_folder_is_no_data(tmp_path):
    (tmp_path / "file").write_text("not images")
    assert doctor.check_data(str(tmp_path / "file"), 64, 0.1, 0).status == doctor.FAIL
    (tmp_path / "empty").mkdir()
    check = doctor.check_data(str(tmp_path / "empty"), 64, 0.1, 0)
    assert check.status == doctor.FAIL
    assert "no class folders" in check.detail


def test_train_and_val_folders_are_counted(sample_set):
    check = doctor.check_data(str(sample_set), batch_size=16, val_fraction=0.1, seed=0)
    assert check.status == doctor.OK, check
    assert check.facts["layout"] == "train_val"
    assert check.facts["classes"] == ["class_00", "class_01", "class_02", "class_03"]
    assert (check.facts["train_images"], check.facts["val_images"]) == (96, 24)
    assert "train/ and val/; 4 classes (class_00, class_01, class_02, class_03); 96 training and 24 validation" in (
        check.detail
    )


def test_one_folder_of_classes_holds_out_the_val_fraction(sample_set, tmp_path):
    single = tmp_path / "single"
    shutil.copytree(sample_set / "train", single)
    check = doctor.check_data(str(single), batch_size=16, val_fraction=0.25, seed=0)
    assert check.status == doctor.OK, check
    assert check.facts["layout"] == "single"
    assert (check.facts["train_images"], check.facts["val_images"]) == (72, 24)
    assert "25% held out" in check.detail


def test_a_prepared_copy_and_a_lone_train_folder_are_described_as_they_are_split(sample_set, tmp_path):
    prepared.prepare(str(sample_set), str(tmp_path / "prepared"), processes=2)
    check = doctor.check_data(str(tmp_path / "prepared"), batch_size=16, val_fraction=0.25, seed=0)
    assert check.status == doctor.OK and check.facts["layout"] == "prepared", check
    assert (check.facts["train_images"], check.facts["val_images"]) == (96, 24)  # its own splits: nothing held out
    assert "a prepared copy" in check.detail and "held out" not in check.detail
    shutil.copytree(sample_set / "train", tmp_path / "train_only" / "train")
    check = doctor.check_data(str(tmp_path / "train_only"), batch_size=16, val_fraction=0.25, seed=0)
    assert check.facts["layout"] == "train" and (check.facts["train_images"], check.facts["val_images"]) == (72, 24)
    assert "train/, 25% of it held out for val" in check.detail


def test_fewer_images_than_one_batch_fail_and_one_class_warns(sample_set, tmp_path):
    check = doctor.check_data(str(sample_set), batch_size=97, val_fraction=0.1, seed=0)
    assert check.status == doctor.FAIL
    assert "--batch-size to 96" in check.fix
    one_class = tmp_path / "one"
    shutil.copytree(sample_set / "train" / "class_00", one_class / "class_00")
    check = doctor.check_data(str(one_class), batch_size=8, val_fraction=0.1, seed=0)
    assert check.status == doctor.WARN
    assert "two class folders" in check.fix


def test_a_class_folder_named_train_is_a_class_as_train_py_reads_it(sample_set, tmp_path):
    shutil.copytree(sample_set / "train" / "class_00", tmp_path / "voc" / "dog")
    shutil.copytree(sample_set / "train" / "class_01", tmp_path / "voc" / "train")
    check = doctor.check_data(str(tmp_path / "voc"), batch_size=8, val_fraction=0.25, seed=0)
    assert check.status == doctor.OK, check
    assert (check.facts["layout"], check.facts["classes"]) == ("single", ["dog", "train"])


def test_a_symlink_loop_is_skipped_or_named_with_its_own_fix(sample_set, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(sample_set / "train", data)
    (data / "class_00" / "up").symlink_to("..")  # back to a folder being walked: not followed
    check = doctor.check_data(str(data), batch_size=8, val_fraction=0.25, seed=0)
    assert check.status == doctor.OK and check.facts["train_images"] + check.facts["val_images"] == 96, check
    (data / "class_00" / "x.jpg").symlink_to("x.jpg")
    check = doctor.check_data(str(data), batch_size=8, val_fraction=0.25, seed=0)
    assert check.status == doctor.FAIL
    assert (check.detail, check.fix) == (f"{data}/class_00/x.jpg: a symlink loop", "remove the link")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder")
def test_an_unreadable_sub_folder_fails_with_the_chmod_fix(sample_set, tmp_path):
    shutil.copytree(sample_set / "train", tmp_path / "data")
    (tmp_path / "data" / "class_00" / "secret").mkdir(mode=0)
    try:
        check = doctor.check_data(str(tmp_path / "data"), batch_size=8, val_fraction=0.25, seed=0)
    finally:
        (tmp_path / "data" / "class_00" / "secret").chmod(0o755)
    assert check.status == doctor.FAIL
    assert check.detail == f"{tmp_path}/data/class_00/secret: not readable by UID {os.getuid()}"
    assert check.fix == "on the host: chmod -R a+rX on that folder"


# ---------------------------------------------------------------- /dev/shm
def shm_row(shm, workers, prefetch_factor, batch_size=64, processes=1):
    """The doctor's /dev/shm row for --loader processes with these flags, from the plan train.py makes."""
    asked = plan.Asked(loader="processes", workers=workers, prefetch_factor=prefetch_factor, batch_size=batch_size)
    here = machine.Machine(64, None if shm is None else shm[1], processes)
    try:
        outcome = plan.plan(asked, None, here, plan.Data(batch_bytes={"cpu": batch_size * 224 * 224 * 3}))
    except plan.SharedMemoryError as error:
        outcome = error
    return doctor.check_shared_memory(shm, outcome, processes)


def test_shared_memory_smaller_than_the_batches_asked_for_warns_with_what_the_loader_uses():
    needed = (2 * 4 + 2) * BATCH_BYTES  # in flight, and the two batches the training process holds
    check = shm_row((64 * MIB, 64 * MIB), 2, prefetch_factor=4)
    assert needed > 64 * MIB
    assert check.status == doctor.WARN
    assert check.facts["needed"] == needed
    assert (check.facts["workers"], check.facts["prefetch_factor"]) == (2, 2)
    assert "train.py's loader is lowered from 2 x 4: /dev/shm has 67 MB free" in check.detail
    assert "--shm-size=8g" in check.fix


def test_shared_memory_too_small_for_one_workers_batches_fails():
    check = shm_row((64 * MIB, 10 * MIB), 2, prefetch_factor=4)
    assert check.status == doctor.FAIL
    assert "not enough for one loader worker's batches" in check.detail and "train.py stops" in check.detail


def test_shared_memory_with_little_room_warns_and_with_room_is_ok():
    needed = (2 * 4 + 2) * BATCH_BYTES
    tight = shm_row((needed + MIB, needed + MIB), 2, 4)
    assert tight.status == doctor.WARN and "little room left" in tight.detail
    roomy = shm_row((8 * 2**30, 8 * 2**30), 2, 4)
    assert roomy.status == doctor.OK
    assert roomy.fix == ""


def test_shared_memory_counts_free_space_processes_and_no_workers():
    size = 8 * 2**30
    assert shm_row((size, 10 * MIB), 2, 4).status == doctor.FAIL
    eight_processes = shm_row((size, size), 8, 4, batch_size=256, processes=8)
    assert eight_processes.facts["needed"] == 8 * (8 * 4 + 2) * 256 * 224 * 224 * 3  # 9.8 GiB > 8 GiB
    assert eight_processes.status == doctor.WARN
    assert "--shm-size=20g" in eight_processes.fix  # twice the 9.8 GiB, rounded up
    assert shm_row((64 * MIB, 64 * MIB), 0, 4).status == doctor.OK
    assert shm_row(None, 2, 4).status == doctor.FAIL


def test_the_real_dev_shm_is_read():
    size, free = machine.shared_memory_bytes()
    assert size == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
    assert 0 <= free <= size
    assert machine.shared_memory_bytes("/no/such/folder") is None


# ---------------------------------------------------------------- CPUs and the run dir
def test_more_workers_than_usable_cpus_warn_with_a_count_that_fits():
    usable = machine.usable_cpu_count()
    check = doctor.check_cpus(workers=usable + 1)
    assert check.status == doctor.WARN
    assert f"--workers {usable}" in check.fix
    assert check.facts["usable"] == usable


def test_the_cgroup_quota_caps_the_usable_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # docker run --cpus=0.5
    check = doctor.check_cpus(workers=1, cgroup_root=str(tmp_path))
    assert check.facts["usable"] == 1
    assert check.facts["quota"] == 0.5
    assert "cgroup CPU quota 0.5" in check.detail
    assert check.status == doctor.WARN  # one CPU decodes slowly


def test_a_writable_run_dir_with_room_passes_and_a_full_one_fails(tmp_path):
    run_dir = tmp_path / "runs" / "first"  # not made yet: its nearest existing folder counts
    check = doctor.check_run_dir(str(run_dir), fail_below=0, warn_below=0)
    assert check.status in (doctor.OK, doctor.WARN)
    assert check.facts["path"] == str(run_dir)
    assert check.facts["free"] == shutil.disk_usage(tmp_path).free
    if check.status == doctor.WARN:  # tmp_path in the container's own file system
        assert not check.facts["persistent"]
        assert "-v" in check.fix
    full = doctor.check_run_dir(str(run_dir), fail_below=2**62)
    assert full.status == doctor.FAIL
    assert "free disk space" in full.fix


def test_a_run_dir_under_a_file_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    check = doctor.check_run_dir(str(tmp_path / "file" / "run"))
    assert check.status == doctor.FAIL
    assert "cannot be written" in check.detail


def test_mount_of_finds_the_longest_mount_point(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "1 0 0:1 / / rw,relatime - overlay overlay rw\n"
        "2 1 0:2 / /data ro,relatime - ext4 /dev/sda1 rw\n"
        "3 1 0:3 / /work\\040space rw - xfs /dev/sdb rw\n"
    )
    assert doctor.mount_of("/data/train", str(mountinfo)) == ("/data", "ext4", True)
    assert doctor.mount_of("/database", str(mountinfo)) == ("/", "overlay", False)
    assert doctor.mount_of("/work space/x", str(mountinfo)) == ("/work space", "xfs", False)
    assert doctor.in_container_layer(doctor.mount_of("/tmp", str(mountinfo)))
    assert doctor.mount_of("/data", str(tmp_path / "none")) is None


# ---------------------------------------------------------------- software and GPUs
def test_versions_and_the_torch_build_are_reported(tmp_path):
    check = doctor.check_torch(str(ROOT / "environment.yml"))
    assert doctor.pinned_version("pytorch", str(ROOT / "environment.yml")) == torch.__version__.split("+")[0]
    assert check.status == doctor.OK
    assert torch.__version__ in check.detail
    if torch.version.cuda:
        assert f"CUDA {torch.version.cuda}" in check.detail
    assert doctor.check_package("torchvision").status == doctor.OK
    assert doctor.check_package("no_such_package_here").status == doctor.FAIL
    assert doctor.cudnn_version_text(8902) == "8.9.2"
    assert doctor.cudnn_version_text(90100) == "9.1.0"


def test_a_torch_other_than_the_pinned_one_fails(tmp_path):
    spec = tmp_path / "environment.yml"
    spec.write_text("dependencies:\n  - python=3.10.15\n  - pytorch=1.0.0\n")
    check = doctor.check_torch(str(spec))
    assert check.status == doctor.FAIL
    assert "the image pins 1.0.0" in check.detail and "pip uninstall" in check.fix
    assert doctor.check_torch(str(tmp_path / "absent.yml")).status == doctor.OK  # outside the image: no pins


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the no-GPU case cannot be seen here")
def test_no_gpu_is_a_warning_with_the_docker_flag():
    (check,) = doctor.check_gpus()
    assert check.status == doctor.WARN
    assert "--gpus all" in check.fix


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_each_gpu_multiplies_correctly():
    checks = doctor.check_gpus()
    assert len(checks) == torch.cuda.device_count()
    assert all(check.status != doctor.FAIL for check in checks), checks
    assert all(check.facts["matmul_error"] < doctor.MATMUL_TOLERANCE for check in checks)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is visible: the decoder may be the GPU")
def test_the_decoder_row_says_where_train_py_decodes(sample_set, tmp_path):
    report = doctor.run_checks(str(sample_set), workers=2, run_dir=str(tmp_path / "run"), autotune_file=os.devnull)
    decoder = next(check for check in report if check.name == "decoder")
    assert (decoder.status, decoder.facts["decode"]) == (doctor.OK, "cpu")
    assert decoder.detail == "cpu: decoded by the 2 decode threads: no CUDA device"

    asked_gpu = doctor.run_checks(str(sample_set), run_dir=str(tmp_path / "run"), decoder="gpu")
    decoder = next(check for check in asked_gpu if check.name == "decoder")
    assert decoder.status == doctor.FAIL and "--decode gpu, but no CUDA device is visible" in decoder.detail
    assert "--gpus all" in decoder.fix and "--decode cpu" in decoder.fix
    result = run_doctor("--data", sample_set, "--run-dir", tmp_path / "run", "--decode", "gpu")
    assert result.returncode == 1 and "fail  decoder" in result.stdout


def test_the_shared_memory_row_sizes_batches_as_the_loader_does_with_decode_gpu(sample_set, tmp_path):
    """With --decode gpu the workers send encoded files, which the loader budgets by their size (here larger than
    32 px crops): the doctor's row uses the same figure."""
    report = doctor.run_checks(
        str(sample_set),
        workers=2,
        prefetch_factor=4,
        batch_size=8,
        image_size=32,
        run_dir=str(tmp_path / "run"),
        decoder="gpu",
        loader="processes",
    )
    shm = next(check for check in report if check.name == "shared memory")
    _, train_index, _ = splits.load_splits(str(sample_set), config.DEFAULTS.val_fraction, config.DEFAULTS.seed)
    encoded = device_decode.EncodedImageDataset(train_index, 32, train=True, seed=0)
    one_batch_bytes = loader.dataset_batch_bytes(encoded, 8)
    assert one_batch_bytes > loader.batch_bytes(8, 32)
    assert shm.facts["needed"] == (2 * 4 + plan.BATCHES_HELD_BY_MAIN) * one_batch_bytes
    assert f"batches of {doctor.format_bytes(one_batch_bytes)}" in shm.detail


def test_nvjpeg_check_compares_with_the_cpu_decode():
    """On the CPU both decodes are libjpeg-turbo's: they agree. A GPU's nvJPEG is checked by the gpu test."""
    assert doctor.nvjpeg_error(torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
def test_nvjpeg_decodes_as_the_cpu_does():
    assert doctor.nvjpeg_error(torch.device("cuda:0")) is None


# ---------------------------------------------------------------- the report and the command
def test_report_status_exit_code_and_html():
    report = doctor.Report(
        [doctor.Check("a", doctor.OK, "fine"), doctor.Check("b <script>", doctor.WARN, "x < y", fix="do z")]
    )
    assert (report.status, report.exit_code) == (doctor.WARN, 0)
    page = report._repr_html_()
    assert page.startswith('<table class="torchlab-doctor"')
    assert page.count('<tr class="torchlab-doctor-') == 2
    assert "b &lt;script&gt;" in page
    assert "<script>" not in page
    report.append(doctor.Check("c", doctor.FAIL, "broken", fix="mend it"))
    assert (report.status, report.exit_code) == (doctor.FAIL, 1)
    assert report.summary() == "doctor: 1 ok, 1 warn, 1 fail"
    assert "fix: mend it" in report.as_text()


def test_run_checks_takes_train_py_defaults(tmp_path):
    report = doctor.run_checks(data_dir=str(tmp_path / "missing"), run_dir=str(tmp_path / "run"))
    names = [check.name for check in report]
    assert names[:4] == ["python", "torch", "torchvision", "torchaudio"]
    assert {"data", "shared memory", "cpus", "decoder", "run dir"} <= set(names)
    shm = next(check for check in report if check.name == "shared memory")
    # train.py's default loader decodes in threads: nothing goes through /dev/shm
    assert shm.facts == {"workers": AUTO_WORKERS, "loader": "threads"} and shm.status == doctor.OK
    report = doctor.run_checks(data_dir=str(tmp_path / "missing"), run_dir=str(tmp_path / "run"), loader="processes")
    shm = next(check for check in report if check.name == "shared memory")
    assert shm.facts["workers"] == AUTO_WORKERS
    # train.py's prefetch 4, batch 64, and the two batches its main process holds
    assert shm.facts["needed"] == (shm.facts["workers"] * 4 + 2) * BATCH_BYTES


def test_command_exits_1_on_a_failure_and_prints_json(tmp_path):
    result = run_doctor("--data", tmp_path / "missing", "--run-dir", tmp_path / "run", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "fail"
    data_check = next(check for check in report["checks"] if check["name"] == "data")
    assert data_check["status"] == "fail"
    assert "-v /path/to/images" in data_check["fix"]


def test_command_exits_0_when_nothing_fails(sample_set, tmp_path):
    result = run_doctor("--data", sample_set, "--workers", 0, "--batch-size", 16, "--run-dir", tmp_path / "run")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("doctor: ") and lines[-1].endswith(" 0 fail")
    assert any(line.startswith("ok    data ") for line in lines)
    status_words = {line.split()[0] for line in lines[:-1] if not line.startswith(" ")}
    assert status_words <= {"ok", "warn"}


def test_command_help_documents_exit_status_and_a_bad_flag_exits_2():
    help_text = run_doctor("--help").stdout
    assert "Exit status" in help_text
    assert "--shm-size" in help_text
    assert "torchlab doctor" in help_text
    bad = run_doctor("--workers", "many")
    assert bad.returncode == 2
    assert "--workers" in bad.stderr
    # train.py's own flags, with train.py's checks: an --image-size train.py refuses, the doctor refuses.
    too_large = run_doctor("--image-size", "5000")
    assert too_large.returncode == 2 and "--image-size: expected an integer > 0 and <= 4096" in too_large.stderr


def test_the_doctors_loader_flags_are_train_pys_own():
    def options(parser):
        return {action.dest: (action.default, action.help, action.type) for action in parser._actions}

    train_flags, doctor_flags = options(config.build_parser()), options(doctor.build_parser())
    assert {name: doctor_flags[name] for name in doctor.DOCTOR_FLAGS} == {
        name: train_flags[name] for name in doctor.DOCTOR_FLAGS
    }


def test_autotuned_workers_are_shown_as_such_not_flagged():
    """Issue 30: after autotune saved 3 workers on 2 CPUs, the doctor warned "more workers than CPUs; fix:
    --workers 2 (or auto)" though auto gave 3."""
    usable = machine.usable_cpu_count()
    check = doctor.check_cpus(workers=usable + 1, tuned="autotuned (saved 2025-01-02, for these flags)")
    assert check.status == doctor.OK and not check.fix
    assert f"autotuned: {usable + 1} worker processes (saved 2025-01-02, for these flags)" in check.detail
    assert "more than CPUs, and faster so" in check.detail
