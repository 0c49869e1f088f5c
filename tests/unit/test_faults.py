"""Faults at the worst moment: train.py killed with SIGKILL while it writes a checkpoint."""

import os
import subprocess
import sys

import torch

from conftest import QUICK_RUN, TRAIN_ENV, run_train, wait_until

# train.py, but the rename that completes its second checkpoint hangs after writing a marker file: a SIGKILL
# then lands exactly between "temporary file written" and "renamed into place".
HANG_AT_SECOND_CHECKPOINT = """
import os, sys, time
from torchlab import train
rename = os.replace
def rename_or_hang(source, target):
    folder = os.path.dirname(target)
    if os.path.basename(target).startswith("checkpoint-") and any(
        name.startswith("checkpoint-") for name in os.listdir(folder)
    ):
        open(os.environ["MARKER"], "w").close()
        time.sleep(600)
    rename(source, target)
os.replace = rename_or_hang
train.main(sys.argv[1:])
"""


def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(sample_set, tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "killing-point"
    args = ("--data", sample_set, "--run-dir", run_dir, "--epochs", 3, "--workers", 0, *QUICK_RUN)
    process = subprocess.Popen(
        [sys.executable, "-c", HANG_AT_SECOND_CHECKPOINT, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**TRAIN_ENV, "MARKER": str(marker)},
    )
    try:
        wait_until(marker.exists, "the second checkpoint's temporary file", process=process)
        assert [name for name in os.listdir(run_dir) if name.startswith(".checkpoint-")]
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
