"""The one way to open --data: a prepared copy (data.prepared) or an ImageFolder (data.folder)."""

from torchlab.data import folder, prepared


def load_splits(root, val_fraction, seed):
    """(class_names, train index, val index) of the data at `root`. Raises folder.DataError.

    An ImageFolder gives SampleIndex objects, split by --val-fraction when it has no val/ folder; a prepared
    copy gives its own splits, as PreparedIndex objects (the same interface).
    """
    if prepared.is_prepared(root):
        return prepared.open_prepared(root)
    return folder.index_image_folder(root, val_fraction, seed)


def data_layout(root):
    """How the data at `root` is laid out: "prepared" (a prepared copy), "train_val" (train/ and val/), "train"
    (train/ alone: val is held out of it) or "single" (ROOT/CLASS: val is held out of it)."""
    if prepared.is_prepared(root):
        return "prepared"
    if folder.val_folder(root) is not None:
        return "train_val"
    return "train" if folder.train_folder(root) != root else "single"
