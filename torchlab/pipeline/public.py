"""create_loader: the tuned loader for a user's own map-style Dataset, the way train.py loads its images.

    loader = torchlab.pipeline.create_loader(MyDataset(...), batch_size=64)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for images, labels in loader:
            ...
    print(loader.skipped)  # the unreadable files skipped, each named once, and how many samples

Its batches are DataLoader's for the same order: torch's default_collate of the samples. dataset[i] may hold
tensors, numpy arrays, numbers and strings, in tuples, lists, named tuples and dicts, batched as default_collate
batches them; a PIL image is batched as its array (uint8 for RGB). Every sample has dataset[0]'s structure,
types, shapes and dtypes (what default_collate needs to stack them, checked strictly here): a dataset[0] of
another kind is refused before the first batch, a sample that differs at its batch, each with one line
(SampleError). The loader plan (plan.plan: threads or worker processes, how many, batches ahead, with
the reasons) is printed once. With threads, each sample is written into its slots of a reused batch buffer of
its own dtypes and shapes: a batch's tensors are valid until the next batch is asked for (.clone() to keep them).

A sample whose dataset[i] raises what train.py counts as an unreadable file (decode.UNREADABLE_IMAGE_ERRORS:
Pillow's errors for an empty, truncated or non-image file) is skipped, as train.py skips it: its batch is one
sample shorter, and loader.skipped (a decode.UnreadableFiles) counts it and names the file once, with the reason.
The file is the one being read when the error was raised (found in the error's frames: an open file, or a PIL
image read from one), else "dataset[i]". A pass that met files not named before says so in one line.
on_error="raise" gives DataLoader's behaviour back: the error reaches the loop.
"""

import collections.abc
import copy
import io
import math
import traceback
import typing

import numpy as np
import torch
from PIL import Image

from torchlab import machine
from torchlab.data import decode
from torchlab.pipeline import plan, threads
from torchlab.pipeline.loader import build_loader

ON_ERROR = ("skip", "raise")


class SampleError(ValueError):
    """A sample that create_loader cannot batch as DataLoader would: one line naming it and what was expected."""


def described(value):
    """What `value` is, in a few words, for a SampleError."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, Image.Image):
        return f"a PIL image ({value.mode}, {value.width} x {value.height})"
    if isinstance(value, np.ndarray):
        return f"a numpy {value.dtype} array of shape {value.shape}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, collections.abc.Mapping):
        return f"a {type(value).__name__} with keys {list(value)}"
    return f"a {type(value).__name__}"


def mismatch(where, value, position, first):
    return SampleError(
        f"create_loader: dataset[{position}]{where} is {described(value)} where dataset[0]{where} is {first}: "
        "samples are batched as DataLoader's default_collate stacks them, all of one structure, type, shape "
        "and dtype (resize or convert them in __getitem__)"
    )


class Field:
    """One leaf of every sample (at `where` in dataset[0]'s structure): its slot in a batch, batch_field, and the
    write of a sample's leaf into row `row` of that slot, refused (SampleError) where default_collate would not
    stack it with dataset[0]'s. Subclasses give accepts(value) -> the value to store, or None."""

    def __init__(self, where, first, shape, dtype):
        self.where, self.first = where, described(first)
        self.batch_field = (shape, dtype)

    def flatten(self, value, position, leaves):
        leaves.append(value)

    def build(self, batches):
        return next(batches)

    def write(self, value, slot, row, position):
        accepted = self.accepts(value)
        if accepted is None:
            raise mismatch(self.where, value, position, self.first)
        self.store(accepted, slot, row)

    @staticmethod
    def store(value, slot, row):
        slot[row, ...] = value  # a numpy view's row: one copy, without the GIL for an array


class TensorField(Field):
    def __init__(self, where, value):
        super().__init__(where, value, tuple(value.shape), value.dtype)

    def accepts(self, value):
        shape, dtype = self.batch_field
        fits = isinstance(value, torch.Tensor) and value.shape == shape and value.dtype == dtype
        return value if fits else None

    @staticmethod
    def store(value, slot, row):
        torch.as_tensor(slot[row : row + 1]).copy_(value)  # the slot's numpy view, or the tensor numpy lacks


class ArrayField(Field):
    """A numpy array or scalar, or a PIL image (batched as its array: default_collate takes no PIL images)."""

    def __init__(self, where, value):
        array = np.asarray(value)
        if array.dtype.kind not in "biufc":
            raise SampleError(
                f"create_loader: dataset[0]{where} is a numpy array of {array.dtype}, which DataLoader's "
                "default_collate cannot batch; return numbers, or strings outside numpy"
            )
        self.kind = next(kind for kind in (Image.Image, np.ndarray, np.generic) if isinstance(value, kind))
        super().__init__(where, value, array.shape, torch.from_numpy(np.empty(0, array.dtype)).dtype)
        self.dtype = array.dtype

    def accepts(self, value):
        array = np.asarray(value) if isinstance(value, self.kind) else None
        fits = array is not None and array.shape == self.batch_field[0] and array.dtype == self.dtype
        return array if fits else None


class NumberField(Field):
    """A Python number: bools batch as torch.bool, ints as int64, floats as float64 (default_collate's dtypes);
    a later int or bool in a float's place, or a bool in an int's, comes out as default_collate makes it."""

    KINDS = {bool: (torch.bool, bool), int: (torch.int64, int), float: (torch.float64, int | float)}

    def __init__(self, where, value):
        kind = bool if isinstance(value, bool) else int if isinstance(value, int) else float
        dtype, self.accepted = self.KINDS[kind]
        super().__init__(where, value, (), dtype)

    def accepts(self, value):
        return value if isinstance(value, self.accepted) else None


class ObjectField(Field):
    """A string or bytes: batched as default_collate batches them, a tuple inside a tuple or list (it transposes
    those with zip), else a list."""

    def __init__(self, where, value):
        super().__init__(where, value, (), None)
        self.kind = str if isinstance(value, str) else bytes
        self.batch_type = list

    def build(self, batches):
        return self.batch_type(next(batches))

    def accepts(self, value):
        return value if isinstance(value, self.kind) else None

    @staticmethod
    def store(value, slot, row):
        slot[row] = value


class Sequence:
    """A tuple (batched as a list, as default_collate does), named tuple or list of parts."""

    def __init__(self, value, where, fields):
        self.template, self.where, self.first = value, where, described(value)
        self.parts = [part_of(item, f"{where}[{number}]", fields) for number, item in enumerate(value)]
        for part in self.parts:
            if isinstance(part, ObjectField):
                part.batch_type = tuple

    def flatten(self, value, position, leaves):
        if type(value) is not type(self.template) or len(value) != len(self.parts):
            raise mismatch(self.where, value, position, self.first)
        for part, item in zip(self.parts, value, strict=True):
            part.flatten(item, position, leaves)

    def build(self, batches):
        items = [part.build(batches) for part in self.parts]
        if hasattr(self.template, "_fields"):
            return type(self.template)(*items)
        if isinstance(self.template, list):
            clone = copy.copy(self.template)
            clone[:] = items
            return clone
        return items


class Mapping:
    """A dict (or another mutable mapping, copied and updated as default_collate does) of parts."""

    def __init__(self, value, where, fields):
        self.template, self.where, self.first = value, where, described(value)
        self.parts = {key: part_of(item, f"{where}[{key!r}]", fields) for key, item in value.items()}

    def flatten(self, value, position, leaves):
        if type(value) is not type(self.template) or value.keys() != self.parts.keys():
            raise mismatch(self.where, value, position, self.first)
        for key, part in self.parts.items():
            part.flatten(value[key], position, leaves)

    def build(self, batches):
        clone = copy.copy(self.template)
        clone.update({key: part.build(batches) for key, part in self.parts.items()})
        return clone


def part_of(value, where, fields):
    """dataset[0]'s `value` at `where`, as a structure of parts; its leaves' Fields are appended to `fields`."""
    if isinstance(value, collections.abc.MutableMapping):
        return Mapping(value, where, fields)
    if isinstance(value, tuple | list):
        return Sequence(value, where, fields)
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_nested:
        field = TensorField(where, value)
    elif isinstance(value, np.ndarray | np.bool_ | np.number | Image.Image):
        field = ArrayField(where, value)
    elif isinstance(value, bool | int | float):
        field = NumberField(where, value)
    elif isinstance(value, str | bytes):
        field = ObjectField(where, value)
    else:
        raise SampleError(
            f"create_loader: dataset[0]{where} is {described(value)}, which DataLoader's default_collate cannot "
            "batch; return tensors, numpy arrays, PIL images, numbers or strings, in tuples, lists or dicts"
        )
    fields.append(field)
    return field


class SampleLayout:
    """dataset[0]'s structure and a Field for each of its leaves: how every sample is written into a batch's
    slots (threads.BatchBuffer of batch_fields), and the batch built from them, as default_collate builds it."""

    def __init__(self, first):
        self.fields = []
        self.root = part_of(first, "", self.fields)
        self.batch_fields = [field.batch_field for field in self.fields]
        self.sample_bytes = sum(
            math.prod(shape) * dtype.itemsize for shape, dtype in self.batch_fields if dtype is not None
        )

    def write(self, sample, position, slots, row):
        leaves = []
        self.root.flatten(sample, position, leaves)
        for field, value, slot in zip(self.fields, leaves, slots, strict=True):
            field.write(value, slot, row, position)

    def batch(self, fields):
        """The batch of these rows of the fields; None for a batch whose samples were all unreadable."""
        if self.fields and len(fields[0]) == 0:
            return None
        return self.root.build(iter(fields))


class Unreadable(typing.NamedTuple):
    """A sample skipped as unreadable: the file it names (or "dataset[i]") and why."""

    name: str
    reason: str


def file_in(error):
    """The file being read where `error` was raised: in the innermost frame of its traceback that holds an open
    file, or a PIL image read from one (Pillow's own frames do); None where no frame does."""
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        for value in list(frame.f_locals.values()):
            if isinstance(value, Image.Image):
                name = value.filename or getattr(getattr(value, "fp", None), "name", None)
            else:
                name = getattr(value, "name", None) if isinstance(value, io.IOBase) else None
            if isinstance(name, str) and name:
                return name
    return None


def read_sample(dataset, position, on_error):
    """dataset[position]; an Unreadable where it raises what train.py counts as an unreadable file and on_error is
    "skip"."""
    if on_error == "raise":
        return dataset[position]
    try:
        return dataset[position]
    except decode.UNREADABLE_IMAGE_ERRORS as error:
        return Unreadable(file_in(error) or f"dataset[{position}]", decode.error_reason(error))


class InPlaceSamples:
    """A user's Dataset as the thread loader's in-place dataset: each sample read in a decode thread and written
    into its rows of the batch (SampleLayout); an unreadable one is added to `skipped` and left out."""

    def __init__(self, dataset, layout, on_error, skipped):
        self.dataset, self.layout, self.on_error, self.skipped = dataset, layout, on_error, skipped
        self.batch_fields = layout.batch_fields

    def __len__(self):
        return len(self.dataset)

    def write_sample(self, key, slots, row):
        sample = read_sample(self.dataset, key[0], self.on_error)
        if isinstance(sample, Unreadable):
            self.skipped.add(sample.name, lambda: sample.reason)
            return False
        self.layout.write(sample, key[0], slots, row)
        return True

    def batch_of(self, fields, unreadable):
        return self.layout.batch(fields)

    def for_worker_processes(self):
        """(dataset, collate) as build_loader's worker processes read these samples."""
        return KeyedSamples(self.dataset, self.on_error), CollateInWorker(self.layout)


class KeyedSamples(torch.utils.data.Dataset):
    """The user's dataset read by (position, epoch) keys, as the EpochSampler yields them, in worker processes:
    (position, the sample or an Unreadable)."""

    def __init__(self, dataset, on_error):
        self.dataset, self.on_error = dataset, on_error

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        return key[0], read_sample(self.dataset, key[0], self.on_error)


class CollateInWorker:
    """A worker's batch of (position, sample) pairs, written as the threads write theirs (into a BatchBuffer in
    shared memory): (the batch or None, the Unreadables, None or a SampleError's line). The line travels as a
    value, so that the loop raises it as one line rather than inside DataLoader's report of a worker's error."""

    def __init__(self, layout):
        self.layout = layout

    def __call__(self, items):
        readable = [(position, sample) for position, sample in items if not isinstance(sample, Unreadable)]
        skipped = [sample for _, sample in items if isinstance(sample, Unreadable)]
        buffer = threads.BatchBuffer(len(readable), self.layout.batch_fields)
        try:
            for row, (position, sample) in enumerate(readable):
                self.layout.write(sample, position, buffer.slots, row)
        except SampleError as error:
            return None, skipped, f"{error}"
        return self.layout.batch(buffer.fields), skipped, None


class UserLoader:
    """create_loader's loader: iterate it for the batches. loader.plan is the plan, loader.sampler the EpochSampler
    (set_epoch(epoch) before each pass), loader.skipped the unreadable files met (decode.UnreadableFiles),
    loader.batches the ThreadLoader or DataLoader underneath."""

    def __init__(self, batches, used, dataset, skipped, print_line):
        self.batches, self.plan, self.dataset, self.skipped = batches, used, dataset, skipped
        self.sampler, self.batch_size, self.drop_last = batches.sampler, batches.batch_size, batches.drop_last
        self.print_line = print_line

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        known, count = len(self.skipped.reasons), self.skipped.count
        for batch in self.batches if self.plan.loader == "threads" else self.from_workers():
            if batch is not None:  # a batch whose samples were all unreadable is left out
                yield batch
        new = list(self.skipped.reasons)[known:]
        if new and self.print_line is not None:
            self.print_line(
                f"torchlab loader: skipped {self.skipped.count - count} unreadable samples in this pass, "
                f"{len(new)} files new: {self.skipped.named(new)}; all in loader.skipped"
            )

    def from_workers(self):
        for batch, skipped, error in self.batches:
            for sample in skipped:
                self.skipped.add(sample.name, lambda sample=sample: sample.reason)
            if error is not None:
                raise SampleError(error)
            yield batch


def first_readable(dataset, on_error):
    """The first sample that reads (the layout's model); SampleError where there is none."""
    sample = None
    for position in range(len(dataset)):
        sample = read_sample(dataset, position, on_error)
        if not isinstance(sample, Unreadable):
            return sample
    what = f"e.g. {sample.name}: {sample.reason}" if sample else "it is empty"
    raise SampleError(f"create_loader: no sample of the dataset could be read ({what})")


def create_loader(
    dataset,
    batch_size,
    shuffle=True,
    drop_last=None,
    loader="auto",
    workers="auto",
    prefetch_factor=None,
    seed=0,
    device="cpu",
    print_plan=print,
    on_error="skip",
):
    """The loader (a UserLoader) of `dataset` (map-style) with the plan train.py would make on this machine for
    --loader `loader`, --workers `workers` and --prefetch-factor; print_plan(line) is called with the plan and
    with each pass's new unreadable files (None: quiet). Batches: default_collate's of the readable samples.
    on_error: "skip" unreadable files (train.py's way) or "raise" (DataLoader's)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"create_loader: on_error={on_error!r}; expected 'skip' or 'raise'")
    device = torch.device(device)
    layout = SampleLayout(first_readable(dataset, on_error))
    asked = plan.Asked(
        loader=loader, workers=workers, prefetch_factor=prefetch_factor, decode="cpu", batch_size=batch_size, seed=seed
    )
    here = machine.probe(cuda=device.type == "cuda")
    used = plan.plan(asked, None, here, plan.Data(batch_bytes={"cpu": batch_size * layout.sample_bytes}))
    skipped = decode.UnreadableFiles()
    samples = InPlaceSamples(dataset, layout, on_error, skipped)
    batches = build_loader(samples, used, device, shuffle, drop_last=drop_last)
    if print_plan is not None:
        print_plan(f"torchlab loader: {used.describe()}")
    return UserLoader(batches, used, dataset, skipped, print_plan)
