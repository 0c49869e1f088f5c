"""data/: finding the samples, holding them compactly, decoding with draft mode, unreadable files."""

import functools
import os
import random

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from torchlab.data import decode, folder, splits
from torchlab.tools import doctor, prepare, sample_data


def save_image(path, mode="RGB", size=(60, 40), **save_options):
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = {"RGB": (200, 30, 30), "RGBA": (200, 30, 30, 128), "CMYK": (0, 200, 200, 0), "LA": (90, 255)}
    Image.new(mode, size, colour.get(mode, 90)).save(path, **save_options)


def relative_paths(index, root):
    return sorted(os.path.relpath(index.path(position), root) for position in range(len(index)))


def test_hidden_entries_are_skipped_and_extensions_match_in_any_case(tmp_path):
    for name in ("cat/a.JPEG", "cat/b.jpg", "cat/nested/c.Png", "cat/d.webp", "dog/e.BMP", "dog/f.jpeg"):
        save_image(tmp_path / name)
    for hidden in (".ipynb_checkpoints/x.jpg", "cat/.ipynb_checkpoints/y.jpg", "cat/.z.jpg"):
        save_image(tmp_path / hidden)
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")

    class_names, train_index, val_index = splits.load_splits(str(tmp_path), val_fraction=0.0, seed=0)

    assert class_names == ["cat", "dog"]
    assert len(val_index) == 0
    assert relative_paths(train_index, tmp_path) == [
        "cat/a.JPEG",
        "cat/b.jpg",
        "cat/d.webp",
        "cat/nested/c.Png",
        "dog/e.BMP",
        "dog/f.jpeg",
    ]
    assert train_index.labels.tolist() == [0, 0, 0, 0, 1, 1]


def test_one_folder_is_split_by_seed(tmp_path):
    for number in range(40):
        save_image(tmp_path / f"class_{number % 2}" / f"{number:02d}.png")

    _, train_index, val_index = splits.load_splits(str(tmp_path), val_fraction=0.25, seed=1)
    _, train_again, val_again = splits.load_splits(str(tmp_path), val_fraction=0.25, seed=1)
    _, _, val_other_seed = splits.load_splits(str(tmp_path), val_fraction=0.25, seed=2)

    assert (len(train_index), len(val_index)) == (30, 10)
    assert not set(relative_paths(train_index, tmp_path)) & set(relative_paths(val_index, tmp_path))
    assert relative_paths(val_again, tmp_path) == relative_paths(val_index, tmp_path)
    assert relative_paths(train_again, tmp_path) == relative_paths(train_index, tmp_path)
    assert relative_paths(val_other_seed, tmp_path) != relative_paths(val_index, tmp_path)


def test_train_and_val_folders_share_the_class_labels(tmp_path):
    for name in ("train/ant/1.jpg", "train/bee/2.jpg", "train/cow/3.jpg", "val/bee/4.jpg"):
        save_image(tmp_path / name)

    class_names, train_index, val_index = splits.load_splits(str(tmp_path), val_fraction=0.5, seed=0)

    assert class_names == ["ant", "bee", "cow"]
    assert len(train_index) == 3
    assert val_index.labels.tolist() == [1]

    save_image(tmp_path / "val" / "dog" / "5.jpg")
    with pytest.raises(folder.DataError, match="val/dog: a class that the training set does not have"):
        splits.load_splits(str(tmp_path), val_fraction=0.5, seed=0)


@pytest.mark.parametrize(
    ("images", "other_files", "val_fraction", "message"),
    [
        ((), (), 0.1, "no class folders"),
        (("cat/a.jpg",), ("dog/notes.txt",), 0.1, "dog: a class folder with no images"),
        (("cat/a.jpg",), (), 0.9, "leaves no training images"),
    ],
)
def test_unusable_data_is_a_data_error(tmp_path, images, other_files, val_fraction, message):
    for name in images:
        save_image(tmp_path / name)
    for name in other_files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("not an image")

    with pytest.raises(folder.DataError, match=message):
        splits.load_splits(str(tmp_path), val_fraction=val_fraction, seed=0)


def test_missing_data_folder_says_how_to_mount_it(tmp_path):
    with pytest.raises(folder.DataError, match=r"no such folder.*-v /path/to/images:"):
        splits.load_splits(str(tmp_path / "absent"), val_fraction=0.1, seed=0)


def test_a_link_back_to_a_folder_being_walked_is_not_followed(tmp_path):
    """a/up -> .. would list every image again and again (and b's under a) until the OS says ELOOP."""
    for name in ("a/1.jpg", "a/nested/2.jpg", "b/3.jpg"):
        save_image(tmp_path / name)
    (tmp_path / "a" / "up").symlink_to("..")
    (tmp_path / "a" / "nested" / "self").symlink_to(".")
    (tmp_path / "b" / "sibling").symlink_to("../a/nested")  # not a loop: followed

    class_names, train_index, _ = splits.load_splits(str(tmp_path), val_fraction=0.0, seed=0)

    assert class_names == ["a", "b"]
    assert relative_paths(train_index, tmp_path) == ["a/1.jpg", "a/nested/2.jpg", "b/3.jpg", "b/sibling/2.jpg"]
    assert train_index.labels.tolist() == [0, 0, 1, 1]


def unreadable_folder(root):
    if os.geteuid() == 0:
        pytest.skip("root reads any folder")
    (root / "a" / "secret").chmod(0)
    return "a/secret: not readable by UID {uid}; on the host: chmod -R a+rX on that folder"


def looping_link(root):
    (root / "a" / "x.jpg").symlink_to("x.jpg")
    return "a/x.jpg: a symlink loop; remove the link"


@pytest.mark.parametrize("spoil", [unreadable_folder, looping_link])
def test_an_unlistable_entry_is_one_line_naming_it_for_train_and_prepare(tmp_path, capsys, spoil):
    for name in ("a/1.jpg", "a/secret/2.jpg", "b/3.jpg"):
        save_image(tmp_path / "data" / name)
    message = f"{tmp_path}/data/{spoil(tmp_path / 'data')}".format(uid=os.getuid())
    try:
        with pytest.raises(folder.DataError) as error:
            splits.load_splits(str(tmp_path / "data"), val_fraction=0.0, seed=0)
        assert str(error.value) == message
        with pytest.raises(SystemExit) as exit_info:
            prepare.main([str(tmp_path / "data"), str(tmp_path / "prepared")])
    finally:
        (tmp_path / "data" / "a" / "secret").chmod(0o755)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"torchlab prepare: error: {message}\n"
    assert not (tmp_path / "prepared").exists()


@pytest.mark.parametrize(
    ("images", "layout", "classes", "indexed"),
    [
        (("dog/1.jpg", "train/2.jpg"), "single", ["dog", "train"], 2),
        (("dog/1.jpg", "train/2.jpg", "val/3.jpg"), "single", ["dog", "train", "val"], 3),
        (("cat/1.jpg", "val/2.jpg", "val/nested/3.jpg"), "single", ["cat", "val"], 3),
        # a split holds class folders: an image beside them is in no class
        (("train/dog/1.jpg", "train/cover.jpg", "train/val/2.jpg"), "train", ["dog", "val"], 2),
        (("train/dog/1.jpg", "train/cat/2.jpg", "val/cat/3.jpg"), "train_val", ["cat", "dog"], 3),
    ],
)
def test_train_and_val_are_splits_only_when_they_hold_class_folders(tmp_path, images, layout, classes, indexed):
    """'train' is a class of PASCAL VOC: DATA/train/IMAGE beside DATA/dog/IMAGE is a class like dog."""
    for name in images:
        save_image(tmp_path / name)

    class_names, train_index, val_index = splits.load_splits(str(tmp_path), val_fraction=0.0, seed=0)

    assert (splits.data_layout(str(tmp_path)), class_names) == (layout, classes)
    assert len(train_index) + len(val_index) == indexed


def test_a_val_folder_of_images_beside_a_train_split_is_a_data_error_and_an_empty_one_is_absent(tmp_path):
    """Its images were ignored without a word, and --val-fraction of train/ held out in their place."""
    for name in ("train/dog/1.jpg", "train/cat/2.jpg", "val/3.jpg"):
        save_image(tmp_path / name)

    with pytest.raises(folder.DataError) as error:
        splits.load_splits(str(tmp_path), val_fraction=0.5, seed=0)

    assert error.value.problem == f"{tmp_path}/val: holds no class folders, while {tmp_path}/train does"
    assert error.value.fix == (
        f"put its images in class folders as in train/ ({tmp_path}/val/CLASS_NAME/IMAGE.jpg), "
        "or remove it to hold out --val-fraction of train/"
    )
    check = doctor.check_data(str(tmp_path), batch_size=1, val_fraction=0.5, seed=0)
    assert (check.status, check.detail, check.fix) == (doctor.FAIL, error.value.problem, error.value.fix)
    assert splits.data_layout(str(tmp_path)) == "train"

    (tmp_path / "val" / "3.jpg").unlink()  # no images at all: as if there were no val/
    _, train_index, val_index = splits.load_splits(str(tmp_path), val_fraction=0.5, seed=0)
    assert (len(train_index), len(val_index), splits.data_layout(str(tmp_path))) == (1, 1, "train")


def test_index_holds_one_buffer_not_one_object_per_sample():
    paths = [f"/data/train/n{number % 1000:08d}/n{number:08d}_{number}.JPEG" for number in range(50_000)]
    index = folder.SampleIndex(paths, [number % 1000 for number in range(50_000)])

    assert [index.path(position) for position in (0, 12_345, 49_999)] == [paths[0], paths[12_345], paths[49_999]]
    arrays = (index.path_bytes, index.offsets, index.labels)
    assert all(isinstance(array, np.ndarray) and array.dtype != object for array in arrays)
    assert set(vars(index)) == {"path_bytes", "offsets", "labels"}


@pytest.mark.parametrize(
    ("mode", "file_name"),
    [("L", "grey.png"), ("P", "palette.png"), ("RGBA", "alpha.png"), ("CMYK", "cmyk.jpg"), ("LA", "grey_alpha.png")],
)
def test_every_colour_mode_becomes_rgb(tmp_path, mode, file_name):
    save_image(tmp_path / file_name, mode=mode)
    index = folder.SampleIndex([str(tmp_path / file_name)], [0])

    for train in (True, False):
        pixels, label, position = decode.ImageDataset(index, image_size=32, train=train, seed=0)[(0, 0)]
        assert (pixels.shape, pixels.dtype, label, position) == ((32, 32, 3), np.uint8, 0, 0)


def test_unreadable_images_come_back_as_markers(tmp_path):
    save_image(tmp_path / "good.jpg")
    (tmp_path / "text.jpg").write_text("not a JPEG")
    full = (tmp_path / "good.jpg").read_bytes()
    (tmp_path / "truncated.jpg").write_bytes(full[: len(full) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    Image.fromarray(np.full((40, 60), 0.5, dtype=np.float32)).save(tmp_path / "float.tif")
    names = ("good.jpg", "text.jpg", "truncated.jpg", "empty.jpg", "float.tif")
    index = folder.SampleIndex([str(tmp_path / name) for name in names], list(range(len(names))))
    dataset = decode.ImageDataset(index, image_size=32, train=True, seed=0)

    assert dataset[(0, 0)][0] is not None
    assert [dataset[(position, 0)] for position in range(1, len(names))] == [(None, p, p) for p in range(1, 5)]
    assert "floating-point samples" in decode.unreadable_reason(str(tmp_path / "float.tif"))
    assert decode.unreadable_reason(str(tmp_path / "text.jpg")).startswith("not an image Pillow can read")


@pytest.mark.parametrize(
    ("file_name", "dtype"), [("grey16.png", np.uint16), ("grey16.tif", np.uint16), ("int.tif", np.int32)]
)
def test_16_bit_samples_are_scaled_to_8_bits_not_clipped(tmp_path, file_name, dtype):
    """Pillow's own conversion to RGB would make every 16-bit sample above 255 white."""
    Image.fromarray(np.full((40, 60), 40_000, dtype=dtype)).save(tmp_path / file_name)
    with Image.open(tmp_path / file_name) as image:
        assert image.mode.startswith("I")

    for train in (True, False):
        index = folder.SampleIndex([str(tmp_path / file_name)], [0])
        pixels, _, _ = decode.ImageDataset(index, image_size=32, train=train, seed=0)[(0, 0)]
        assert np.abs(pixels.astype(int) - round(40_000 / 257)).max() <= 1


def test_augmentation_depends_on_seed_epoch_and_sample_only(tmp_path):
    photo = Image.fromarray(sample_data.class_image(np.random.default_rng(0), 1, 4))
    photo.save(tmp_path / "photo.jpg", quality=95)
    index = folder.SampleIndex([str(tmp_path / "photo.jpg")], [0])
    dataset = decode.ImageDataset(index, image_size=32, train=True, seed=7)

    first = dataset[(0, 3)]
    assert np.array_equal(first[0], dataset[(0, 3)][0])
    assert not np.array_equal(first[0], dataset[(0, 4)][0])
    assert not np.array_equal(first[0], decode.ImageDataset(index, 32, train=True, seed=8)[(0, 3)][0])


@pytest.mark.parametrize(("path", "tolerance"), [("pillow", 2.0), ("region", 2.5)])
def test_draft_decoding_matches_full_decoding(tmp_path, monkeypatch, path, tolerance):
    """Both decoding paths shrink a large JPEG in the DCT (Pillow's draft; the region decoder's scale) and
    stay within a mean of `tolerance` levels of a full decode (the region path also rounds the box to whole
    pixels at that scale and resizes with torch's filter)."""
    if path == "region" and decode.torchlab_jpeg is None:
        pytest.skip("the region decoder is not built here")
    # A 1600 x 1200 photo-like JPEG: the generated texture, enlarged.
    texture = Image.fromarray(sample_data.class_image(np.random.default_rng(3), 2, 4))
    texture.resize((1600, 1200), Image.Resampling.BICUBIC).save(tmp_path / "photo.jpg", quality=95)
    draft_scales = []
    if path == "pillow":
        monkeypatch.setattr(decode, "torchlab_jpeg", None)
        original_draft = JpegImagePlugin.JpegImageFile.draft

        def recording_draft(image, mode, size):
            full_width = image.size[0]
            result = original_draft(image, mode, size)
            draft_scales.append(full_width / result[1][2])
            return result

        monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", recording_draft)
    else:
        original_scale = decode.draft_scale

        def recording_scale(*args):
            draft_scales.append(original_scale(*args))
            return draft_scales[-1]

        monkeypatch.setattr(decode, "draft_scale", recording_scale)
    random_box = functools.partial(decode.random_resized_crop_box, rng=random.Random(5))
    for choose_box in (decode.center_crop_box, random_box):
        box = choose_box(1600, 1200)
        drafted = decode.load_crop(str(tmp_path / "photo.jpg"), lambda width, height, box=box: box, 224)
        with Image.open(tmp_path / "photo.jpg") as full:
            expected = np.asarray(full.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR, box=box))

        assert drafted.shape == expected.shape == (224, 224, 3)
        assert np.abs(drafted.astype(float) - expected).mean() < tolerance

    assert len(draft_scales) == 2
    assert min(draft_scales) >= 2  # decoded at 1/2 scale or smaller, yet as sharp as needed
