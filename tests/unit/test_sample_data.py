"""sample_data.py: a deterministic, realistic ImageFolder, written atomically."""

import hashlib
import subprocess

import pytest
from PIL import Image

from conftest import torchlab_command
from torchlab.tools import bench_data, sample_data


def digest(folder):
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    return hashlib.sha256(b"".join(str(path.relative_to(folder)).encode() + path.read_bytes() for path in files))


def test_layout_sizes_and_determinism(tmp_path):
    assert sample_data.write_sample_data(str(tmp_path / "a"), classes=3, per_class=4, val_per_class=2, seed=5)
    sample_data.write_sample_data(str(tmp_path / "b"), classes=3, per_class=4, val_per_class=2, seed=5)
    sample_data.write_sample_data(str(tmp_path / "c"), classes=3, per_class=4, val_per_class=2, seed=6)

    for split, count in (("train", 4), ("val", 2)):
        class_folders = sorted((tmp_path / "a" / split).iterdir())
        assert [folder.name for folder in class_folders] == ["class_00", "class_01", "class_02"]
        assert all(len(list(folder.glob("*.JPEG"))) == count for folder in class_folders)
    with Image.open(next((tmp_path / "a" / "train" / "class_01").glob("*.JPEG"))) as image:
        assert image.format == "JPEG" and image.mode == "RGB"
        assert 400 <= image.width <= 500 and 350 <= image.height <= 400
    assert digest(tmp_path / "a").digest() == digest(tmp_path / "b").digest()
    assert digest(tmp_path / "a").digest() != digest(tmp_path / "c").digest()


def test_runs_as_a_script_and_leaves_a_complete_set_alone(tmp_path):
    out = tmp_path / "set"
    command = torchlab_command("sample-data", out, "--classes", "2", "--per-class", "2")

    first = subprocess.run(command, capture_output=True, text=True, check=True)
    before = digest(out).digest()
    second = subprocess.run(command, capture_output=True, text=True, check=True)

    assert "wrote" in first.stdout and "already complete" in second.stdout
    assert digest(out).digest() == before
    assert [path.name for path in tmp_path.iterdir()] == ["set"]  # no temporary folder left beside it


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def fail_in_val(folder, split, *args):
        if split == "val":
            raise KeyboardInterrupt
        original_write_split(folder, split, *args)

    original_write_split = sample_data.write_split
    monkeypatch.setattr(sample_data, "write_split", fail_in_val)
    with pytest.raises(KeyboardInterrupt):
        sample_data.write_sample_data(str(tmp_path / "set"), classes=2, per_class=1, val_per_class=1, seed=0)

    assert list(tmp_path.iterdir()) == []


def test_a_folder_it_cannot_write_in_is_one_line(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    result = subprocess.run(
        torchlab_command("sample-data", str(tmp_path / "file" / "samples")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"torchlab sample-data: error: {tmp_path}/file/samples: {tmp_path}/file is a file, not a folder\n"
    )


def test_a_file_where_the_folder_would_go_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    (tmp_path / "afile").write_bytes(b"keep")
    monkeypatch.setattr(sample_data, "write_split", lambda *args: pytest.fail("generated data"))
    with pytest.raises(SystemExit) as exit_info:
        sample_data.main([str(tmp_path / "afile")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"torchlab sample-data: error: {tmp_path}/afile is a file, not a folder\n"
    assert [path.name for path in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_bytes() == b"keep"


@pytest.mark.parametrize(
    ("main", "flags", "message"),
    [
        (sample_data.main, ("--classes", "0"), "argument --classes: expected an integer > 0, got '0'"),
        (sample_data.main, ("--per-class", "two"), "argument --per-class: expected an integer > 0, got 'two'"),
        (sample_data.main, ("--val-per-class", "-1"), "argument --val-per-class: expected an integer >= 0, got '-1'"),
        (sample_data.main, ("--seed", "-1"), "argument --seed: expected an integer >= 0 and < 4294967296, got '-1'"),
        (bench_data.main, ("--seed", "-1"), "argument --seed: expected an integer >= 0 and < 4294967296, got '-1'"),
        (bench_data.main, ("--seed", "2**40"), "argument --seed: expected an integer >= 0 and < 4294967296"),
    ],
)
def test_the_generators_refuse_a_bad_count_or_seed_in_one_line(tmp_path, capsys, main, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "out"), *flags], prog="gen")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"gen: error: {message}")
    assert not (tmp_path / "out").exists()
