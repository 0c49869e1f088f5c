"""checkpoint.py: atomic writes, what resume picks, and what is kept."""

import os

import pytest
import torch

from conftest import QUICK_RUN
from torchlab import checkpoint, io, train


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_resume_never_picks_a_temporary_or_foreign_file(tmp_path):
    checkpoint.save_atomically({"step": 7}, checkpoint.checkpoint_path(tmp_path, 7))
    # What a save cut short leaves, names that only look alike, and a file that is not a checkpoint.
    stale = ".checkpoint-00000009.pt.4242.tmp"
    for name in (stale, "checkpoint-00000099.pt.tmp", "checkpoint-99.pt", "checkpoint-latest.pt"):
        (tmp_path / name).write_bytes(b"half a file")

    latest = checkpoint.latest_checkpoint(tmp_path)
    assert latest == str(tmp_path / "checkpoint-00000007.pt")
    assert torch.load(latest, weights_only=True) == {"step": 7}

    io.remove_stale_temp_files(tmp_path)
    assert not (tmp_path / stale).exists()
    assert (tmp_path / "checkpoint-00000099.pt.tmp").exists()


def test_a_failed_save_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = checkpoint.checkpoint_path(tmp_path, 3)
    checkpoint.save_atomically({"version": 1}, path)

    with pytest.raises(RuntimeError, match="cannot pickle"):
        checkpoint.save_atomically({"version": 2, "bad": Unpicklable()}, path)

    assert os.listdir(tmp_path) == ["checkpoint-00000003.pt"]
    assert torch.load(path, weights_only=True) == {"version": 1}


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    network = torch.nn.Linear(2, 2)
    manager = checkpoint.CheckpointManager(tmp_path, keep=2, components={"model": network}, run_config={"seed": 0})
    for step in (5, 40, 10, 300):
        manager.save(checkpoint.Position(global_step=step))

    assert sorted(os.listdir(tmp_path)) == ["checkpoint-00000040.pt", "checkpoint-00000300.pt"]
    assert checkpoint.latest_checkpoint(tmp_path).endswith("checkpoint-00000300.pt")
    assert checkpoint.latest_checkpoint(tmp_path / "absent") is None


def test_a_checkpoint_restores_every_component_the_position_and_the_rng(tmp_path):
    network = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1, momentum=0.9)
    network(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    manager = checkpoint.CheckpointManager(tmp_path, 3, {"model": network, "optimizer": optimizer}, {"arch": "x"})
    path = manager.save(checkpoint.Position(epoch=2, step_in_epoch=5, global_step=17))
    expected_draw = torch.rand(4)  # what the RNG gives next, as saved

    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    restorer = checkpoint.CheckpointManager(tmp_path, 3, {"model": fresh, "optimizer": fresh_optimizer}, {})
    torch.manual_seed(1234)
    position = restorer.restore(path)

    assert position == checkpoint.Position(epoch=2, step_in_epoch=5, global_step=17)
    assert torch.equal(torch.rand(4), expected_draw)
    assert all(
        torch.equal(a, b) for a, b in zip(network.state_dict().values(), fresh.state_dict().values(), strict=False)
    )
    assert fresh_optimizer.state_dict()["state"][0]["momentum_buffer"] is not None
    assert torch.load(path, weights_only=True)["config"] == {"arch": "x"}


def test_a_full_disk_is_one_error_naming_the_kept_checkpoint(tmp_path, monkeypatch):
    manager = checkpoint.CheckpointManager(tmp_path, 3, {"model": torch.nn.Linear(1, 1)}, {})
    kept = manager.save(checkpoint.Position(global_step=1))

    def no_space(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.io, "atomic_write", no_space)
    with pytest.raises(
        checkpoint.CheckpointWriteError, match=f"No space left on device; the previous checkpoint {kept} is intact"
    ):
        manager.save(checkpoint.Position(global_step=2))


def test_resuming_a_run_that_reached_max_steps_says_there_is_nothing_to_do(
    tmp_path, capsys, sample_set, signal_handlers_restored
):
    """It said "stopped by --max-steps 2 after epoch -1, step 2"."""
    run_dir = tmp_path / "run"
    argv = ["--data", str(sample_set), "--run-dir", str(run_dir), "--workers", "0", *QUICK_RUN, "--max-steps", "2"]
    train.main(argv)
    assert "stopped by --max-steps 2 at epoch 0, step 2: saved " in capsys.readouterr().out

    train.main(argv)  # returns: exit code 0

    *_, resumed, last = capsys.readouterr().out.splitlines()
    assert resumed == f"resumed from {checkpoint.checkpoint_path(run_dir, 2)}: epoch 0, step 2"
    assert (
        last == "nothing to do: the run had already reached --max-steps 2 at step 2 (a larger --max-steps continues it)"
    )
    assert checkpoint.list_checkpoints(run_dir) == [checkpoint.checkpoint_path(run_dir, 2)]


def test_a_run_stopped_before_its_first_step_says_at_epoch_0_and_saves_nothing(
    tmp_path, capsys, monkeypatch, sample_set, signal_handlers_restored
):
    """It said "stopped by SIGTERM after epoch -1, step 0"."""

    class SignalledAtStart(train.StopRequest):
        def __init__(self, under_torchrun):
            super().__init__(under_torchrun)
            self.signal_name = "SIGTERM"

    monkeypatch.setattr(train, "StopRequest", SignalledAtStart)
    run_dir = tmp_path / "run"
    train.main(["--data", str(sample_set), "--run-dir", str(run_dir), "--workers", "0", *QUICK_RUN])

    printed = capsys.readouterr().out
    assert "stopped by SIGTERM at epoch 0, step 0" in printed and "epoch -1" not in printed
    assert checkpoint.list_checkpoints(run_dir) == []
