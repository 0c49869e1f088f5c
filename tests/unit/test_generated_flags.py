"""Property-based bad input for train.py: for any generated mix of flags it either trains (and leaves a
checkpoint) or exits with code 2 and one line that names what was wrong, never a traceback and never a run
directory written halfway.

Each example mixes flags with values train.py accepts (from ranges a test runs in seconds) and, half the
time, one flag with generated text, which it may accept or must refuse. Left out: --compile (minutes on two
cores; test_model.py), --autotune-seconds (read by torchlab autotune only) and --weights with a real file
(test_model.py).
"""

import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchlab import train

junk = st.one_of(
    st.text(alphabet=string.printable, max_size=10),
    st.sampled_from(["", " ", "-1", "0", "nan", "inf", "-inf", "1e309", "0x10", "1_000", "٣", "10" * 12, "--"]),
    st.integers(-(10**30), 10**30).map(str),
)
small_int = st.integers(min_value=1, max_value=4).map(str)
number = st.floats(min_value=0, max_value=1000, exclude_min=True).map(repr)
share = st.floats(min_value=0, max_value=0.999).map(repr)

# flag -> values train.py accepts, drawn from a range a test runs in seconds; None: a switch.
VALID = {
    "--workers": st.one_of(st.just("auto"), st.integers(0, 2).map(str)),
    "--prefetch-factor": small_int,
    "--jpeg-draft": None,
    "--no-jpeg-draft": None,
    "--no-persistent-workers": None,
    "--pin-memory": None,
    "--image-size": st.integers(1, 64).map(str),
    "--max-bad-images": st.integers(0, 10**30).map(str),
    "--batch-size": st.integers(1, 120).map(str),  # 96 training images: above that, no full batch
    "--epochs": small_int,
    "--arch": st.sampled_from(["mobilenet_v3_small", "resnet18", "squeezenet1_1"]),
    "--optimizer": st.sampled_from(["sgd", "adamw"]),
    "--lr": number,
    "--momentum": share,
    "--weight-decay": number,
    "--warmup-epochs": st.floats(0, 4).map(repr),
    "--label-smoothing": share,
    "--amp": st.sampled_from(["auto", "bf16", "fp16", "off"]),
    "--device": st.sampled_from(["auto", "cpu", "cuda"]),
    "--seed": st.integers(0, 2**32 - 1).map(str),
    "--log-interval": st.integers(1, 10**30).map(str),
    "--checkpoint-minutes": st.floats(0, 1e308).map(repr),
    "--keep-checkpoints": small_int,
    "--resume": st.sampled_from(["auto", "none"]),
    "--loader-only": None,
}
TAKES_VALUE = sorted(flag for flag, values in VALID.items() if values is not None)


@st.composite
def flag_lists(draw):
    """Some flags with accepted values and, half the time, one flag with generated text in any position."""
    chosen = draw(st.lists(st.sampled_from(sorted(VALID)), unique=True, max_size=6))
    flags = [(flag,) if VALID[flag] is None else (flag, draw(VALID[flag])) for flag in chosen]
    if draw(st.booleans()):
        flag = draw(st.sampled_from(TAKES_VALUE))
        flags.insert(draw(st.integers(0, len(flags))), (flag, draw(junk)))
    return flags


def run_with_fixed_flags(sample_set, scratch, argv):
    """train.main with small fixed flags, then `argv`: (exit code, stdout, stderr, run dir)."""
    run_dir = Path(scratch) / "run"
    fixed = ["--data", str(sample_set), "--run-dir", str(run_dir), "--max-steps", "2", "--log-interval", "1"]
    fixed += ["--autotune-file", str(Path(scratch) / "autotune.json"), "--device", "cpu", "--workers", "0"]
    fixed += ["--arch", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "16", "--epochs", "1"]
    # The generated flags come last: where they repeat a fixed one, theirs is the value used.
    try:
        train.main([*fixed, *argv])
        code = 0
    except SystemExit as stop:
        code = stop.code
    return code, run_dir


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--workers", "2", "--prefetch-factor", "1", "--no-jpeg-draft"],
        ["--optimizer", "sgd", "--lr", "0.5", "--amp", "fp16", "--seed", "7", "--label-smoothing", "0"],
        ["--loader-only", "--batch-size", "8"],
    ],
)
def test_accepted_flags_train(sample_set, capsys, signal_handlers_restored, argv):
    """The control for the property below: flags it draws from VALID do train (a train.py that refused
    everything with one clear line would pass the property test alone)."""
    with tempfile.TemporaryDirectory() as scratch:
        code, run_dir = run_with_fixed_flags(sample_set, scratch, argv)
        out, err = capsys.readouterr()
        assert code == 0, err
        assert list(run_dir.glob("checkpoint-*.pt")) or "loader-only: " in out


@settings(
    # Each example is a whole run of train.py (over a second here), in each flavour's CI run: 100 draw each flag
    # with accepted values about 12 times on average, and with generated text about twice.
    max_examples=100,
    deadline=None,
    database=None,  # the source is mounted read-only in the image
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(flags=flag_lists())
def test_any_flags_train_or_fail_with_one_clear_line(sample_set, capsys, signal_handlers_restored, flags):
    argv = [part for flag in flags for part in flag]

    with tempfile.TemporaryDirectory() as scratch:
        code, run_dir = run_with_fixed_flags(sample_set, scratch, argv)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        if code == 0:
            assert "--loader-only" in argv or list(run_dir.glob("checkpoint-*.pt")), (argv, out, err)
        else:
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1, (argv, code, err)
            assert lines[0].startswith("train.py: error: "), (argv, err)
            # The line names what was wrong: one of the generated flags (the fixed ones are all accepted).
            assert any(flag[0] in lines[0] for flag in flags), (argv, err)
            assert not run_dir.exists(), (argv, err)
