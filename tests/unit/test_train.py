"""train.py end to end, as subprocesses on the CPU: learning, resuming, signals, torchrun, --loader-only."""

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from conftest import (
    QUICK_RUN,
    TRAIN_SCRIPT,
    last_step,
    read_metrics,
    run_torchrun,
    run_train,
    start_train,
    wait_until,
)
from torchlab import config
from torchlab.data import splits
from torchlab.pipeline import sampler


def checkpoint_names(run_dir):
    return sorted(name for name in os.listdir(run_dir) if name.startswith("checkpoint-"))


def interval_losses(run_dir):
    """Loss per step; a step logged twice (before and after a resume) counts as its later record."""
    return {record["step"]: record["loss"] for record in read_metrics(run_dir, "interval")}


def test_a_short_run_learns_and_reports(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    # resnet18: mobilenet_v3's batch-norm statistics (momentum 0.01) settle too slowly for validation here.
    flags = ("--data", sample_set, "--run-dir", run_dir, "--epochs", "5", "--workers", "2", *QUICK_RUN)
    result = run_train(*flags, "--arch", "resnet18")

    assert result.returncode == 0, result.stderr
    epochs = read_metrics(run_dir, "epoch")
    assert [record["epoch"] for record in epochs] == [0, 1, 2, 3, 4]
    assert epochs[-1]["val_accuracy"] >= 0.7  # 4 classes: chance is 0.25
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    intervals = read_metrics(run_dir, "interval")
    assert [record["step"] for record in intervals] == list(range(1, 31))
    for key in ("epoch", "loss", "accuracy", "lr", "images_per_sec", "data_wait_frac", "bad_images"):
        assert key in intervals[-1]
    assert 0 <= intervals[-1]["data_wait_frac"] <= 1
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["arch"], config["workers"], config["classes"][0]) == ("resnet18", 2, "class_00")
    assert checkpoint_names(run_dir) == ["checkpoint-00000018.pt", "checkpoint-00000024.pt", "checkpoint-00000030.pt"]
    assert re.search(r"^epoch 4 step 30 \| loss \d", result.stdout, re.MULTILINE)  # plain lines into a pipe
    assert "finished --epochs 5 at step 30" in result.stdout


def test_a_run_writes_its_scalars_as_tensorboard_events(sample_set, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    result = run_train("--data", sample_set, "--run-dir", run_dir, "--epochs", "1", "--workers", "0", *QUICK_RUN)
    assert result.returncode == 0, result.stderr

    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for field in ("loss", "accuracy", "lr", "images_per_sec", "data_wait_frac"):
        assert {f"train/{field}", f"epoch/{field}"} <= tags, tags
    assert {"epoch/val_loss", "epoch/val_accuracy"} <= tags
    intervals = read_metrics(run_dir, "interval")
    losses = events.Scalars("train/loss")
    assert [event.step for event in losses] == [record["step"] for record in intervals] == list(range(1, 7))
    assert [event.value for event in losses] == pytest.approx([record["loss"] for record in intervals])
    (epoch,) = read_metrics(run_dir, "epoch")
    assert [(event.step, event.value) for event in events.Scalars("epoch/val_accuracy")] == [
        (6, pytest.approx(epoch["val_accuracy"]))
    ]


@pytest.mark.parametrize("loader_choice", ["threads", "processes"])
def test_resume_after_sigterm_reproduces_the_uninterrupted_run(sample_set, tmp_path, loader_choice):
    run_flags = ("--data", sample_set, "--epochs", "3", "--workers", "2", "--loader", loader_choice, *QUICK_RUN)
    reference = run_train(*run_flags, "--run-dir", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr

    run_dir = tmp_path / "interrupted"
    process = start_train(*run_flags, "--run-dir", run_dir)
    wait_until(lambda: last_step(run_dir) >= 4, "step 4", process=process)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "stopped by SIGTERM" in stdout
    stopped_at = last_step(run_dir)
    assert 4 <= stopped_at < 18
    assert checkpoint_names(run_dir)[-1] == f"checkpoint-{stopped_at:08d}.pt"

    resumed = run_train(*run_flags, "--run-dir", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(
        rf"^resumed from .*checkpoint-{stopped_at:08d}.pt: epoch \d, step {stopped_at}$", resumed.stdout, re.M
    )
    assert read_metrics(run_dir, "interval")[stopped_at]["step"] == stopped_at + 1  # no step done twice
    assert interval_losses(run_dir) == interval_losses(tmp_path / "reference")  # every step, exactly
    assert len(interval_losses(run_dir)) == 18


@pytest.mark.parametrize("loader_choice", ["threads", "processes"])
def test_sighup_is_ignored_and_sigterm_to_the_process_group_stops_with_a_checkpoint(
    sample_set, tmp_path, loader_choice
):
    """With decode threads, the stop must also end every thread: train.py exits (no hang at exit) with them
    busy or waiting for a buffer."""
    run_dir = tmp_path / "run"
    # Its own session, like a login's; the hangup goes to the whole process group, workers included.
    process = start_train(
        *("--data", sample_set, "--run-dir", run_dir, "--epochs", "3", "--workers", "2", "--loader", loader_choice),
        *QUICK_RUN,
        start_new_session=True,
    )
    wait_until(lambda: last_step(run_dir) >= 1, "step 1", process=process)
    os.killpg(process.pid, signal.SIGHUP)
    hung_up_at = last_step(run_dir)
    wait_until(lambda: last_step(run_dir) >= hung_up_at + 3, "steps after the hangup", process=process)
    # SIGTERM to the whole group too, as `docker stop` sends it through `tini -g` when train.py is the
    # container's command: the workers must not die of it before the training process checkpoints.
    os.killpg(process.pid, signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "stopped by SIGTERM" in stdout
    assert checkpoint_names(run_dir)[-1] == f"checkpoint-{last_step(run_dir):08d}.pt"


def test_a_stale_temporary_checkpoint_is_not_resumed_from(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    run_flags = ("--data", sample_set, "--run-dir", run_dir, "--workers", "0", *QUICK_RUN)
    assert run_train(*run_flags, "--max-steps", "2").returncode == 0
    # What a save killed half-way (power cut, SIGKILL) leaves beside the last good checkpoint.
    (run_dir / ".checkpoint-77.tmp").write_bytes(b"\x80half a checkpoint")

    resumed = run_train(*run_flags, "--max-steps", "3")

    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from " + str(run_dir / "checkpoint-00000002.pt") in resumed.stdout
    assert checkpoint_names(run_dir) == ["checkpoint-00000002.pt", "checkpoint-00000003.pt"]
    assert not (run_dir / ".checkpoint-77.tmp").exists()


def truncate(paths):
    for path in paths:
        path.write_bytes(path.read_bytes()[:300])


def validation_files(data_dir, count):
    """The first `count` validation images: with validation dealt round-robin, image r goes to rank r."""
    _, _, val_index = splits.load_splits(str(data_dir), config.DEFAULTS.val_fraction, config.DEFAULTS.seed)
    return [Path(val_index.path(position)) for position in range(count)]


def test_too_many_unreadable_images_stop_the_run_naming_them(sample_set, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(sample_set, data_dir)
    broken = sorted((data_dir / "train" / "class_02").glob("*.JPEG"))[:3]
    broken_val = validation_files(data_dir, 2)
    truncate(broken + broken_val)
    run_flags = ("--data", data_dir, "--epochs", "1", "--workers", "2", *QUICK_RUN)

    tolerated = run_train(*run_flags, "--run-dir", tmp_path / "tolerated", "--max-bad-images", "3")
    assert tolerated.returncode == 0, tolerated.stderr
    epoch_record = read_metrics(tmp_path / "tolerated", "epoch")[0]
    assert epoch_record["bad_images"] == 3 and "bad images 3" in tolerated.stdout
    assert epoch_record["val_bad_images"] == 2
    # Named with the reason, in both splits: the first few in the log, every one in bad_images.txt.
    assert "epoch 0: skipped 3 unreadable images: " in tolerated.stdout
    assert "epoch 0's validation: skipped 2 unreadable images: " in tolerated.stdout
    assert all(f"{path} (" in tolerated.stdout for path in broken + broken_val)
    listed = (tmp_path / "tolerated" / "bad_images.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in listed) == sorted(str(path) for path in broken + broken_val)
    assert all("truncated" in line.split("\t")[1] or "OSError" in line.split("\t")[1] for line in listed)

    # Logged at no step of the epoch: the epoch's end finds them, and names them once.
    stopped = run_train(*run_flags, "--run-dir", tmp_path / "stopped", "--max-bad-images", "2", "--log-interval", "99")
    assert stopped.returncode == 1
    assert stopped.stdout.count("unreadable images: ") == 1, stopped.stdout
    assert "more than --max-bad-images 2" in stopped.stderr and "Traceback" not in stopped.stderr
    assert any(path.name in stopped.stderr for path in broken)


def test_a_finished_run_started_again_adds_no_record(sample_set, tmp_path):
    # Issue 44: each start of a finished run added a loader_plan record to metrics.jsonl.
    flags = ("--data", sample_set, "--run-dir", tmp_path / "run", "--max-steps", "1", "--workers", "0", *QUICK_RUN)
    assert run_train(*flags).returncode == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = run_train(*flags)
    assert again.returncode == 0 and "nothing to do: the run had already reached --max-steps 1" in again.stdout
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_loader_only_reports_images_per_second(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("--data", sample_set, "--run-dir", run_dir, "--loader-only", "--workers", "2", *QUICK_RUN)

    assert result.returncode == 0, result.stderr
    line = r"^loader-only: \d+\.\d images/s over 96 images \(2 decode threads, --decode cpu\)$"
    assert re.search(line, result.stdout, re.MULTILINE)
    (record,) = read_metrics(run_dir, "loader_only")
    assert record["images"] == 96 and record["images_per_sec"] > 0
    assert not [name for name in os.listdir(run_dir) if name.startswith("checkpoint-")]


def one_training_file_per_rank(data_dir, world_size):
    """A training image that each of `world_size` processes reads in epoch 0 (train.py's split and sampler)."""
    _, train_index, _ = splits.load_splits(str(data_dir), config.DEFAULTS.val_fraction, config.DEFAULTS.seed)
    shares = [
        sampler.EpochSampler(len(train_index), True, config.DEFAULTS.seed, rank, world_size)
        for rank in range(world_size)
    ]
    return [Path(train_index.path(next(iter(share))[0])) for share in shares]


def test_torchrun_two_processes_train_and_only_rank_0_writes(sample_set, tmp_path):
    """Rank 0 writes the run directory, and names every process's unreadable files, training and validation, in
    bad_images.txt."""
    data_dir, run_dir = tmp_path / "data", tmp_path / "run"
    shutil.copytree(sample_set, data_dir)
    broken_train = one_training_file_per_rank(data_dir, world_size=2)
    broken_val = validation_files(data_dir, 2)  # one in each process's share
    broken = broken_train + broken_val
    truncate(broken)
    train_flags = ["--data", data_dir, "--run-dir", run_dir, "--epochs", "2", "--workers", "1"]
    result = run_torchrun(TRAIN_SCRIPT, *train_flags, *QUICK_RUN)

    assert result.returncode == 0, result.stderr[-3000:]
    config_record = json.loads((run_dir / "config.json").read_text())
    assert config_record["world_size"] == 2
    steps = [record["step"] for record in read_metrics(run_dir, "interval")]
    assert steps == list(range(1, 7))  # 96 images / 2 processes / 16 per batch = 3 steps an epoch, logged once
    assert [record["bad_images"] for record in read_metrics(run_dir, "epoch")] == [2, 2]
    assert [record["val_bad_images"] for record in read_metrics(run_dir, "epoch")] == [2, 2]
    assert "epoch 1's validation: skipped 2 unreadable images: " in result.stdout
    assert len(re.findall(r"^epoch \d step \d \|", result.stdout, re.MULTILINE)) == 6
    assert checkpoint_names(run_dir) == ["checkpoint-00000003.pt", "checkpoint-00000006.pt"]
    listed = (run_dir / "bad_images.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in listed) == sorted(map(str, broken))
    assert all(f"{path} (" in result.stdout for path in broken)  # both named in the log too
    files = sorted(os.listdir(run_dir))
    assert [name for name in files if not name.startswith("events.out.tfevents.")] == [
        "bad_images.txt",
        "checkpoint-00000003.pt",
        "checkpoint-00000006.pt",
        "config.json",
        "environment.json",
        "metrics.jsonl",
    ]
    assert len(files) == 7  # one TensorBoard event file, rank 0's


def test_compile_trains_on_the_cpu(sample_set, tmp_path):
    # torch.compile builds C++ on the CPU: the image has to carry a compiler and Python's headers.
    run_dir = tmp_path / "run"
    flags = ("--data", sample_set, "--run-dir", run_dir, "--max-steps", "2", "--workers", "0", *QUICK_RUN)
    result = run_train(*flags, "--arch", "resnet18", "--image-size", "32", "--compile", timeout=600)

    assert result.returncode == 0, result.stderr
    assert checkpoint_names(run_dir) == ["checkpoint-00000002.pt"]
