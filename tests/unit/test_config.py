"""config.py: the parser made from TrainConfig, --config files, and resolve()."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from conftest import QUICK_RUN, ROOT, TRAIN_ENV, run_train
from torchlab import config, distributed, resolve


def test_every_flag_has_its_default_and_help_from_the_dataclass():
    parser = config.build_parser()
    for field in config.FLAGS:
        assert parser.get_default(field.name) == field.default, field.name
        assert "default" in field.metadata["help"], field.name
    assert config.parse_args([]) == config.TrainConfig()
    assert config.parse_args(["--batch-size", "8", "--no-jpeg-draft"]).batch_size == 8


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_config_file_sets_defaults_and_the_command_line_wins(tmp_path, suffix):
    path = tmp_path / f"defaults{suffix}"
    values = {"arch": "resnet18", "batch-size": 128, "jpeg_draft": False, "lr": 0.5}
    path.write_text(
        json.dumps(values) if suffix == ".json" else "".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items())
    )
    flags = config.parse_args(["--config", str(path), "--batch-size", "16"])
    assert (flags.arch, flags.batch_size, flags.jpeg_draft, flags.lr) == ("resnet18", 16, False, 0.5)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.json", '{"no-such-flag": 1}', "'no-such-flag' is not a flag of train.py"),
        ("bad.json", '{"batch-size": 0}', "batch-size: expected an integer > 0, got '0'"),
        ("bad.json", '{"amp": "fp8"}', "amp: expected one of auto, bf16, fp16, off"),
        ("bad.json", '{"compile": "yes"}', "compile: expected true or false"),
        ("bad.json", "[1, 2]", "expected a mapping of flag names to values"),
        ("bad.json", "{not json", "--config"),
        ("bad.yaml", "not: [yaml", "not valid YAML: expected ',' or ']', but got '<stream end>' at line 1, column 11"),
        ("bad.yml", "a: b: c", "not valid YAML: mapping values are not allowed here at line 1, column 5"),
        ("null.yaml", "run-dir: null", "run-dir: null is not a value for it: expected a string, or remove the line"),
    ],
)
def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path, sample_set, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    result = run_train("--config", path, "--data", sample_set, "--run-dir", tmp_path / "run", *QUICK_RUN)
    assert result.returncode == 2
    assert result.stderr.startswith("train.py: error: --config ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("data", "a string, or remove the line for the default (/data)"),
        ("run-dir", f"a string, or remove the line for the default ({config.DEFAULT_RUN_DIR})"),
        ("resume", "a string, or remove the line for the default (auto)"),
        ("workers", "auto or an integer >= 0, or remove the line for the default (auto)"),
        ("epochs", "an integer > 0, or remove the line for the default (90)"),
        ("image-size", "an integer > 0 and <= 4096, or remove the line for the default (224)"),
        ("decode", "one of auto, cpu, gpu, or remove the line for the default (auto)"),
    ],
)
def test_null_is_refused_where_the_flag_has_a_default(tmp_path, key, expected):
    """These ended in a TypeError from deep inside the run (zeros(), '>' on None, a str expected)."""
    path = tmp_path / "defaults.yaml"
    path.write_text(f"{key}: null\n")
    with pytest.raises(config.ConfigError) as error:
        config.parse_args(["--config", str(path)])
    assert str(error.value) == f"--config {path}: {key}: null is not a value for it: expected {expected}"


def test_null_is_the_default_where_that_is_none(tmp_path):
    path = tmp_path / "defaults.yaml"
    path.write_text("weights: null\nmax-steps: null\nlr: null\n")
    flags = config.parse_args(["--config", str(path)])
    assert (flags.weights, flags.max_steps, flags.lr) == (None, None, None)


def test_resolve_finds_what_the_flags_need_and_leaves_them_as_asked(tmp_path):
    flags = config.parse_args(["--run-dir", str(tmp_path / "run"), "--device", "cpu", "--autotune-file", "/dev/null"])
    setup = resolve.resolve(flags, distributed.Processes())
    assert setup == resolve.Setup("cpu", "off", pytest.approx(0.1 * 64 / 256), None)
    assert (flags.device, flags.amp, flags.lr, flags.workers, flags.loader) == ("cpu", "auto", None, "auto", "auto")


def test_a_train_config_holds_only_the_flags_and_cannot_be_changed():
    flags = config.parse_args([])
    assert all(field.metadata["group"] for field in dataclasses.fields(flags))
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.workers = 2


def test_python_m_torchlab_train_is_train_py():
    result = subprocess.run(
        [sys.executable, "-m", "torchlab.train", "--help"],
        capture_output=True,
        text=True,
        env=TRAIN_ENV,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: train.py ")
    assert len((ROOT / "train.py").read_text().strip().splitlines()) <= 3  # the shim: an import and a call


CAPTURE = {"capture_output": True, "text": True, "cwd": ROOT}


def test_autotunes_file_is_on_the_work_volume_where_the_start_names_one(tmp_path):
    # Issue 44: in ~/.cache, what autotune saved was lost with the container.
    probe = [sys.executable, "-c", "from torchlab import config; print(config.AUTOTUNE_FILE)"]
    on_volume = subprocess.run(probe, env={**os.environ, "TORCHLAB_WORK_DIR": str(tmp_path)}, check=True, **CAPTURE)
    assert on_volume.stdout.strip() == f"{tmp_path}/.cache/torchlab/autotune.json"
    elsewhere = {name: value for name, value in os.environ.items() if name != "TORCHLAB_WORK_DIR"}
    default = subprocess.run(probe, env=elsewhere, check=True, **CAPTURE).stdout.strip()
    assert default == "~/.cache/torchlab/autotune.json"
