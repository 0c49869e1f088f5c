"""Decoding on the device (--decode gpu): the loader workers only read each file's bytes and draw its
augmentation; the main process decodes the whole batch on the GPU with nvJPEG (torchvision's batched
decode_jpeg), then crops, resizes, flips and normalises there.

The crop box and the flip of a sample come from the same generator as on the CPU path (ImageDataset.
augmentation, seeded by seed, epoch and position), drawn from the image's full-size header: the same boxes
and flips for the same (seed, epoch, position) whichever path decodes. nvJPEG decodes whole images (torchvision
offers it no region), so the box is cut from the full decode and resized by the CPU path's own function
(decode.resize_box), in float (no rounding back to uint8 before normalising).

What the device does not decode falls back to the CPU path for that sample: files that are not baseline
JPEGs in YCbCr, RGB or grey (PNG, progressive, CMYK, ...), or that are cut off before their end-of-image
marker, are decoded in the worker, as --decode cpu does;
a file nvJPEG refuses is decoded in the main process by the CPU path; one that neither can read is dropped
from the batch and reported like any unreadable image (DeviceDecoder.take_unreadable).
"""

import concurrent.futures
import functools
import typing
from io import BytesIO

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from torchlab.data import decode
from torchlab.pipeline import loader, plan

JPEG_START = b"\xff\xd8\xff"
JPEG_END = b"\xff\xd9"
SNIFFED_SAMPLES = 32  # files read to decide whether --decode auto means gpu: most of them must be JPEGs
# /dev/shm per encoded sample: twice the mean file size of the first ones (sizes vary), at least one decoded sample.
SIZE_SAMPLES = 64
SIZE_MARGIN = 2


def mostly_jpegs(index, count=SNIFFED_SAMPLES):
    """Whether most of `count` samples spread over `index` (a SampleIndex or PreparedIndex) start as JPEGs do."""
    if len(index) == 0:
        return False
    positions = np.unique(np.linspace(0, len(index) - 1, min(count, len(index))).astype(int))
    jpegs = 0
    for position in positions:
        try:
            jpegs += bytes(decode.encoded_bytes(index.source(int(position)))[: len(JPEG_START)]) == JPEG_START
        except OSError:  # unreadable: not a JPEG as far as this count goes
            continue
    return jpegs * 2 > len(positions)


def plan_data(index, image_size, batch_size, decoders=("cpu", "gpu")):
    """What the loader plan takes of train.py's data (plan.Data): one batch's bytes in /dev/shm for each of
    `decoders` (plan.decoders_possible), and whether most files of `index` are JPEGs where gpu is one of them.
    Only the gpu decoder's figures read files: a run that cannot decode on the GPU reads none here."""
    batch_bytes = {"cpu": loader.batch_bytes(batch_size, image_size)}
    if "gpu" not in decoders:
        return plan.Data(batch_bytes=batch_bytes)
    encoded = EncodedImageDataset(index, image_size, train=True, seed=0, draft=True)
    return plan.Data(
        batch_bytes={**batch_bytes, "gpu": encoded.batch_bytes(batch_size)}, mostly_jpegs=mostly_jpegs(index)
    )


def device_decodable_size(data):
    """(width, height) of a whole baseline JPEG in YCbCr, RGB or grey, which nvJPEG decodes as the CPU path
    does; None for anything else (decoded on the CPU instead). Whole: ending in the end-of-image marker. nvJPEG
    decodes a file cut off in its scan without an error (seen on an H200), where libjpeg reports it; such
    files go to the CPU path, which reports them as unreadable."""
    if bytes(data[-len(JPEG_END) :]) != JPEG_END:
        return None
    if decode.torchlab_jpeg is not None:
        header = decode.torchlab_jpeg.image_size(data)
        return header[:2] if header is not None and header[2] else None
    try:
        with Image.open(BytesIO(data)) as image:
            plain = image.format == "JPEG" and image.mode in ("RGB", "L") and not image.info.get("progressive")
            return image.size if plain else None
    except decode.UNREADABLE_IMAGE_ERRORS:
        return None


class EncodedSample(typing.NamedTuple):
    """A worker's sample: the encoded file and its full-size crop box and flip, or CPU-decoded pixels for a
    file the device does not decode, or neither (unreadable)."""

    data: object  # bytes-like, or None
    box: tuple
    flip: bool
    pixels: np.ndarray  # (size, size, 3) uint8, or None
    label: int
    position: int


class EncodedBatch(typing.NamedTuple):
    """A batch as the workers send it: every encoded file in one uint8 tensor (file i is data[offsets[i]:
    offsets[i + 1]]), its box (full-size pixels), flip and slot in the batch; the CPU-decoded samples'
    pixels and slots; and each slot's dataset position."""

    data: torch.Tensor
    offsets: torch.Tensor
    boxes: torch.Tensor
    flips: torch.Tensor
    slots: torch.Tensor
    pixels: torch.Tensor
    pixel_slots: torch.Tensor
    positions: torch.Tensor

    def files(self):
        """Each encoded file as a view of `data`."""
        bounds = self.offsets.tolist()
        return [self.data[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]


class EncodedImageDataset(decode.ImageDataset):
    """ImageDataset's samples, left encoded for DeviceDecoder: same keys, same augmentation draws."""

    def __getitem__(self, key):
        position, epoch = key
        label = int(self.index.labels[position])
        flip, choose_box = self.augmentation(position, epoch)
        unreadable = EncodedSample(None, (), False, None, label, position)
        try:
            data = decode.encoded_bytes(self.index.source(position))
        except OSError:
            return unreadable
        size = device_decodable_size(data)
        if size is not None:
            return EncodedSample(data, choose_box(*size), flip, None, label, position)
        try:  # not for the device: decoded here, as --decode cpu does
            pixels = decode.load_crop(BytesIO(data), choose_box, self.image_size, flip, self.draft)
        except decode.UNREADABLE_IMAGE_ERRORS:
            return unreadable
        return unreadable._replace(pixels=pixels)

    def batch_bytes(self, batch_size):
        """/dev/shm bytes of one batch: encoded files are about as large as decoded crops, and vary."""
        count = min(SIZE_SAMPLES, len(self.index))
        encoded = [len(decode.encoded_bytes(self.index.source(position))) for position in range(count)]
        decoded = self.image_size * self.image_size * 3
        return batch_size * max(decoded, SIZE_MARGIN * int(np.mean(encoded)) if encoded else 0)

    @staticmethod
    def collate(samples):
        """(EncodedBatch, labels int64 (N,), unreadable positions): the loader's batch for DeviceDecoder."""
        readable = [sample for sample in samples if sample.data is not None or sample.pixels is not None]
        encoded = [(slot, sample) for slot, sample in enumerate(readable) if sample.data is not None]
        decoded = [(slot, sample) for slot, sample in enumerate(readable) if sample.data is None]
        lengths = [len(sample.data) for _, sample in encoded]
        data = np.empty(sum(lengths), dtype=np.uint8)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        for (_, sample), start, end in zip(encoded, offsets[:-1], offsets[1:], strict=True):
            data[start:end] = np.frombuffer(sample.data, dtype=np.uint8)
        pixels = [sample.pixels for _, sample in decoded]
        batch = EncodedBatch(
            data=torch.from_numpy(data),
            offsets=torch.from_numpy(offsets),
            boxes=torch.tensor([sample.box for _, sample in encoded], dtype=torch.float64).view(-1, 4),
            flips=torch.tensor([sample.flip for _, sample in encoded], dtype=torch.bool),
            slots=torch.tensor([slot for slot, _ in encoded], dtype=torch.int64),
            pixels=torch.from_numpy(np.stack(pixels)) if pixels else torch.empty((0, 0, 0, 3), dtype=torch.uint8),
            pixel_slots=torch.tensor([slot for slot, _ in decoded], dtype=torch.int64),
            positions=torch.tensor([sample.position for sample in readable], dtype=torch.int64),
        )
        labels = torch.tensor([sample.label for sample in readable], dtype=torch.int64)
        unreadable = [sample.position for sample in samples if sample.data is None and sample.pixels is None]
        return batch, labels, torch.tensor(unreadable, dtype=torch.int64)


class DeviceDecoder(loader.BatchToDevice):
    """The device step of --decode gpu: an EncodedBatch and its labels in, (images, labels) out, the images
    normalised float NCHW in channels_last memory on the device, as BatchToDevice gives them.

    One batched decode_jpeg call decodes every encoded file of the batch on the device; when it fails (a file
    nvJPEG refuses), each file is decoded alone and the ones that still fail go through the CPU path here.
    Samples that nothing decodes are dropped, with their labels; take_unreadable() hands their positions to
    the training loop, which reports them as the workers' unreadable images are.

    batches() decodes the next batch in a thread of its own while the caller uses the current one. On CUDA a
    batch is decoded, cut and normalised on a stream of this decoder's own (decode_stream), which the caller's
    stream then waits for: nvJPEG decodes while the training step queues and runs.
    """

    def __init__(self, device, image_size):
        super().__init__(torch.device(device))
        self.image_size = image_size
        self.unreadable = []
        self.decode_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def decode_all(self, files):
        """Each file decoded to CHW uint8 RGB on the device, or None where the device refuses it."""
        if not files:
            return []
        if self.device.type == "cuda":
            # torchvision decodes on a stream of its own that is not ordered after the current one: memory
            # that work queued there still reads could be handed to the decoder and overwritten
            # (pytorch/vision#9606). The current stream is decode_stream (decode_on_stream), and the caching allocator
            # hands it only blocks last used on it, or blocks whose other streams' use is over (record_stream):
            # waiting for decode_stream alone closes the race, not for the training step on the caller's.
            torch.cuda.current_stream(self.device).synchronize()
        try:
            return decode_jpeg(files, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return [self.decode_one(encoded) for encoded in files]

    def decode_one(self, encoded):
        try:
            return decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return None

    def cpu_crop(self, encoded, box, flip):
        """The CPU path's crop of a file the device refused (HWC uint8), or None when it cannot read it either."""
        try:
            choose_box = functools.partial(decode.fixed_box, tuple(box))
            return decode.load_crop(BytesIO(encoded.numpy().tobytes()), choose_box, self.image_size, flip, draft=False)
        except decode.UNREADABLE_IMAGE_ERRORS:
            return None

    def __call__(self, batch, labels):
        return self.hand_over(*self.decode_on_stream(batch, labels))

    def batches(self, loader_batches):
        """As BatchToDevice.batches, but a thread of its own decodes the next batch while the caller uses this
        one: on CUDA torchvision's decode_jpeg lets go of the GIL while nvJPEG works, and returns only when the
        batch is decoded, which would otherwise hold up the training loop for as long."""
        host_batches = iter(loader_batches)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchlab-decode") as thread:
            upcoming = thread.submit(self.decode_next, host_batches)
            while (decoded := upcoming.result()) is not None:
                upcoming = thread.submit(self.decode_next, host_batches)
                images, labels, unreadable, ready = decoded
                yield (*self.hand_over(images, labels, ready), unreadable)

    def decode_next(self, host_batches):
        """The next loader batch decoded (decode_on_stream): (images, labels, its unreadable positions, ready),
        or None after the last."""
        host_batch = next(host_batches, None)
        if host_batch is None:
            return None
        batch, labels, unreadable = host_batch
        images, labels, ready = self.decode_on_stream(batch, labels)
        return images, labels, unreadable.tolist() + self.take_unreadable(), ready

    def decode_on_stream(self, batch, labels):
        """decode_batch, on decode_stream on CUDA: (images, labels, ready: an event recorded there when they
        are, or None off CUDA)."""
        if self.decode_stream is None:
            return (*self.decode_batch(batch, labels), None)
        with torch.cuda.stream(self.decode_stream):
            images, labels = self.decode_batch(batch, labels)
            ready = torch.cuda.Event()
            ready.record()
        return images, labels, ready

    def hand_over(self, images, labels, ready):
        """Images and labels from decode_on_stream, for the current stream: on CUDA it waits for `ready`, and
        the allocator does not reuse their memory before the current stream's work on them is done."""
        if ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)
            for tensor in (images, labels):
                tensor.record_stream(current)
        return images, labels

    def decode_batch(self, batch, labels):
        """(images, labels) on the device, on the current stream: decoded, cut, resized, flipped, normalised."""
        size = self.image_size
        # NHWC storage seen as NCHW: channels_last, as the model runs.
        output = torch.empty((len(labels), size, size, 3), device=self.device).permute(0, 3, 1, 2)
        kept = torch.ones(len(labels), dtype=torch.bool)
        files = batch.files()
        boxes, flips, slots = batch.boxes.tolist(), batch.flips.tolist(), batch.slots.tolist()
        for encoded, image, box, flip, slot in zip(files, self.decode_all(files), boxes, flips, slots, strict=True):
            if image is not None:
                # In float: nothing is rounded back to uint8 before normalising.
                output[slot] = decode.resize_box(image[None], box, size, flip, dtype=torch.float32)[0]
                continue
            pixels = self.cpu_crop(encoded, box, flip)
            if pixels is None:
                kept[slot] = False
                self.unreadable.append(int(batch.positions[slot]))
            else:
                output[slot] = torch.from_numpy(pixels).to(self.device).permute(2, 0, 1)
        if len(batch.pixel_slots):
            output[batch.pixel_slots.to(self.device)] = batch.pixels.to(self.device).permute(0, 3, 1, 2).float()
        output.sub_(self.mean).div_(self.std)
        labels = labels.to(self.device, non_blocking=True)
        if not kept.all():
            kept = kept.to(self.device)
            return output[kept].contiguous(memory_format=torch.channels_last), labels[kept]
        return output, labels

    def take_unreadable(self):
        """Positions of the samples dropped since the last call (nothing could decode them)."""
        unreadable, self.unreadable = self.unreadable, []
        return unreadable
