"""A prepared copy of an ImageFolder: one memory-mapped data file plus an index, read by `--data PREPARED`.

`torchlab prepare SOURCE OUT` writes OUT/images.bin (every image, resized so that its short side is
--short-side px, 256 by default, stored as JPEG bytes at --quality, 90 by default, one after another) and
OUT/index.npz (where each image starts and ends, its label, its split, its original path, the class names
and a fingerprint of SOURCE). train.py and the loader take OUT wherever they take an ImageFolder.

Why JPEG bytes and not raw pixels: at 256 px a raw image is ~260 KB and a JPEG ~25 KB, so ImageNet's
1.28 M images take ~32 GB instead of ~330 GB and stay in the page cache of an ordinary machine; decoding
256 px instead of ~470 x 390 px is already 2-3x faster than the original files, and every sample still goes
through the same crop and resize (decode.load_crop) as the original files.

Writing is resumable and atomic: images.bin and a length per image are appended and synced every
CHECKPOINT_IMAGES images with a progress record; a rerun after an interruption truncates both to the last
record and continues. index.npz is written last (to a temporary file, then renamed): a copy without it is
unfinished and is never read. At open, the copy refuses to be read when SOURCE is still there and its files
(names, sizes, modification times) are not the ones it was made from.
"""

import hashlib
import json
import mmap
import multiprocessing
import os
from io import BytesIO

import numpy as np
from PIL import Image

from torchlab import io
from torchlab.data import decode, folder

DATA_FILE = "images.bin"
INDEX_FILE = "index.npz"
LENGTHS_FILE = "lengths.partial"  # int64 byte length of each image written so far
PROGRESS_FILE = "progress.json"  # images and bytes of images.bin and lengths.partial known to be on disk
FORMAT_VERSION = 1
CHECKPOINT_IMAGES = 256
JPEG_MAX_SIDE = 65500  # libjpeg's largest side, in pixels
SPLITS = ("train", "val")
OWN_FILES = (DATA_FILE, INDEX_FILE, LENGTHS_FILE, PROGRESS_FILE)  # what a prepared copy's folder holds


def source_fingerprint(root, paths):
    """A hash of the source files' names (relative to root), sizes and modification times, in order."""
    digest = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{os.path.relpath(path, root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def list_source(root, val_fraction, seed):
    """The source's samples in the copy's order: (class_names, paths, labels, splits (0 train, 1 val))."""
    class_names, train_index, val_index = folder.index_image_folder(root, val_fraction, seed)
    paths = [index.path(position) for index in (train_index, val_index) for position in range(len(index))]
    labels = np.concatenate([train_index.labels, val_index.labels])
    splits = np.repeat(np.arange(len(SPLITS), dtype=np.uint8), [len(train_index), len(val_index)])
    return class_names, paths, labels, splits


def resized_jpeg(path, short_side, quality):
    """The image at `path`, its short side scaled down to `short_side` (never up; further down where its long
    side would pass what JPEG can store), as RGB JPEG bytes."""
    with Image.open(path) as image:
        width, height = image.size
        scale = min(1.0, short_side / min(width, height), JPEG_MAX_SIDE / max(width, height))
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        image.draft("RGB", size)  # a JPEG decodes at 1/2, 1/4 or 1/8 scale when that still covers `size`
        rgb = decode.rgb_image(image)
        resized = rgb.resize(size, Image.Resampling.BILINEAR, reducing_gap=decode.RESIZE_REDUCING_GAP)
    encoded = BytesIO()
    resized.save(encoded, "JPEG", quality=quality)  # Pillow's default 4:2:0 chroma: the faster decode
    return encoded.getvalue()


def resized_jpeg_or_empty(job):
    """resized_jpeg for a pool: b"" for an unreadable image (kept as a sample; reading it counts it bad)."""
    path, short_side, quality = job
    try:
        return resized_jpeg(path, short_side, quality)
    except decode.UNREADABLE_IMAGE_ERRORS:
        return b""


def read_progress(out_dir, settings):
    """Images already written by an earlier run with the same settings and source, else 0 (start afresh)."""
    try:
        with open(os.path.join(out_dir, PROGRESS_FILE)) as progress_file:
            progress = json.load(progress_file)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0, 0
    if progress["settings"] != settings:
        print(
            f"torchlab prepare: {out_dir}: the source or the settings changed since the interrupted run; "
            "starting afresh"
        )
        return 0, 0
    return progress["images"], progress["bytes"]


def check_out_dir(source, out_dir):
    """Raise folder.DataError where writing a prepared copy at `out_dir` would touch what is not its own: a
    folder inside (or equal to) `source`, or one that holds other files (images.bin would be truncated)."""
    source_path, out_path = os.path.realpath(source), os.path.realpath(out_dir)
    if out_path == source_path or out_path.startswith(source_path + os.sep):
        raise folder.DataError(f"{out_dir}: inside its source {source}; write the prepared copy outside it")
    if not os.path.isdir(out_dir):
        return
    entries = set(os.listdir(out_dir))
    foreign = {name for name in entries if name not in OWN_FILES and not io.TEMP_NAME.fullmatch(name)}
    if foreign or (entries and not entries & {INDEX_FILE, LENGTHS_FILE, PROGRESS_FILE}):
        raise folder.DataError(
            f"{out_dir}: exists and is not a prepared copy; not writing into it (expected a new or empty folder)"
        )


def prepare(source, out_dir, short_side=256, quality=90, val_fraction=0.1, seed=0, *, processes):
    """Convert the ImageFolder at `source` into a prepared copy at `out_dir` with `processes` worker processes,
    continuing an interrupted run.

    Returns False when `out_dir` is already a finished copy of `source` as it is now (nothing is done).
    """
    class_names, paths, labels, splits = list_source(source, val_fraction, seed)
    settings = {
        "version": FORMAT_VERSION,
        "source": os.path.abspath(source),
        "fingerprint": source_fingerprint(source, paths),
        "short_side": short_side,
        "quality": quality,
        "val_fraction": val_fraction,
        "seed": seed,
    }
    check_out_dir(source, out_dir)
    if os.path.exists(os.path.join(out_dir, INDEX_FILE)):
        open_prepared(out_dir)  # raises when the source changed since
        return False
    reason = io.unwritable_reason(out_dir)
    if reason is not None:
        raise folder.DataError(f"{out_dir}: {reason}")
    os.makedirs(out_dir, exist_ok=True)
    done, done_bytes = read_progress(out_dir, settings)
    data_path, lengths_path = os.path.join(out_dir, DATA_FILE), os.path.join(out_dir, LENGTHS_FILE)
    for path, size in ((data_path, done_bytes), (lengths_path, done * 8)):
        with open(path, "ab") as file:
            file.truncate(size)  # drop what was written after the last progress record
    jobs = [(path, short_side, quality) for path in paths[done:]]
    with (
        open(data_path, "ab") as data_file,
        open(lengths_path, "ab") as lengths_file,
        multiprocessing.get_context("fork").Pool(processes) as pool,
    ):
        for number, encoded in enumerate(pool.imap(resized_jpeg_or_empty, jobs, chunksize=8), start=done + 1):
            data_file.write(encoded)
            lengths_file.write(np.int64(len(encoded)).tobytes())
            done_bytes += len(encoded)
            if number % CHECKPOINT_IMAGES == 0 or number == len(paths):
                for file in (data_file, lengths_file):
                    file.flush()
                    os.fsync(file.fileno())
                progress = json.dumps({"settings": settings, "images": number, "bytes": done_bytes}).encode()
                io.atomic_write(os.path.join(out_dir, PROGRESS_FILE), lambda file, text=progress: file.write(text))
    ends = np.cumsum(np.fromfile(lengths_path, dtype=np.int64))
    path_index = folder.SampleIndex(paths, labels)
    index_arrays = {
        "manifest": np.array(json.dumps({**settings, "class_names": class_names})),
        "ends": ends,
        "labels": labels,
        "splits": splits,
        "path_bytes": path_index.path_bytes,
        "path_offsets": path_index.offsets,
    }
    io.atomic_write(os.path.join(out_dir, INDEX_FILE), lambda file: np.savez(file, **index_arrays))
    for leftover in (LENGTHS_FILE, PROGRESS_FILE):
        os.remove(os.path.join(out_dir, leftover))
    return True


def is_prepared(root):
    """Whether `root` is a prepared copy, finished or not."""
    return any(os.path.exists(os.path.join(root, name)) for name in (INDEX_FILE, PROGRESS_FILE))


class PreparedIndex:
    """A SampleIndex whose samples are byte ranges of one memory-mapped file (the same interface).

    source(position) gives a file object of the image's JPEG bytes; path(position) its original path.
    Every array is read-only numpy, so forked workers share the index's pages (no copy-on-write).
    The file is mapped in each process on first use, never inherited across a fork.
    """

    def __init__(self, data_path, starts, ends, labels, paths):
        self.data_path = data_path
        self.starts = starts
        self.ends = ends
        self.labels = labels
        self.paths = paths  # a folder.SampleIndex of the original paths
        self._mapping, self._mapping_pid = None, None

    def __len__(self):
        return len(self.labels)

    def __getstate__(self):
        return {**self.__dict__, "_mapping": None, "_mapping_pid": None}

    def path(self, position):
        return self.paths.path(position)

    def source(self, position):
        if self._mapping_pid != os.getpid():
            with open(self.data_path, "rb") as data_file:
                self._mapping = mmap.mmap(data_file.fileno(), 0, access=mmap.ACCESS_READ)
            self._mapping_pid = os.getpid()
        return BytesIO(self._mapping[self.starts[position] : self.ends[position]])

    def subset(self, positions):
        return PreparedIndex(
            self.data_path,
            self.starts[positions],
            self.ends[positions],
            self.labels[positions],
            self.paths.subset(positions),
        )


def unreadable_paths(root):
    """The original paths of a finished copy's images that could not be read, stored empty (reading one counts it
    bad, as reading the original does)."""
    _, *indexes = open_prepared(root)
    return [index.path(p) for index in indexes for p in np.flatnonzero(index.ends == index.starts).tolist()]


def open_prepared(root):
    """(class_names, train PreparedIndex, val PreparedIndex) of a finished copy. Raises folder.DataError."""
    index_path = os.path.join(root, INDEX_FILE)
    if not os.path.exists(index_path):
        raise folder.DataError(
            f"{root}: an unfinished prepared copy", fix="run torchlab prepare again with the same arguments"
        )
    with np.load(index_path) as index:
        manifest = json.loads(str(index["manifest"]))
        ends, labels, splits = index["ends"], index["labels"], index["splits"]
        paths = folder.SampleIndex.from_arrays(index["path_bytes"], index["path_offsets"], labels)
    source = manifest["source"]
    if os.path.isdir(source):  # a copy moved to another machine without its source is read as it is
        try:
            current_paths = list_source(source, manifest["val_fraction"], manifest["seed"])[1]
            unchanged = source_fingerprint(source, current_paths) == manifest["fingerprint"]
        except (folder.DataError, FileNotFoundError):
            unchanged = False
        if not unchanged:
            raise folder.DataError(
                f"{root}: its source {source} has changed since it was prepared (files added, removed or modified)",
                fix=f"prepare it again: torchlab prepare {source} NEW_FOLDER",
            )
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    everything = PreparedIndex(os.path.join(root, DATA_FILE), starts, ends, labels, paths)
    split_indexes = [everything.subset(np.flatnonzero(splits == number)) for number in range(len(SPLITS))]
    return manifest["class_names"], *split_indexes
