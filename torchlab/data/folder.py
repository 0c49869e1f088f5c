"""The ImageFolder index: which files --data holds, their labels, and the split into training and validation.

Layout at --data, either
    DATA/train/CLASS/IMAGE and DATA/val/CLASS/IMAGE, or
    DATA/CLASS/IMAGE (or DATA/train/CLASS/IMAGE alone), from which a seeded fraction (--val-fraction) is held
    out for validation.
DATA/train and DATA/val are the splits only when they hold class folders: one that holds images and no sub-folder
of images is a class like the others ('train' is a class of PASCAL VOC), except a DATA/val of images beside a
DATA/train split, which is a DataError (its images would be ignored); a DATA/val with no images is as if absent.
Class folders may nest sub-folders. Names starting with a dot (.ipynb_checkpoints, .DS_Store) are skipped; so is a
link back to a folder being walked (a symlink loop, e.g. CLASS/up -> ..), so that each image is listed once.
The index is kept in numpy arrays (SampleIndex), so that forked loader workers share its pages.
"""

import errno
import os

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm")


class DataError(ValueError):
    """The data at --data cannot be used: reported as one line, exit code 2. `fix`, for a problem that has a fix
    of its own (a link to remove, a folder to make readable), ends that line; doctor shows it as the fix."""

    def __init__(self, problem, fix=None):
        super().__init__(problem if fix is None else f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


def read_error(error):
    """The DataError for `error`, an OSError met while listing --data: the path, what is wrong, and the fix."""
    if error.errno == errno.ELOOP:
        return DataError(f"{error.filename}: a symlink loop", fix="remove the link")
    if error.errno == errno.EACCES:
        return DataError(
            f"{error.filename}: not readable by UID {os.getuid()}", fix="on the host: chmod -R a+rX on that folder"
        )
    return DataError(f"{error.filename}: cannot be read ({error.strerror})")


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
    """(entry, is_folder) for the entries of `folder` whose names do not start with a dot, sorted by name; links
    are followed. A folder this user cannot read, or a symlink loop, raises DataError (read_error)."""
    try:
        entries = sorted(
            (entry for entry in os.scandir(folder) if not entry.name.startswith(".")), key=lambda e: e.name
        )
        return [(entry, entry.is_dir()) for entry in entries]
    except OSError as error:
        raise read_error(error) from None


def is_image(entry, is_folder):
    """Whether the visible_entries pair is an image file (by its extension, in any case)."""
    return not is_folder and entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file()


def list_class_names(folder):
    return [entry.name for entry, is_folder in visible_entries(folder) if is_folder]


def leads_back(path, walking):
    """Whether the folder `path` is, or holds, one of the real paths `walking`: following it would loop."""
    real = os.path.realpath(path)
    return any(folder == real or folder.startswith(real.rstrip(os.sep) + os.sep) for folder in walking)


def list_images(folder, walking=()):
    """Image files under `folder` and its visible sub-folders, in a fixed order; extensions in any case. A link
    back to a folder being walked (`walking`, real paths) is not followed: each image is listed once."""
    walking = (*walking, os.path.realpath(folder))
    images = []
    for entry, is_folder in visible_entries(folder):
        if is_folder and not leads_back(entry.path, walking):
            images.extend(list_images(entry.path, walking))
        elif is_image(entry, is_folder):
            images.append(entry.path)
    return images


def holds_classes(folder):
    """Whether `folder` is a folder of class folders: it holds no images, or it has a sub-folder of images."""
    entries = visible_entries(folder)
    if not any(is_image(entry, is_folder) for entry, is_folder in entries):
        return True
    return any(is_folder and list_images(entry.path) for entry, is_folder in entries)


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


def split_folder(root, name):
    """ROOT/NAME (train or val) where it is a split, a folder of class folders (holds_classes), else None: one
    that holds images and no sub-folder of images is a class like the others."""
    path = os.path.join(root, name)
    return path if os.path.isdir(path) and holds_classes(path) else None


def train_folder(root):
    """The folder of the training classes in the ImageFolder at `root`: ROOT/train where it is a split, else ROOT."""
    return split_folder(root, "train") or root


def val_folder(root):
    """ROOT/val where the ImageFolder at `root` has both splits, train/ and val/, else None (val is held out of
    train). A val/ with no class folders and no images is as if absent."""
    path = split_folder(root, "val") if train_folder(root) != root else None
    return path if path is not None and list_class_names(path) else None


def check_val_is_used(root, train_root):
    """Raise DataError where train/ is a split and ROOT/val holds images but no class folders: val_folder does
    not take it, so its images would be ignored and --val-fraction of train/ held out in their place."""
    path = os.path.join(root, "val")
    if train_root != root and os.path.isdir(path) and list_images(path):
        raise DataError(
            f"{path}: holds no class folders, while {train_root} does",
            fix=f"put its images in class folders as in train/ ({path}/CLASS_NAME/IMAGE.jpg), "
            "or remove it to hold out --val-fraction of train/",
        )


def index_image_folder(root, val_fraction, seed):
    """Index the ImageFolder at `root`: (class_names, train SampleIndex, val SampleIndex). Raises DataError."""
    if not os.path.isdir(root):
        raise DataError(
            f"{root}: no such folder; mount your images there, e.g. docker run -v /path/to/images:{root} ..."
        )
    train_root = train_folder(root)
    class_names = list_class_names(train_root)
    if not class_names:
        raise DataError(f"{train_root}: no class folders (expected {train_root}/CLASS_NAME/IMAGE.jpg)")
    train_index = scan_image_folder(train_root, class_names)
    val_root = val_folder(root)
    if val_root is not None:
        return class_names, train_index, scan_image_folder(val_root, class_names)
    check_val_is_used(root, train_root)
    return (class_names, *hold_out(train_index, val_fraction, seed))
