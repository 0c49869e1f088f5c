"""Bad input to train.py: one line on stderr, exit code 2, and no run directory."""

import os

import pytest
import torch

from conftest import QUICK_RUN, run_train
from torchlab import machine, train


def test_missing_data_folder_says_how_to_mount_it(tmp_path):
    result = run_train("--data", tmp_path / "absent", "--run-dir", tmp_path / "run", timeout=120)

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"train.py: error: {tmp_path}/absent: no such folder")
    assert "-v /path/to/images:" in result.stderr
    assert not (tmp_path / "run").exists()


def make_layout(root, layout):
    for name in layout:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")


@pytest.mark.parametrize(
    ("layout", "flags", "message"),
    [
        ((), (), "no class folders"),
        (("data/.ipynb_checkpoints/a.jpg",), (), "no class folders"),
        (("data/cat/notes.txt",), (), "cat: a class folder with no images"),
        ((), ("--workers", "-1"), "argument --workers: expected auto or an integer >= 0, got '-1'"),
        ((), ("--workers", "many"), "argument --workers: expected auto or an integer >= 0"),
        ((), ("--batch-size", "0"), "argument --batch-size: expected an integer > 0, got '0'"),
        ((), ("--epochs", "2.5"), "argument --epochs: expected an integer > 0"),
        ((), ("--val-fraction", "1"), "argument --val-fraction: expected a number >= 0 and < 1"),
        ((), ("--lr", "nan"), "argument --lr: expected a number > 0"),
        ((), ("--amp", "fp8"), "argument --amp: expected one of auto, bf16, fp16, off, got 'fp8'"),
        ((), ("--decode", "nvjpeg"), "argument --decode: expected one of auto, cpu, gpu, got 'nvjpeg'"),
        ((), ("--decode", "gpu"), "--decode gpu: needs a CUDA device, and this run is on the CPU (--device cpu)"),
        ((), ("--no-such-flag",), "unrecognized arguments: --no-such-flag"),
        ((), ("--arch", "resnet_nonexistent"), "--arch resnet_nonexistent: not a torchvision classification model"),
        ((), ("--weights", "missing.pth"), "--weights missing.pth: no such file"),
        ((), ("--resume", "missing.pt"), "--resume missing.pt: expected auto, none or a checkpoint file"),
        # Values test_generated_flags.py found that ended in a traceback.
        ((), ("--seed", str(2**64)), "argument --seed: expected an integer >= 0 and < 4294967296"),
        ((), ("--lr", "1e308"), "argument --lr: expected a number > 0 and <= 1000"),
        ((), ("--image-size", "100000"), "argument --image-size: expected an integer > 0 and <= 4096"),
        ((), ("--epochs", "2", "--warmup-epochs", "1e308"), "--warmup-epochs 1e+308: expected at most --epochs (2)"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, signal_handlers_restored, layout, flags, message):
    (tmp_path / "data").mkdir()
    make_layout(tmp_path, layout)
    run_dir = tmp_path / "run"

    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(tmp_path / "data"), "--run-dir", str(run_dir), "--device", "cpu", *flags])

    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith("train.py: error: ")
    assert message in stderr
    assert not run_dir.exists()


def test_more_workers_than_the_machine_allows_are_refused(
    tmp_path, capsys, sample_set, monkeypatch, signal_handlers_restored
):
    """Found by test_generated_flags.py: --workers 1_000 (Python's int() takes it) forked hundreds of copies
    of the training process until the machine ran out of memory."""
    monkeypatch.setattr(machine, "usable_cpu_count", lambda *args: 2)
    argv = ["--data", str(sample_set), "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--loader-only"]
    with pytest.raises(SystemExit) as exit_info:
        train.main([*argv, "--workers", "1_000"])

    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr == (
        "train.py: error: --workers 1000: expected at most 64 decode threads (32 per usable CPU, 2 here), or auto\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        train.main([*argv, "--workers", "9", "--loader", "processes"])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert (
        stderr
        == "train.py: error: --workers 9: expected at most 8 worker processes (4 per usable CPU, 2 here), or auto\n"
    )
    assert not (tmp_path / "run").exists()
    train.main([*argv, "--workers", "8", "--batch-size", "8", "--loader", "processes"])  # the bound is accepted
    assert "loader-only: " in capsys.readouterr().out


def test_batches_ahead_beyond_the_memory_are_refused(tmp_path, capsys, sample_set, signal_handlers_restored):
    """Found by test_generated_flags.py in CI: --prefetch-factor 3044578022 made the thread loader allocate that
    many batch buffers; the run grew for an hour, until CI gave up."""
    argv = ["--data", str(sample_set), "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--loader-only"]
    with pytest.raises(SystemExit) as exit_info:
        train.main([*argv, "--prefetch-factor", "3044578022", "--batch-size", "16"])

    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith(
        "train.py: error: --prefetch-factor 3044578022 (--batch-size 16): the loader would hold 3,044,578,023 batches"
    )
    assert "of memory free here; expected --prefetch-factor at most " in stderr
    assert not (tmp_path / "run").exists()


def test_too_few_images_for_one_batch(tmp_path, capsys, monkeypatch, sample_set, signal_handlers_restored):
    # A /dev/shm too small for such batches: the loader, made first, said so before this line, or failed on it.
    monkeypatch.setattr(machine, "shared_memory_bytes", lambda *args: (64 * 10**6, 64 * 10**6))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(sample_set), "--run-dir", str(tmp_path / "run"), "--batch-size", "1000"])

    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "make no full batch of --batch-size 1000" in stderr, stderr
    assert not (tmp_path / "run").exists()


def test_a_model_that_cannot_train_on_the_input_is_refused_before_the_run(
    tmp_path, capsys, sample_set, signal_handlers_restored
):
    # resnet18 downsamples 32 px to 1 x 1: batch norm then sees one value per channel at --batch-size 1.
    run_dir = tmp_path / "run"
    flags = ("--arch", "resnet18", "--image-size", "32", "--batch-size", "1", "--device", "cpu")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(sample_set), "--run-dir", str(run_dir), *flags])

    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1
    assert stderr.startswith("train.py: error: --arch resnet18 cannot train on --image-size 32 with --batch-size 1: ")
    assert "more than 1 value per channel" in stderr
    assert not run_dir.exists()


def test_a_model_with_a_fixed_input_size_names_it_before_the_run(
    tmp_path, capsys, sample_set, signal_handlers_restored
):
    """torchvision's ViT asserts its image size: an AssertionError, which ended in a traceback and exit code 1."""
    run_dir = tmp_path / "run"
    flags = ("--arch", "vit_b_16", "--image-size", "64", "--batch-size", "2", "--device", "cpu")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(sample_set), "--run-dir", str(run_dir), *flags])

    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "train.py: error: --arch vit_b_16 cannot train on --image-size 64 with --batch-size 2: "
        "Wrong image height! Expected 224 but got 64!\n"
    )
    assert not run_dir.exists()


def test_weights_that_are_no_state_dict_are_one_line_before_the_run(
    tmp_path, capsys, sample_set, signal_handlers_restored
):
    """A text file (IndexError: pop from empty list) and an empty one (EOFError) ended in a traceback, exit 1."""
    (tmp_path / "notes.txt").write_text("a text file, not weights\n")  # "a": pickle's APPEND, on an empty stack
    (tmp_path / "empty.pth").write_bytes(b"")
    torch.save([1, 2], tmp_path / "list.pt")
    run_dir = tmp_path / "run"
    for name, reason in {
        "notes.txt": "not a readable PyTorch state dict (pop from empty list)",
        "empty.pth": "not a readable PyTorch state dict (the file is empty)",
        "list.pt": "not a state dict (it holds a list)",
    }.items():
        with pytest.raises(SystemExit) as exit_info:
            train.main(
                ["--data", str(sample_set), "--run-dir", str(run_dir), "--weights", str(tmp_path / name), *QUICK_RUN]
            )
        assert exit_info.value.code == 2
        stderr = capsys.readouterr().err
        assert stderr.count("\n") == 1 and stderr.startswith(f"train.py: error: --weights {tmp_path / name}: {reason}")
        assert not run_dir.exists()


def test_compile_without_a_compiler_says_what_is_missing(
    tmp_path, capsys, sample_set, signal_handlers_restored, monkeypatch
):
    monkeypatch.setenv("CXX", "no-such-c++")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(sample_set), "--run-dir", str(tmp_path / "run"), "--compile"])

    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "train.py: error: --compile: torch.compile needs a C++ compiler (g++, or $CXX) and none is on PATH\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_run_dir_it_cannot_write_is_refused_before_the_run(tmp_path, capsys, sample_set, signal_handlers_restored):
    (tmp_path / "file").write_bytes(b"")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    refusals = {tmp_path / "file" / "run": f"{tmp_path / 'file'} is a file, not a folder"}
    if os.getuid() != 0:  # root may write anywhere
        refusals[locked / "run"] = f"{locked} is not a folder that UID {os.getuid()} can write in"
    for run_dir, reason in refusals.items():
        with pytest.raises(SystemExit) as exit_info:
            train.main(["--data", str(sample_set), "--run-dir", str(run_dir), "--device", "cpu"])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == f"train.py: error: --run-dir {run_dir}: {reason}\n"
    assert list(locked.iterdir()) == []


def test_a_resume_file_that_is_no_checkpoint_of_this_run_is_one_line_and_changes_nothing(tmp_path, sample_set):
    (tmp_path / "config.json").write_text("{}")
    torch.save({"model": {}}, tmp_path / "weights.pt")
    for path, reason in {
        tmp_path / "config.json": "not a checkpoint torch can read",
        tmp_path / "weights.pt": "not a torchlab checkpoint (it has no rng, epoch, step_in_epoch, global_step)",
    }.items():
        result = run_train("--data", sample_set, "--run-dir", tmp_path / "run", "--resume", path, *QUICK_RUN)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"train.py: error: --resume {path}: {reason}"), result.stderr
        assert not (tmp_path / "run").exists()

    first = run_train("--data", sample_set, "--run-dir", tmp_path / "run", "--max-steps", "1", *QUICK_RUN)
    assert first.returncode == 0, first.stderr
    saved_config = (tmp_path / "run" / "config.json").read_text()
    other_model = run_train("--data", sample_set, "--run-dir", tmp_path / "run", *QUICK_RUN, "--arch", "resnet18")
    assert other_model.returncode == 2 and other_model.stderr.count("\n") == 1, other_model.stderr
    assert "its model state does not fit this run (Error(s) in loading state_dict for ResNet:" in other_model.stderr
    # Refused before the run directory is touched: config.json still says what the checkpoints are.
    assert other_model.stdout == "" and (tmp_path / "run" / "config.json").read_text() == saved_config

    resume = ("--resume", tmp_path / "run" / "checkpoint-00000001.pt")
    elsewhere = run_train(
        "--data", sample_set, "--run-dir", tmp_path / "new", *resume, *QUICK_RUN, "--arch", "resnet18"
    )
    assert elsewhere.returncode == 2 and "its model state does not fit this run" in elsewhere.stderr
    assert not (tmp_path / "new").exists()
