"""The dataset: an ImageFolder index kept in numpy arrays, and decoding with crop and resize in one pass.

Layout at --data, either
    DATA/train/CLASS/IMAGE and DATA/val/CLASS/IMAGE, or
    DATA/CLASS/IMAGE, from which a seeded fraction (--val-fraction) is held out for validation.
Class folders may nest sub-folders. Names starting with a dot (.ipynb_checkpoints, .DS_Store) are skipped.

Decoding goes straight from the file to the network's input size: the crop box is chosen from the image's
full-size dimensions first, a JPEG is then decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, PIL's
Image.draft) as long as the crop keeps at least the output's resolution, and one resize cuts out the box
and scales it. A 4000 x 3000 photo cropped to 224 px decodes at 1/8 size: most of the decode time is saved.
"""

import functools
import math
import os
import random

import numpy as np
import torch
from PIL import Image

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm")
# RandomResizedCrop's ranges (Inception's, torchvision's defaults): the box's share of the image's area
# and the box's width / height.
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
# Validation: the classic "resize the short side to size / 0.875, take the centre size x size".
VAL_CROP_FRACTION = 0.875
# PIL first shrinks by a whole factor while the box is more than this many times the output, then
# resamples; at 3.0 the result is indistinguishable from resampling the full box (PIL's documentation).
RESIZE_REDUCING_GAP = 3.0
# What PIL raises for an unreadable, truncated or hostile file.
UNREADABLE_IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def unreadable_reason(source):
    """Why ImageDataset could not decode `source`, in one line (asked again, for the report of bad images)."""
    try:
        load_crop(source, center_crop_box, 8)
    except UNREADABLE_IMAGE_ERRORS as error:
        return f"{type(error).__name__}: {error}".replace("\n", " ")
    return "decoded when read again (a file that changed during the epoch?)"


class DataError(ValueError):
    """The data at --data cannot be used: reported as one line, exit code 2."""


class SampleIndex:
    """The paths and labels of N samples in three numpy arrays, with no Python object per sample.

    A forked DataLoader worker that reads a Python list of N str writes N reference counts and so copies
    every memory page that holds them (copy-on-write): each worker's memory grows towards the main
    process's. Reading these arrays writes nothing, so the pages stay shared.
    """

    def __init__(self, paths, labels):
        encoded = [os.fsencode(path) for path in paths]
        self.path_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(path) for path in encoded], out=self.offsets[1:])
        self.labels = np.asarray(labels, dtype=np.int64)

    @classmethod
    def from_arrays(cls, path_bytes, offsets, labels):
        """The index whose path_bytes, offsets and labels arrays these are (e.g. as saved by numpy)."""
        index = cls([], [])
        index.path_bytes, index.offsets, index.labels = path_bytes, offsets, labels
        return index

    def __len__(self):
        return len(self.labels)

    def path(self, position):
        return os.fsdecode(self.path_bytes[self.offsets[position] : self.offsets[position + 1]].tobytes())

    def source(self, position):
        """What ImageDataset decodes: the file's path (a prepared.PreparedIndex gives its bytes)."""
        return self.path(position)

    def subset(self, positions):
        return SampleIndex([self.path(position) for position in positions], self.labels[positions])


def visible_entries(folder):
    """The entries of `folder` whose names do not start with a dot, sorted by name."""
    return sorted((entry for entry in os.scandir(folder) if not entry.name.startswith(".")), key=lambda e: e.name)


def list_class_names(folder):
    return [entry.name for entry in visible_entries(folder) if entry.is_dir()]


def list_images(folder):
    """Image files under `folder` and its visible sub-folders, in a fixed order; extensions in any case."""
    images = []
    for entry in visible_entries(folder):
        if entry.is_dir():
            images.extend(list_images(entry.path))
        elif entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
            images.append(entry.path)
    return images


def scan_image_folder(folder, class_names):
    """A SampleIndex of folder/CLASS/... for the given classes (label = position in class_names)."""
    paths, labels = [], []
    for name in list_class_names(folder):
        if name not in class_names:
            raise DataError(f"{folder}/{name}: a class that the training set does not have")
        images = list_images(os.path.join(folder, name))
        if not images:
            raise DataError(f"{folder}/{name}: a class folder with no images ({', '.join(IMAGE_EXTENSIONS)})")
        paths.extend(images)
        labels.extend([class_names.index(name)] * len(images))
    return SampleIndex(paths, labels)


def hold_out(index, fraction, seed):
    """Split `index` into (train, val) with a seeded random `fraction` of the samples in val."""
    order = np.random.default_rng(seed).permutation(len(index))
    val_count = round(len(index) * fraction)
    if val_count == len(index):
        raise DataError(f"--val-fraction {fraction} leaves no training images out of {len(index)}")
    return index.subset(np.sort(order[val_count:])), index.subset(np.sort(order[:val_count]))


def load_splits(root, val_fraction, seed):
    """Index the data at `root`: (class_names, train SampleIndex, val SampleIndex). Raises DataError.

    A prepared copy (prepared.py) gives its own splits, as PreparedIndex objects.
    """
    import prepared  # it builds on this module

    if prepared.is_prepared(root):
        return prepared.open_prepared(root)
    if not os.path.isdir(root):
        raise DataError(
            f"--data {root}: no such folder; mount your images there, e.g. docker run -v /path/to/images:{root} ..."
        )
    train_root = os.path.join(root, "train")
    has_train_folder = os.path.isdir(train_root)
    if not has_train_folder:
        train_root = root
    class_names = list_class_names(train_root)
    if not class_names:
        raise DataError(f"{train_root}: no class folders (expected {train_root}/CLASS_NAME/IMAGE.jpg)")
    train_index = scan_image_folder(train_root, class_names)
    val_root = os.path.join(root, "val")
    if has_train_folder and os.path.isdir(val_root):
        return class_names, train_index, scan_image_folder(val_root, class_names)
    return (class_names, *hold_out(train_index, val_fraction, seed))


def random_resized_crop_box(width, height, rng):
    """RandomResizedCrop's box (left, top, right, bottom) for a width x height image, drawn from `rng`."""
    log_aspect_range = (math.log(CROP_ASPECT_RANGE[0]), math.log(CROP_ASPECT_RANGE[1]))
    for _ in range(10):
        area = width * height * rng.uniform(*CROP_AREA_RANGE)
        aspect = math.exp(rng.uniform(*log_aspect_range))
        box_width, box_height = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < box_width <= width and 0 < box_height <= height:
            left, top = rng.randint(0, width - box_width), rng.randint(0, height - box_height)
            return left, top, left + box_width, top + box_height
    # No draw fitted: the whole image, centre-cropped to the nearest allowed aspect ratio.
    box_width = min(width, round(height * CROP_ASPECT_RANGE[1]))
    box_height = min(height, round(width / CROP_ASPECT_RANGE[0]))
    left, top = (width - box_width) // 2, (height - box_height) // 2
    return left, top, left + box_width, top + box_height


def center_crop_box(width, height):
    """The validation box: a centred square, VAL_CROP_FRACTION of the short side."""
    side = min(width, height) * VAL_CROP_FRACTION
    left, top = (width - side) / 2, (height - side) / 2
    return left, top, left + side, top + side


def load_crop(source, choose_box, size, flip=False, draft=True):
    """Decode `source` (a path or a file object) and return the box choose_box(width, height) resized to
    size x size: HWC uint8 RGB. draft=False decodes a JPEG at full size (for comparison)."""
    with Image.open(source) as image:
        width, height = image.size
        box = choose_box(width, height)
        # Ask for the smallest decode in which the box still spans `size` pixels each way. PIL rounds the
        # scale down to 1/2, 1/4 or 1/8 and tells how the full-size coordinates map; other formats: None.
        drafted = None
        if draft:
            drafted = image.draft(
                "RGB", (math.ceil(width * size / (box[2] - box[0])), math.ceil(height * size / (box[3] - box[1])))
            )
        if drafted is not None:
            scale = width / drafted[1][2]
            box = tuple(coordinate / scale for coordinate in box)
        rgb = image if image.mode == "RGB" else image.convert("RGB")  # grey, palette, RGBA, CMYK, ...
        crop = rgb.resize((size, size), Image.Resampling.BILINEAR, box=box, reducing_gap=RESIZE_REDUCING_GAP)
    if flip:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(crop)


class ImageDataset(torch.utils.data.Dataset):
    """Samples of a SampleIndex, decoded to size x size uint8 HWC arrays (training: augmented).

    Keys are (position, epoch) pairs, as EpochSampler yields them. The augmentation of a sample is drawn
    from a generator seeded by (seed, epoch, position): it differs in every epoch, and it is the same
    whichever worker decodes the sample, with any number of workers and after a resume.

    An unreadable image gives (None, label, position); the collate function drops it and counts it.
    """

    def __init__(self, index, image_size, train, seed, draft=True):
        self.index = index
        self.image_size = image_size
        self.train = train
        self.seed = seed
        self.draft = draft  # JPEG DCT-domain downscaling (load_crop)

    def __len__(self):
        return len(self.index)

    def __getitem__(self, key):
        position, epoch = key
        label = int(self.index.labels[position])
        if self.train:
            rng = random.Random(f"{self.seed}/{epoch}/{position}")
            flip = rng.random() < 0.5
            choose_box = functools.partial(random_resized_crop_box, rng=rng)
        else:
            flip, choose_box = False, center_crop_box
        try:
            pixels = load_crop(self.index.source(position), choose_box, self.image_size, flip, self.draft)
        except UNREADABLE_IMAGE_ERRORS:
            return None, label, position
        return pixels, label, position
