"""checkpoint.py: atomic writes, what resume picks, and what is kept."""

import os

import pytest
import torch

import checkpoint


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_resume_never_picks_a_temporary_or_foreign_file(tmp_path):
    checkpoint.save_atomically({"step": 7}, checkpoint.checkpoint_path(tmp_path, 7))
    # What a save cut short leaves, names that only look alike, and a file that is not a checkpoint.
    for name in (".checkpoint-4242.tmp", "checkpoint-00000099.pt.tmp", "checkpoint-99.pt", "checkpoint-latest.pt"):
        (tmp_path / name).write_bytes(b"half a file")

    latest = checkpoint.latest_checkpoint(tmp_path)
    assert latest == str(tmp_path / "checkpoint-00000007.pt")
    assert torch.load(latest, weights_only=True) == {"step": 7}

    checkpoint.remove_stale_temp_files(tmp_path)
    assert not (tmp_path / ".checkpoint-4242.tmp").exists()
    assert (tmp_path / "checkpoint-00000099.pt.tmp").exists()


def test_a_failed_save_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = checkpoint.checkpoint_path(tmp_path, 3)
    checkpoint.save_atomically({"version": 1}, path)

    with pytest.raises(RuntimeError, match="cannot pickle"):
        checkpoint.save_atomically({"version": 2, "bad": Unpicklable()}, path)

    assert os.listdir(tmp_path) == ["checkpoint-00000003.pt"]
    assert torch.load(path, weights_only=True) == {"version": 1}


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in (5, 40, 10, 300):
        checkpoint.save_atomically({"step": step}, checkpoint.checkpoint_path(tmp_path, step))

    checkpoint.remove_old_checkpoints(tmp_path, keep=2)

    assert sorted(os.listdir(tmp_path)) == ["checkpoint-00000040.pt", "checkpoint-00000300.pt"]
    assert checkpoint.latest_checkpoint(tmp_path).endswith("checkpoint-00000300.pt")
    assert checkpoint.latest_checkpoint(tmp_path / "absent") is None
