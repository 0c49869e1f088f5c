"""create_loader with the Datasets users write (issues 36 and 37): DataLoader's batches for the same order with
either --loader, or one line refusing; unreadable files skipped, counted and named, as train.py does."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from torchlab import pipeline
from torchlab.pipeline import public, sampler

KINDS = (
    "uint8 HWC arrays",
    "PIL images",
    "float CHW tensors",
    "(tensor, int, str) tuples",
    "dicts",
    "numbers and bytes",
    "variable sizes",
)


class UsersDataset(torch.utils.data.Dataset):
    """A Dataset of one of KINDS, each sample a function of its position; "variable sizes" has one sample, at
    `odd_one`, one row taller than the others. as_dataloader_sees: PIL images as their arrays (default_collate
    takes no PIL images; create_loader batches their arrays)."""

    def __init__(self, kind, length, odd_one=0, as_dataloader_sees=False):
        self.kind, self.length, self.odd_one, self.as_dataloader_sees = kind, length, odd_one, as_dataloader_sees

    def __len__(self):
        return self.length

    def __getitem__(self, position):
        rng = np.random.default_rng(position)
        label = int(rng.integers(0, 5))
        pixels = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
        floats = torch.from_numpy(rng.standard_normal((3, 4, 5)).astype(np.float32))
        rows = 5 if position == self.odd_one else 4
        samples = {
            "uint8 HWC arrays": (pixels, label),
            "PIL images": (pixels if self.as_dataloader_sees else Image.fromarray(pixels), label),
            "float CHW tensors": (floats, label),
            "(tensor, int, str) tuples": (floats.double(), label, f"sample {position}"),
            "dicts": {
                "image": floats,
                "label": label,
                "mask": rng.random((2, 3)) > 0.5,
                "name": f"n{position}",
                "weight": position / 3,
            },
            "numbers and bytes": [position / 7, label, position % 2 == 0, np.float32(position), bytes([65 + label])],
            "variable sizes": (torch.from_numpy(rng.standard_normal((3, rows, 5)).astype(np.float32)), label),
        }
        return samples[self.kind]


def kept(batch):
    """A batch with its tensors copied: the thread loader's are valid until the next batch only."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return {key: kept(value) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(kept(value) for value in batch)
    return batch


def assert_same(batch, expected, where="batch"):
    """The same types at every depth; tensors of the same dtype and shape, equal element for element."""
    assert type(batch) is type(expected), (where, type(batch), type(expected))
    if isinstance(expected, torch.Tensor):
        assert (batch.dtype, batch.shape) == (expected.dtype, expected.shape), where
        assert torch.equal(batch, expected), where
    elif isinstance(expected, dict):
        assert batch.keys() == expected.keys(), where
        for key in expected:
            assert_same(batch[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(batch) == len(expected), where
        for number, (item, expected_item) in enumerate(zip(batch, expected, strict=True)):
            assert_same(item, expected_item, f"{where}[{number}]")
    else:
        assert batch == expected, where


def reference_batches(dataset, batch_size, shuffle, drop_last, epoch):
    """DataLoader's batches (default_collate) of `dataset` in the order the EpochSampler gives create_loader, and
    the positions they read; batches None where DataLoader raises (it cannot stack samples of different sizes)."""
    order = sampler.EpochSampler(len(dataset), shuffle, seed=0)
    order.set_epoch(epoch)
    positions = [position for position, _ in order]
    if drop_last:
        positions = positions[: len(positions) // batch_size * batch_size]
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=positions)
    try:
        return [kept(batch) for batch in data_loader], positions
    except RuntimeError:
        return None, positions


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # the same examples in every run: CI stays stable
    database=None,  # the source is mounted read-only in the image
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(KINDS),
    length=st.integers(1, 13),
    batch_size=st.integers(1, 5),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    loader_workers=st.sampled_from([("threads", 0), ("threads", 1), ("threads", 3), ("processes", 0)])
    | st.just(("processes", 2)),
    epoch=st.integers(0, 3),
    odd_one=st.integers(1, 12),
)
# Issue 36's reproduction: float tensors came out of the threads as uint8, up to 257 away from the samples.
@example(
    kind="float CHW tensors",
    length=16,
    batch_size=4,
    shuffle=True,
    drop_last=False,
    loader_workers=("threads", 2),
    epoch=0,
    odd_one=1,
)
def test_create_loader_gives_dataloaders_batches_for_the_same_order(
    kind, length, batch_size, shuffle, drop_last, loader_workers, epoch, odd_one
):
    loader_choice, workers = loader_workers
    dataset = UsersDataset(kind, length, min(odd_one, length - 1))
    as_dataloader_sees = UsersDataset(kind, length, dataset.odd_one, as_dataloader_sees=True)
    expected, positions = reference_batches(as_dataloader_sees, batch_size, shuffle, drop_last, epoch)
    loader = pipeline.create_loader(
        dataset, batch_size, shuffle, drop_last, loader=loader_choice, workers=workers, print_plan=None
    )
    assert loader.plan.loader == loader_choice
    loader.sampler.set_epoch(epoch)
    # Where DataLoader cannot stack a batch, create_loader refuses too; it also refuses a sample of another size
    # than dataset[0]'s in a batch of its own (its batch buffers have dataset[0]'s shapes): one line, naming it.
    if kind == "variable sizes" and dataset.odd_one != 0 and dataset.odd_one in positions:
        refused = rf"^create_loader: dataset\[{dataset.odd_one}\]\[0\] is a torch.float32 tensor of shape \(3, 5, 5\)"
        with pytest.raises(public.SampleError, match=refused) as refusal:
            list(loader)
        assert "\n" not in f"{refusal.value}"
        return
    batches = [kept(batch) for batch in loader]
    assert len(batches) == len(expected) == len(loader)
    for number, (batch, expected_batch) in enumerate(zip(batches, expected, strict=True)):
        assert_same(batch, expected_batch, f"batch {number}")
    assert loader.skipped.count == 0


@pytest.mark.parametrize(
    ("sample", "what"),
    [
        ((torch.zeros(2), None), r"dataset\[0\]\[1\] is a NoneType"),
        ({"image": torch.zeros(2), "meta": object()}, r"dataset\[0\]\['meta'\] is a object"),
        ((np.array(["a", "b"]), 1), r"dataset\[0\]\[0\] is a numpy array of <U1"),
    ],
)
def test_what_default_collate_cannot_batch_is_refused_before_the_first_batch(sample, what):
    class OneKind(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, position):
            return sample

    with pytest.raises(public.SampleError, match=rf"^create_loader: {what}") as refusal:
        pipeline.create_loader(OneKind(), batch_size=2, print_plan=None)
    assert "\n" not in f"{refusal.value}"


# ---------------------------------------------------------------- unreadable files (issue 37)


def empty_file(path):
    path.write_bytes(b"")


def truncated_jpeg(path):
    Image.new("RGB", (64, 48), (200, 30, 90)).save(path, quality=95)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def text_file(path):
    path.write_text("this is not an image\n")


class PhotoDataset(torch.utils.data.Dataset):
    """A user's own Dataset of the usual kind: paths in __init__, Image.open in __getitem__."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, position):
        with Image.open(self.paths[position]) as image:
            return np.array(image.convert("RGB").resize((8, 6))), position


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    paths = [folder / f"photo_{number}.jpg" for number in range(7)]
    for number, path in enumerate(paths):
        Image.new("RGB", (40, 30), (30 * number, 100, 255 - 30 * number)).save(path)
    return paths


@pytest.mark.parametrize("loader_choice", ["threads", "processes"])
@pytest.mark.parametrize(
    ("make_bad", "why"),
    [(empty_file, "not an image Pillow can read"), (truncated_jpeg, "OSError: "), (text_file, "not an image Pillow")],
)
def test_an_unreadable_file_is_skipped_counted_and_named_once(photos, tmp_path, loader_choice, make_bad, why):
    bad = tmp_path / "bad.jpg"
    make_bad(bad)
    paths = [*photos[:3], bad, *photos[3:]]
    lines = []
    loader = pipeline.create_loader(
        PhotoDataset(paths), batch_size=3, shuffle=False, loader=loader_choice, workers=2, print_plan=lines.append
    )
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        batches = [kept(batch) for batch in loader]
        assert [batch[1].tolist() for batch in batches] == [[0, 1, 2], [4, 5], [6, 7]]
        expected = torch.from_numpy(PhotoDataset(photos)[3][0])
        assert torch.equal(batches[1][0][0], expected)  # the readable samples of the batch, in order
    assert loader.skipped.count == 2  # once in each pass
    assert list(loader.skipped.reasons) == [str(bad)]
    reason = loader.skipped.reasons[str(bad)]
    assert reason.startswith(why)
    skip_lines = [line for line in lines if "unreadable" in line]
    assert skip_lines == [
        f"torchlab loader: skipped 1 unreadable samples in this pass, 1 files new: {bad} ({reason}); "
        "all in loader.skipped"
    ]
    assert f"{loader.skipped}" == f"skipped 2 unreadable samples of 1 files: {bad} ({reason})"


@pytest.mark.parametrize("loader_choice", ["threads", "processes"])
def test_on_error_raise_gives_dataloaders_error_back(photos, tmp_path, loader_choice):
    bad = tmp_path / "bad.jpg"
    text_file(bad)
    loader = pipeline.create_loader(
        PhotoDataset([*photos[:2], bad]), 2, loader=loader_choice, workers=1, print_plan=None, on_error="raise"
    )
    with pytest.raises(Image.UnidentifiedImageError):
        list(loader)
    with pytest.raises(ValueError, match="^create_loader: on_error='ignore'; expected 'skip' or 'raise'$"):
        pipeline.create_loader(PhotoDataset(photos), 2, print_plan=None, on_error="ignore")
