"""A full disk while train.py writes a checkpoint (a small tmpfs as the run directory): one clear
error line, exit code 1, and the previous checkpoint intact and loadable."""

import pytest

from helpers.docker import IMAGE, docker

pytestmark = pytest.mark.slow

# mobilenet_v3_small with AdamW: a checkpoint of about 18 MB, so 30 MB hold one but not a second.
RUN = (
    "torchlab sample-data /tmp/data >/dev/null && "
    "python /opt/torchlab/train.py --data /tmp/data --run-dir /runs/full --epochs 3 --workers 0 "
    "--arch mobilenet_v3_small --image-size 48 --batch-size 16 --optimizer adamw --keep-checkpoints 3"
)


def test_full_disk_while_checkpointing_fails_clearly_and_keeps_the_previous_checkpoint():
    result = docker(
        "run",
        "--rm",
        "--tmpfs",
        "/runs:size=30m,uid=1000,gid=100",
        "-e",
        "DOCTOR_AT_START=no",
        IMAGE,
        "sh",
        "-c",
        f"{RUN}; echo exit=$?; ls /runs/full; "
        'python -c \'import glob, torch; [torch.load(p, weights_only=True) for p in glob.glob("/runs/full/*.pt")]; '
        'print("loadable")\'',
        check=False,
        timeout=600,
    )
    assert "exit=1" in result.stdout, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], result.stderr
    assert "intact" in errors[0]
    assert "Traceback" not in result.stderr
    files = result.stdout.split()
    assert len([name for name in files if name.startswith("checkpoint-")]) == 1, files
    assert "loadable" in files
