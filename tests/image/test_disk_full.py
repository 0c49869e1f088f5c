"""A full disk (a small tmpfs): while train.py writes a checkpoint, one clear error line, exit code 1, and the
previous checkpoint intact and loadable; for a generated data set (sample-data, bench_data) larger than the space
free, one line and exit 2 before anything is written, and where the disk fills up all the same, one line, exit 1
and nothing of the set left."""

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


GENERATORS = {
    "sample-data": "torchlab sample-data /small/set",
    "bench_data": "python -m torchlab.tools.bench_data /small/set --images 100",
}


def generate_on_small_disk(command, tmpfs_options):
    result = docker(
        "run", "--rm", "--tmpfs", f"/small:{tmpfs_options},uid=1000,gid=100", "-e", "DOCTOR_AT_START=no", IMAGE,
        "sh", "-c", f"{command}; echo exit=$?; ls -A /small",
        check=False, timeout=300,
    )  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if " error: " in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stdout.split(), errors[0]


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_set_larger_than_the_free_space_is_refused_before_anything_is_written(generator):
    """sample-data's default set is about 18 MB and bench_data's 100 + 10 images about 12 MB; 2 MB are free."""
    left, error = generate_on_small_disk(GENERATORS[generator], "size=2m")
    assert left == ["exit=2"], left
    assert "more than the 2 MB free in /small; expected a smaller set" in error


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_disk_that_fills_up_while_a_set_is_written_keeps_nothing_of_it(generator):
    """Space enough by the estimate, but 12 inodes: the disk fills up at the 11th file or folder."""
    left, error = generate_on_small_disk(GENERATORS[generator], "size=100m,nr_inodes=12")
    assert left == ["exit=1"], left
    assert "/small/set: no space left on its device while writing it; nothing of it was kept" in error
