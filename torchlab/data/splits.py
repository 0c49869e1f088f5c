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
