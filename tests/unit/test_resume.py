"""Resuming, step for step: a run stopped (SIGTERM, --max-steps) and resumed, once or twice, at any point,
does what an uninterrupted run does: the same batches at the same steps, the same losses and learning rates,
the same weights, optimiser and RNG state at each checkpoint; and each stop lands at the step asked for,
in every epoch, also after a resume, also under torchrun (issue 30).

SIGTERM arrives at an exact point: train.py, run with a hook around one of its functions, sends it to its
own process during a given step, as an epoch's pass starts or during an epoch's validation. It is a real
signal, through train.py's own handler; only its moment is chosen, which `kill` from outside cannot do.
"""

import contextlib
import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import ROOT, TRAIN_ENV, TRAIN_SCRIPT, read_metrics, run_torchrun, run_train
from torchlab import train

# The tiny set (2 classes, 13 training images each) in batches of 4: 6 steps an epoch, 2 images left out.
STEPS_PER_EPOCH = 6
EPOCHS = 3
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
# Warm-up ends mid-epoch, so the learning-rate schedule has a kink for a resume to get wrong.
TINY_RUN = (
    *"--arch mobilenet_v3_small --image-size 32 --batch-size 4 --device cpu --log-interval 1".split(),
    *"--warmup-epochs 0.5 --optimizer adamw --lr 0.005 --checkpoint-minutes 0 --keep-checkpoints 100".split(),
    *("--epochs", str(EPOCHS)),
)

# train.py sending itself SIGTERM during step SIGTERM_AT_STEP, in the process of rank SIGTERM_RANK (0 by default).
SIGTERM_DURING_STEP = """
import os, signal, sys
from torchlab import train
at_step, rank = int(os.environ["SIGTERM_AT_STEP"]), os.environ.get("SIGTERM_RANK", "0")
positions, train_one_epoch, train_step = [], train.train_one_epoch, train.train_step
def remember_position(training, loader, position, run):
    positions[:] = [position]
    return train_one_epoch(training, loader, position, run)
def signalling_step(*args):
    if positions[0].global_step + 1 == at_step and os.environ.get("RANK", "0") == rank:
        os.kill(os.getpid(), signal.SIGTERM)
    train_step(*args)
train.train_one_epoch, train.train_step = remember_position, signalling_step
train.main(sys.argv[1:])
"""


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory):
    """2 classes, 13 training and 2 validation JPEGs each: a run of 18 steps takes about a second."""
    from torchlab.tools import sample_data

    folder = tmp_path_factory.mktemp("tiny") / "data"
    sample_data.write_sample_data(str(folder), classes=2, per_class=13, val_per_class=2, seed=0)
    return folder


def checkpoint_steps(run_dir):
    return sorted(int(path.stem.split("-")[1]) for path in Path(run_dir).glob("checkpoint-*.pt"))


def stop_message(reason, step):
    """What train.py prints when `reason` stops it at `step`: at an epoch's last step, the epoch ends first."""
    epoch, step_in_epoch = divmod(step, STEPS_PER_EPOCH)
    where = f"at epoch {epoch}" if step_in_epoch else f"after epoch {epoch - 1}"
    return f"stopped by {reason} {where}, step {step}"


def run_with_sigterm_at(step, *args):
    env = {**TRAIN_ENV, "SIGTERM_AT_STEP": str(step)}
    command = [sys.executable, "-c", SIGTERM_DURING_STEP, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, check=False)


# ---------------------------------------------------------------- issue 30's reproductions


def test_sigterm_after_a_mid_epoch_resume_stops_at_the_next_step(tiny_set, tmp_path):
    """Stopped one step before an epoch's end and resumed: a SIGTERM during the next epoch's second step
    stops the run there. It ran on to that epoch's end: the stop test took the epoch for 6 - 5 steps long,
    the 5 steps the resume had skipped in the epoch before taken off again."""
    run_dir = tmp_path / "run"
    flags = ("--data", tiny_set, "--run-dir", run_dir, "--workers", "2", *TINY_RUN)
    first = run_with_sigterm_at(5, *flags)
    assert first.returncode == 0, first.stderr
    assert stop_message("SIGTERM", 5) in first.stdout

    resumed = run_with_sigterm_at(8, *flags)

    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from " in resumed.stdout
    assert stop_message("SIGTERM", 8) in resumed.stdout, resumed.stdout[-1500:]
    assert checkpoint_steps(run_dir) == [5, 6, 8]
    assert [record["step"] for record in read_metrics(run_dir, "interval")] == list(range(1, 9))


def test_max_steps_after_a_mid_epoch_resume_is_exact(tiny_set, tmp_path):
    run_dir = tmp_path / "run"
    flags = ("--data", tiny_set, "--run-dir", run_dir, "--workers", "2", *TINY_RUN)
    first = run_train(*flags, "--max-steps", "5")
    assert first.returncode == 0, first.stderr

    resumed = run_train(*flags, "--max-steps", "7")

    assert resumed.returncode == 0, resumed.stderr
    assert stop_message("--max-steps 7", 7) in resumed.stdout, resumed.stdout[-1500:]
    assert checkpoint_steps(run_dir) == [5, 6, 7]
    assert [record["step"] for record in read_metrics(run_dir, "interval")] == list(range(1, 8))


def test_the_interval_record_that_spans_a_stop_is_the_uninterrupted_runs(tiny_set, tmp_path):
    """--log-interval 5: the record at step 10 covers steps 7 to 10 (each epoch starts a new interval); stopped at
    step 8 and resumed, it still covers all four, the two before the stop kept in the checkpoint (it covered the
    resumed two only: issue 44)."""
    flags = ("--workers", "0", *TINY_RUN, "--log-interval", "5")
    reference = run_train("--data", tiny_set, "--run-dir", tmp_path / "reference", *flags)
    assert reference.returncode == 0, reference.stderr
    run_dir = tmp_path / "run"
    for max_steps in ("8", str(TOTAL_STEPS)):
        result = run_train("--data", tiny_set, "--run-dir", run_dir, *flags, "--max-steps", max_steps)
        assert result.returncode == 0, result.stderr

    fields = (*STEP_FIELDS, "bad_images")
    intervals = records(run_dir, "interval", fields)
    assert [record[0] for record in intervals] == [5, 10, 15]
    assert intervals == records(tmp_path / "reference", "interval", fields)


def test_torchrun_resume_after_sigterm_stops_at_max_steps_exactly(tiny_set, tmp_path):
    """Two processes, 6 steps an epoch (13 images each, in batches of 2): SIGTERM to rank 1 alone at step 3, then
    --max-steps 8 stops at step 8, not at the epoch's end (step 12), and every record (one each 2 steps, the one
    at step 4 spanning the stop) is the uninterrupted run's."""
    script = tmp_path / "train_with_sigterm.py"
    script.write_text(SIGTERM_DURING_STEP)
    env = {**TRAIN_ENV, "PYTHONPATH": str(ROOT), "SIGTERM_AT_STEP": "3", "SIGTERM_RANK": "1"}

    def torchrun(program, run_dir, *args):
        flags = ("--data", tiny_set, "--run-dir", run_dir, "--workers", "1", *TINY_RUN, "--batch-size", "2")
        result = run_torchrun(program, *flags, "--log-interval", "2", *args, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    run_dir = tmp_path / "run"
    first = torchrun(script, run_dir)
    assert checkpoint_steps(run_dir) == [3]
    resumed = torchrun(TRAIN_SCRIPT, run_dir, "--max-steps", "8")
    assert stop_message("--max-steps 8", 8) in resumed.stdout, resumed.stdout[-1500:]
    assert checkpoint_steps(run_dir) == [3, 6, 8]
    # Rank 0, which prints, got no signal itself: the vote stopped it (it said "stopped by --max-steps None").
    assert stop_message("a signal to another process", 3) in first.stdout, first.stdout[-1500:]

    torchrun(TRAIN_SCRIPT, tmp_path / "reference", "--max-steps", "8")
    intervals = read_metrics(run_dir, "interval")
    assert [record["step"] for record in intervals] == [2, 4, 6, 8]
    reference = read_metrics(tmp_path / "reference", "interval")
    assert [(r["loss"], r["accuracy"], r["lr"]) for r in intervals] == [
        (r["loss"], r["accuracy"], r["lr"]) for r in reference
    ]
    # Epoch 0's summary covers its 6 steps, the 4 before the resume too, each process's sums restored as they were.
    summary = records(run_dir, "epoch", EPOCH_FIELDS)
    assert summary == records(tmp_path / "reference", "epoch", EPOCH_FIELDS) and len(summary) == 1


# ---------------------------------------------------------------- generated interruptions


@dataclasses.dataclass(frozen=True)
class Interruption:
    """One stop of a run: `kind` is "SIGTERM" or "--max-steps"; `point` "step" (during step `number`, or
    --max-steps `number`), "epoch start" (as epoch `number`'s pass starts, before its first batch) or
    "validation" (during epoch `number`'s validation)."""

    kind: str
    point: str
    number: int

    @property
    def stop_step(self):
        """The step of the checkpoint it leaves: the step it falls in, ended; the epoch's end for a signal
        during its last step or its validation; the first step of an epoch whose start it interrupts."""
        if self.point == "step":
            return self.number
        if self.point == "validation":
            return (self.number + 1) * STEPS_PER_EPOCH
        return self.number * STEPS_PER_EPOCH + 1

    @property
    def reason(self):
        return "SIGTERM" if self.kind == "SIGTERM" else f"--max-steps {self.number}"


def every_interruption():
    """The interruptions a run can meet, in its order: as each epoch's pass starts (SIGTERM; --max-steps there
    is the last step's before it), during each step (SIGTERM, or --max-steps for that step) and during each
    epoch's validation (SIGTERM). None in the run's last step or last validation, which end it anyway."""
    interruptions = []
    for epoch in range(EPOCHS):
        if epoch > 0:
            interruptions.append(Interruption("SIGTERM", "epoch start", epoch))
        first = epoch * STEPS_PER_EPOCH
        for step in range(first + 1, min(first + STEPS_PER_EPOCH + 1, TOTAL_STEPS)):
            interruptions += [Interruption("SIGTERM", "step", step), Interruption("--max-steps", "step", step)]
        if epoch < EPOCHS - 1:
            interruptions.append(Interruption("SIGTERM", "validation", epoch))
    return interruptions


INTERRUPTIONS = every_interruption()


@st.composite
def interruption_plans(draw):
    """One or two interruptions, each drawn from those the run, resumed where the one before stopped it, can
    still meet: those that would stop it later (a run resumed at an epoch's boundary meets its start)."""
    plan, stopped_at = [], 0
    for _ in range(draw(st.integers(1, 2))):
        later = [interruption for interruption in INTERRUPTIONS if interruption.stop_step > stopped_at]
        if not later:  # stopped in the run's last steps
            break
        plan.append(draw(st.sampled_from(later)))
        stopped_at = plan[-1].stop_step
    return plan


@contextlib.contextmanager
def watched_run(batches, interruption=None):
    """train.main in this process, watched: each step's batch, as the model gets it, is digested into
    `batches` (a list of (global step, digest)); a SIGTERM `interruption` is sent where it says. One thread:
    the same floating-point results run after run. Signal handlers and train's functions are put back after."""
    saved = {name: getattr(train, name) for name in ("train_one_epoch", "train_step", "evaluate")}
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    threads = torch.get_num_threads()
    signal_at = (interruption.point, interruption.number) if interruption and interruption.kind == "SIGTERM" else None
    position = None

    def signal_if_at(*point):
        if point == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def train_one_epoch(training, train_loader, epoch_position, run):
        nonlocal position
        position = epoch_position
        if position.step_in_epoch == 0:
            signal_if_at("epoch start", position.epoch)
        return saved["train_one_epoch"](training, train_loader, epoch_position, run)

    def train_step(training, images, labels, meters):
        step = position.global_step + 1
        digest = hashlib.sha256(images.cpu().numpy().tobytes() + labels.cpu().numpy().tobytes()).hexdigest()
        batches.append((step, digest))
        signal_if_at("step", step)
        return saved["train_step"](training, images, labels, meters)

    def evaluate(*args):
        signal_if_at("validation", position.epoch)
        return saved["evaluate"](*args)

    train.train_one_epoch, train.train_step, train.evaluate = train_one_epoch, train_step, evaluate
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for name, function in saved.items():
            setattr(train, name, function)
        for number, handler in handlers.items():
            signal.signal(number, handler)


def tiny_args(tiny_set, run_dir, *args):
    return ["--data", str(tiny_set), "--run-dir", str(run_dir), "--workers", "0", *TINY_RUN, *map(str, args)]


class Reference:
    """The uninterrupted run: its run directory, and each step's batch as watched_run digests it."""

    def __init__(self, run_dir, batches):
        self.run_dir, self.batches = run_dir, batches

    def __repr__(self):  # short in Hypothesis's report of a failing example
        return f"Reference({self.run_dir})"


@pytest.fixture(scope="module")
def reference(tiny_set, tmp_path_factory):
    """The uninterrupted run, with a checkpoint after every step (--checkpoint-minutes 1e-11: always due)."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    batches = []
    with watched_run(batches):
        train.main(tiny_args(tiny_set, run_dir, "--checkpoint-minutes", "1e-11"))
    assert checkpoint_steps(run_dir) == list(range(1, TOTAL_STEPS + 1))
    return Reference(run_dir, batches)


def assert_same_state(state, expected, where):
    """Equal values, tensors equal element for element (the same dtype and shape), at any depth."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(state, torch.Tensor) and state.dtype == expected.dtype, where
        assert state.shape == expected.shape and torch.equal(state, expected), where
    elif isinstance(expected, dict):
        assert isinstance(state, dict) and state.keys() == expected.keys(), where
        for key in expected:
            assert_same_state(state[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert isinstance(state, list | tuple) and len(state) == len(expected), where
        for number, (item, expected_item) in enumerate(zip(state, expected, strict=True)):
            assert_same_state(item, expected_item, f"{where}[{number}]")
    else:
        assert state == expected, where


def checkpoint_state(run_dir, step):
    state = torch.load(Path(run_dir) / f"checkpoint-{step:08d}.pt", weights_only=True)
    del state["config"]  # the flags: --run-dir, --max-steps, --checkpoint-minutes differ
    for sums in ("epoch_sums", "interval_sums"):
        if state[sums] is not None:  # mid-epoch: the sums, not the timings (data wait, seconds) of the run
            state[sums] = state[sums][:, :4]
    return state


STEP_FIELDS = ("step", "epoch", "loss", "accuracy", "lr")
# An epoch's summary over all its steps, also those before a resume (images_per_sec and data_wait_frac are
# timings: they differ from run to run).
EPOCH_FIELDS = ("step", "epoch", "loss", "accuracy", "bad_images", "val_loss", "val_accuracy", "lr")


def records(run_dir, kind, fields):
    """The `fields` of each `kind` record in metrics.jsonl, in order."""
    return [[record[field] for field in fields] for record in read_metrics(run_dir, kind)]


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # the same examples in every run: CI stays stable
    database=None,  # the source is mounted read-only in the image
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan=interruption_plans())
# Issue 30's reproductions at this scale: stopped one step before an epoch's end, resumed, and stopped again
# in the next epoch, by SIGTERM during a step, by --max-steps, by SIGTERM as that epoch starts.
@example(plan=[Interruption("SIGTERM", "step", 5), Interruption("SIGTERM", "step", 8)])
@example(plan=[Interruption("--max-steps", "step", 5), Interruption("--max-steps", "step", 7)])
@example(plan=[Interruption("--max-steps", "step", 11), Interruption("SIGTERM", "epoch start", 2)])
def test_interrupted_and_resumed_runs_match_the_uninterrupted_run(tiny_set, reference, capsys, plan):
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "run"
        batches = []
        capsys.readouterr()
        for interruption in plan:
            max_steps = ("--max-steps", interruption.number) if interruption.kind == "--max-steps" else ()
            with watched_run(batches, interruption):
                train.main(tiny_args(tiny_set, run_dir, *max_steps))
            out = capsys.readouterr().out
            step = interruption.stop_step
            assert stop_message(interruption.reason, step) in out, (plan, interruption, out[-1500:])
            assert checkpoint_steps(run_dir)[-1] == step, (plan, interruption)
            assert checkpoint_state(run_dir, step)["global_step"] == step
        with watched_run(batches):
            train.main(tiny_args(tiny_set, run_dir))
        assert f"finished --epochs {EPOCHS} at step {TOTAL_STEPS}" in capsys.readouterr().out, plan

        # Each step trained once, in order, on the uninterrupted run's batch, as the model saw it.
        assert batches == reference.batches, plan
        # The same loss, accuracy and learning rate at every step; the same epoch summaries (training over the whole
        # epoch, validation) at each epoch's end.
        assert records(run_dir, "interval", STEP_FIELDS) == records(reference.run_dir, "interval", STEP_FIELDS), plan
        assert records(run_dir, "epoch", EPOCH_FIELDS) == records(reference.run_dir, "epoch", EPOCH_FIELDS), plan
        # Every checkpoint (each stop's and each epoch's end) holds the uninterrupted run's state at its step:
        # weights, optimiser, schedule, where in the run, RNG.
        stops = {interruption.stop_step for interruption in plan}
        ends = {epoch * STEPS_PER_EPOCH for epoch in range(1, EPOCHS + 1)}
        assert checkpoint_steps(run_dir) == sorted(stops | ends), plan
        for step in checkpoint_steps(run_dir):
            assert_same_state(
                checkpoint_state(run_dir, step), checkpoint_state(reference.run_dir, step), f"step {step}"
            )
