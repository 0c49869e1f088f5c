"""Faults at the worst moment: train.py killed with SIGKILL while it writes a checkpoint."""

import os

import torch

from conftest import QUICK_RUN, run_train, start_train


def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(sample_set, tmp_path):
    run_dir = tmp_path / "run"
    args = ("--data", sample_set, "--run-dir", run_dir, "--epochs", 3, "--workers", 0, *QUICK_RUN)
    process = start_train(*args)

    def writing_the_second_checkpoint():
        names = os.listdir(run_dir) if run_dir.exists() else []
        return any(n.startswith("checkpoint-") for n in names) and any(n.startswith(".checkpoint-") for n in names)

    try:
        # Polled without pause: the temporary file of a checkpoint lives for a few milliseconds.
        while not writing_the_second_checkpoint():
            assert process.poll() is None, "train.py finished before it could be killed while writing a checkpoint"
        process.kill()
    finally:
        process.wait(timeout=60)
    assert process.returncode == -9
    finished = sorted(n for n in os.listdir(run_dir) if n.startswith("checkpoint-"))
    assert len(finished) == 1, finished
    state = torch.load(run_dir / finished[0], weights_only=True)
    assert state["global_step"] == int(finished[0][len("checkpoint-") : -len(".pt")])

    resumed = run_train(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {run_dir / finished[0]}" in resumed.stdout
    assert "finished --epochs 3" in resumed.stdout
    assert not [n for n in os.listdir(run_dir) if n.startswith(".checkpoint-")]
