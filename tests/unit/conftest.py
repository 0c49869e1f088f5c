"""Fixtures for the torchlab package's tests: small generated data sets, and train.py runs.

`python -m pytest` from the repository root (make test-unit) imports the package from torchlab/ there;
train.py runs as the repository's two-line shim, which imports it the same way.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = ROOT / "train.py"

# A tiny network at a small size: a run takes seconds on two CPU cores. Dropout in mobilenet_v3_small also
# puts torch's RNG state on the path that resume has to reproduce.
QUICK_RUN = tuple(
    "--arch mobilenet_v3_small --image-size 48 --batch-size 16 --device cpu --log-interval 1 --warmup-epochs 0 "
    "--optimizer adamw --lr 0.005".split()
)
# One thread per process: the same floating-point results in every run, and no threads spinning against
# each other on a small machine.
TRAIN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="session")
def sample_set(tmp_path_factory):
    """sample_data.py's set: 4 classes, 24 training and 6 validation JPEGs each (~450 x 375 px)."""
    from torchlab.tools import sample_data

    folder = tmp_path_factory.mktemp("sample") / "data"
    sample_data.write_sample_data(str(folder), classes=4, per_class=24, val_per_class=6, seed=0)
    return folder


@pytest.fixture
def signal_handlers_restored():
    """train.main() installs signal handlers; give pytest its own back."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


def given_plan(loader="processes", workers=0, prefetch_factor=2, batch_size=64, **fields):
    """A loader plan given outright, as plan.plan could answer it (--decode cpu, pinning off), for tests of the
    loader itself."""
    from torchlab.pipeline import plan

    return plan.LoaderPlan(
        loader=loader,
        workers=workers,
        prefetch_factor=prefetch_factor,
        decode="cpu",
        jpeg_draft=True,
        pin_memory=False,
        batch_size=batch_size,
        **fields,
    )


def torchlab_command(command, *args):
    """`torchlab COMMAND ARGS`, run from this checkout's package."""
    return [sys.executable, "-m", "torchlab", command, *map(str, args)]


def train_command(*args):
    return [sys.executable, str(TRAIN_SCRIPT), *map(str, args)]


def run_train(*args, timeout=240):
    return subprocess.run(
        train_command(*args), capture_output=True, text=True, env=TRAIN_ENV, timeout=timeout, check=False
    )


def run_torchrun(program, *args, env=TRAIN_ENV, timeout=300):
    """`program` run by torchrun in two processes. One that hangs fails the test with its workers' Python stacks,
    not only a time-out: SIGABRT makes their faulthandler print them."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(program)]
    command += map(str, args)
    environment = {**env, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in child_pids(process.pid):  # the workers; torchrun then reports their end and exits
            os.kill(pid, signal.SIGABRT)
        stdout, stderr = process.communicate(timeout=60)
        output = f"its output ends:\n{stdout[-1500:]}\nits stacks:\n{stderr[-20000:]}"
        pytest.fail(f"torchrun hung for {timeout} s; {output}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def child_pids(pid):
    return [
        int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()
    ]


def start_train(*args, **popen_options):
    return subprocess.Popen(
        train_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=TRAIN_ENV, **popen_options
    )


def read_metrics(run_dir, kind):
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [record for record in records if record["kind"] == kind]


def last_step(run_dir):
    return max((record["step"] for record in read_metrics(run_dir, "interval")), default=0)


def wait_until(condition, what, timeout=120, process=None):
    """Poll `condition` until it is true; fail after `timeout` s, or as soon as `process` has exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"train.py exited ({process.returncode}) before {what}: {process.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
