"""prepared.py: the packed copy, its splits, resuming an interrupted conversion, refusing a changed source."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import given_plan
from torchlab.data import decode, folder, prepared, splits
from torchlab.pipeline import loader
from torchlab.tools import doctor, prepare


@pytest.fixture(scope="module")
def prepared_set(sample_set, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("prepared") / "copy"
    assert prepared.prepare(str(sample_set), str(out_dir), processes=2)
    return out_dir


def original_paths(index):
    return [index.path(position) for position in range(len(index))]


def test_a_prepared_copy_keeps_classes_splits_labels_and_paths(sample_set, prepared_set):
    class_names, train_index, val_index = splits.load_splits(str(sample_set), 0.1, 0)
    prepared_names, prepared_train, prepared_val = splits.load_splits(str(prepared_set), 0.5, 7)

    assert prepared_names == class_names
    assert original_paths(prepared_train) == original_paths(train_index)
    assert original_paths(prepared_val) == original_paths(val_index)
    assert prepared_train.labels.tolist() == train_index.labels.tolist()
    assert sorted(path.name for path in prepared_set.iterdir()) == [prepared.DATA_FILE, prepared.INDEX_FILE]
    with Image.open(prepared_train.source(0)) as image:
        assert image.format == "JPEG" and min(image.size) == 256  # sample images are ~450 x 375


def test_prepared_samples_decode_the_same_in_workers(prepared_set):
    _, train_index, _ = splits.load_splits(str(prepared_set), 0.1, 0)
    dataset = decode.ImageDataset(train_index.subset(np.arange(16)), image_size=32, train=True, seed=0)

    def batches(workers):
        settings = given_plan(workers=workers, batch_size=8, persistent_workers=False)
        return [images for images, _, _ in loader.build_loader(dataset, settings, torch.device("cpu"), shuffle=True)]

    in_main_process, in_workers = batches(0), batches(2)
    assert len(in_main_process) == 2 and in_main_process[0].shape == (8, 32, 32, 3)
    assert all(torch.equal(a, b) for a, b in zip(in_main_process, in_workers, strict=True))


def test_an_empty_a_16_bit_and_a_too_long_image_are_kept_as_samples_that_read_as_they_do_unprepared(tmp_path):
    """libjpeg stores no side over 65500 px: such an image is scaled further down, not stored empty."""
    source = tmp_path / "source"
    for name, pixels in (
        ("long.png", np.full((4, 70_000, 3), 200, np.uint8)),
        ("deep.png", np.full((40, 60), 40_000, np.uint16)),
    ):
        (source / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(source / "a" / name)
    (source / "a" / "empty.jpg").write_bytes(b"")
    (source / "b").mkdir()
    Image.new("RGB", (60, 40), (10, 20, 30)).save(source / "b" / "good.jpg")
    assert prepared.prepare(str(source), str(tmp_path / "copy"), val_fraction=0, processes=1)

    _, train_index, _ = splits.load_splits(str(tmp_path / "copy"), 0, 0)
    dataset = decode.ImageDataset(train_index, image_size=32, train=False, seed=0)
    decoded = {os.path.basename(train_index.path(p)): dataset[(p, 0)][0] for p in range(len(train_index))}
    assert decoded["empty.jpg"] is None
    assert decoded["long.png"] is not None and abs(int(decoded["long.png"].mean()) - 200) <= 2
    assert abs(int(decoded["deep.png"].mean()) - round(40_000 / 257)) <= 2


def test_prepare_names_the_unreadable_images_it_kept(sample_set, tmp_path, capsys):
    # Issue 44: torchlab prepare copied unreadable files without a word.
    source = tmp_path / "source"
    shutil.copytree(sample_set, source)
    broken = sorted((source / "val" / "class_01").glob("*.JPEG"))[:2]
    for path in broken:
        path.write_bytes(path.read_bytes()[:300])
    prepare.main([str(source), str(tmp_path / "copy")])
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("2 unreadable images kept as empty samples (train.py skips and names them): "), line
    assert all(str(path) in line for path in broken)


class Interrupted(RuntimeError):
    pass


def test_an_interrupted_conversion_is_never_read_and_resumes_to_the_same_bytes(
    sample_set, prepared_set, tmp_path, monkeypatch
):
    out_dir = tmp_path / "copy"
    convert = prepared.resized_jpeg
    stop_at = original_paths(splits.load_splits(str(sample_set), 0.1, 0)[1])[40]

    def interrupted(path, *settings):
        if path == stop_at:
            raise Interrupted
        return convert(path, *settings)

    monkeypatch.setattr(prepared, "CHECKPOINT_IMAGES", 16)
    monkeypatch.setattr(prepared, "resized_jpeg", interrupted)  # the forked pool's processes inherit it
    with pytest.raises(Interrupted):
        prepared.prepare(str(sample_set), str(out_dir), processes=1)
    with pytest.raises(folder.DataError, match="unfinished prepared copy"):
        splits.load_splits(str(out_dir), 0.1, 0)
    progress = json.loads((out_dir / prepared.PROGRESS_FILE).read_text())
    assert progress["images"] == 32  # the last record before image 40
    with (out_dir / prepared.DATA_FILE).open("ab") as data_file:
        data_file.write(b"half an image")  # written after the last progress record: dropped on resume

    monkeypatch.setattr(prepared, "resized_jpeg", convert)
    assert prepared.prepare(str(sample_set), str(out_dir), processes=1)
    assert (out_dir / prepared.DATA_FILE).read_bytes() == (prepared_set / prepared.DATA_FILE).read_bytes()
    assert not prepared.prepare(str(sample_set), str(out_dir), processes=1)  # finished: nothing to do


def test_a_copy_whose_source_changed_is_refused(sample_set, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(sample_set, source)
    prepared.prepare(str(source), str(tmp_path / "copy"), processes=1)
    splits.load_splits(str(tmp_path / "copy"), 0.1, 0)

    victim = next((source / "train" / "class_00").iterdir())
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(folder.DataError, match="has changed since it was prepared"):
        splits.load_splits(str(tmp_path / "copy"), 0.1, 0)
    check = doctor.check_data(str(tmp_path / "copy"), batch_size=16, val_fraction=0.1, seed=0)
    assert check.status == doctor.FAIL and check.fix == f"prepare it again: torchlab prepare {source} NEW_FOLDER"


def test_a_folder_that_is_not_a_prepared_copy_is_never_written_into(sample_set, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(sample_set, source)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / prepared.DATA_FILE).write_bytes(b"someone else's data")  # prepare would truncate its own
    file = tmp_path / "file"
    file.write_bytes(b"")
    refusals = {
        source: "inside its source",
        source / "train": "inside its source",
        theirs: "exists and is not a prepared copy",
        file: "a file, not a folder",
        file / "copy": "is a file, not a folder",
    }
    before = {path: path.read_bytes() for path in source.rglob("*") if path.is_file()}
    for out_dir, message in refusals.items():
        with pytest.raises(folder.DataError, match=message):
            prepared.prepare(str(source), str(out_dir), processes=1)
    assert {path: path.read_bytes() for path in source.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in source.rglob("*") if path.is_dir()) == sorted(
        path.name for path in sample_set.rglob("*") if path.is_dir()
    )
    assert (theirs / prepared.DATA_FILE).read_bytes() == b"someone else's data"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--quality", "0"), "argument --quality: expected an integer >= 1 and <= 100, got '0'"),
        (("--short-side", "-5"), "argument --short-side: expected an integer > 0 and <= 4096, got '-5'"),
        (("--val-fraction", "1.5"), "argument --val-fraction: expected a number >= 0 and < 1, got '1.5'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_code_2(sample_set, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        prepare.main([str(sample_set), str(tmp_path / "copy"), *flags])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"torchlab prepare: error: {message}")
    assert not (tmp_path / "copy").exists()


def test_a_missing_source_is_one_line_naming_it_without_a_data_flag(tmp_path, capsys):
    """prepare has no --data: the line said "--data SOURCE: no such folder"."""
    source = tmp_path / "absent"
    with pytest.raises(SystemExit) as exit_info:
        prepare.main([str(source), str(tmp_path / "copy")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"torchlab prepare: error: {source}: no such folder; mount your images there")
    assert error.count("\n") == 1 and "--data" not in error
    assert not (tmp_path / "copy").exists()
