"""The ImageFolder index: which files --data holds, their labels, and the split into training and validation.

Layout at --data, either
    DATA/train/CLASS/IMAGE and DATA/val/CLASS/IMAGE, or
    DATA/CLASS/IMAGE (or DATA/train/CLASS/IMAGE alone), from which a seeded fraction (--val-fraction) is held
    out for validation.
Class folders may nest sub-folders. Names starting with a dot (.ipynb_checkpoints, .DS_Store) are skipped.
The index is kept in numpy arrays (SampleIndex), so that forked loader workers share its pages.
"""

import os

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm")


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


def train_folder(root):
    """The folder of the training classes in the ImageFolder at `root`: ROOT/train where there is one, else ROOT."""
    train_root = os.path.join(root, "train")
    return train_root if os.path.isdir(train_root) else root


def val_folder(root):
    """ROOT/val where the ImageFolder at `root` has both train/ and val/, else None (val is held out of train)."""
    val_root = os.path.join(root, "val")
    return val_root if train_folder(root) != root and os.path.isdir(val_root) else None


def index_image_folder(root, val_fraction, seed):
    """Index the ImageFolder at `root`: (class_names, train SampleIndex, val SampleIndex). Raises DataError."""
    if not os.path.isdir(root):
        raise DataError(
            f"--data {root}: no such folder; mount your images there, e.g. docker run -v /path/to/images:{root} ..."
        )
    train_root = train_folder(root)
    class_names = list_class_names(train_root)
    if not class_names:
        raise DataError(f"{train_root}: no class folders (expected {train_root}/CLASS_NAME/IMAGE.jpg)")
    train_index = scan_image_folder(train_root, class_names)
    val_root = val_folder(root)
    if val_root is not None:
        return class_names, train_index, scan_image_folder(val_root, class_names)
    return (class_names, *hold_out(train_index, val_fraction, seed))
