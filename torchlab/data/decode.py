"""Decoding with crop and resize in one pass, and the Dataset that does it for each sample.

Decoding goes straight from the file to the network's input size: the crop box is chosen from the image's
full-size dimensions first, a JPEG is then decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, PIL's
Image.draft) as long as the crop keeps at least the output's resolution, and one resize cuts out the box
and scales it. A 4000 x 3000 photo cropped to 224 px decodes at 1/8 size: most of the decode time is saved.
"""

import functools
import math
import random
import threading
from io import BytesIO

import numpy as np
import torch
from PIL import Image

try:  # the region decoder, a C extension built with the package (pyproject.toml); Pillow alone without it
    import torchlab_jpeg
except ImportError:
    torchlab_jpeg = None

# RandomResizedCrop's ranges (Inception's, torchvision's defaults): the box's share of the image's area
# and the box's width / height.
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
# Validation: the classic "resize the short side to size / 0.875, take the centre size x size".
VAL_CROP_FRACTION = 0.875
# PIL first shrinks by a whole factor while the box is more than this many times the output, then
# resamples; at 3.0 the result is indistinguishable from resampling the full box (PIL's documentation).
RESIZE_REDUCING_GAP = 3.0
# Pillow's DCT scales, largest first.
DRAFT_SCALES = (8, 4, 2, 1)
# What PIL raises for an unreadable, truncated or hostile file.
UNREADABLE_IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


UNREADABLE_EXAMPLES = 5  # unreadable files named in a line that reports them


def error_reason(error):
    """Why a file could not be decoded, in one line, from the error its decoder raised."""
    if isinstance(error, Image.UnidentifiedImageError):  # its message may name only a BytesIO
        return "not an image Pillow can read (an unknown format, or no image at all)"
    return f"{type(error).__name__}: {error}".replace("\n", " ")


def unreadable_reason(source):
    """Why ImageDataset could not decode `source`, in one line (asked again, for the report of bad images)."""
    try:
        load_crop(source, center_crop_box, 8)
    except UNREADABLE_IMAGE_ERRORS as error:
        return error_reason(error)
    return "decoded when read again (a file that changed during the epoch?)"


class UnreadableFiles:
    """The unreadable files met so far, each named once with the reason, and how many samples were skipped for
    them: train.py's bad images and create_loader's loader.skipped alike. Threads may add at once."""

    def __init__(self, reasons=()):
        self.reasons = dict(reasons)  # file -> reason, in the order they were first met
        self.count = 0
        self.lock = threading.Lock()

    def add(self, name, reason):
        """One sample of the file `name` skipped; reason() says why, asked only for a file not named yet."""
        with self.lock:
            self.count += 1
            if name not in self.reasons:
                self.reasons[name] = reason()

    def named(self, names):
        """The first UNREADABLE_EXAMPLES of `names` (files added here), each with its reason."""
        return "; ".join(f"{name} ({self.reasons[name]})" for name in names[:UNREADABLE_EXAMPLES])

    def __str__(self):
        if not self.count:
            return "no unreadable files skipped"
        return f"skipped {self.count} unreadable samples of {len(self.reasons)} files: {self.named(list(self.reasons))}"


def rgb_image(image):
    """`image` (any Pillow mode) as 8-bit RGB. Pillow's convert clips 16-bit samples at 255 where it should
    scale them, so a 16-bit greyscale PNG or TIFF would come out white: those are scaled to 8 bits here."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I"):  # I;16, I;16B, ... and I, in which Pillow also hands out 16-bit samples
        samples = np.clip(np.asarray(image, dtype=np.int64), 0, 65535)
        return Image.fromarray(((samples + 128) // 257).astype(np.uint8), "L").convert("RGB")
    if image.mode == "F":
        raise ValueError("floating-point samples have no 8-bit scale; save the image with 8 or 16 bits")
    return image.convert("RGB")  # grey, palette, RGBA, CMYK, ...


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


def draft_scale(width, height, box, size):
    """Pillow's draft rule: the largest of 8, 4, 2, 1 by which the image may be shrunk while the box still
    spans `size` pixels each way (JPEG's DCT scaling decodes at 1/8, 1/4, 1/2 or full size)."""
    wanted = (math.ceil(width * size / (box[2] - box[0])), math.ceil(height * size / (box[3] - box[1])))
    fits = min(width // wanted[0], height // wanted[1])
    return next((scale for scale in DRAFT_SCALES if fits >= scale), 1)


def pillow_crop(source, choose_box, size, draft):
    """The box choose_box(width, height) of `source` resized to size x size, decoded by Pillow (any format)."""
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
        rgb = rgb_image(image)
        return rgb.resize((size, size), Image.Resampling.BILINEAR, box=box, reducing_gap=RESIZE_REDUCING_GAP)


def resize_box(image, box, size, flip, dtype=None):
    """The box (left, top, right, bottom, rounded to whole pixels) of a one-image NCHW tensor, as `dtype` (None:
    as it is), resized to size x size with the antialiased bilinear filter and mirrored when flip is set. Both
    decoding paths (region_crop here, the GPU's in device_decode) cut and resize through this one function."""
    left, top, right, bottom = (round(coordinate) for coordinate in box)
    crop = image[:, :, top : top + max(1, bottom - top), left : left + max(1, right - left)]
    resized = torch.nn.functional.interpolate(
        crop if dtype is None else crop.to(dtype),
        size=(size, size),
        mode="bilinear",
        antialias=True,
        align_corners=False,
    )
    return resized.flip(3) if flip else resized


def region_crop(data, box, width, height, size, draft, flip, out=None):
    """The box of the JPEG `data` resized to size x size (HWC uint8) and mirrored when flip is set (written into
    `out`, a (size, size, 3) uint8 array, when given), decoding
    only the rows and columns it needs (and, for subsampled chroma, a margin: torchlab_jpeg), then resizing
    with torch's antialiased bilinear filter on uint8 (several times faster than Pillow's, within 55-75 dB of
    it); None where the region decoder refuses the file."""
    scale = draft_scale(width, height, box, size) if draft else 1
    left, top, right, bottom = (round(coordinate / scale) for coordinate in box)
    region = torchlab_jpeg.decode_region(data, scale, left, top, right, bottom)
    if region is None:
        return None
    pixels, region_left, region_top, region_width, region_height = region
    # NHWC bytes seen as NCHW: channels_last, which torch resizes fastest on uint8; flipping the result there is
    # 15x faster than numpy's copy of a reversed HWC view.
    decoded = torch.frombuffer(pixels, dtype=torch.uint8).view(1, region_height, region_width, 3).permute(0, 3, 1, 2)
    in_region = (left - region_left, top - region_top, right - region_left, bottom - region_top)
    if out is None:
        return resize_box(decoded, in_region, size, flip)[0].permute(1, 2, 0).numpy()
    # One copy into the batch's slot, mirrored on the way (torch's flip would copy once more).
    copy_mirrored(out, resize_box(decoded, in_region, size, flip=False)[0].permute(1, 2, 0).numpy(), flip)
    return out


def copy_mirrored(out, pixels, flip):
    """Copy the HWC uint8 `pixels` into `out`, mirrored left to right when flip is set. The pixels are copied as
    3-byte items: numpy copies a reversed view of single bytes 3x slower (0.33 against 0.12 ms at 224 px);
    either way without the GIL."""
    if flip:
        np.copyto(out.view("V3")[..., 0], pixels.view("V3")[:, ::-1, 0])
    else:
        np.copyto(out, pixels)


def encoded_bytes(source):
    """The file's bytes: `source` is a path or a file object (a prepared copy's BytesIO)."""
    if isinstance(source, BytesIO):
        return source.getbuffer()
    if hasattr(source, "read"):
        return source.read()
    with open(source, "rb") as encoded:
        return encoded.read()


def load_crop(source, choose_box, size, flip=False, draft=True, out=None):
    """Decode `source` (a path or a file object) and return the box choose_box(width, height) resized to
    size x size: HWC uint8 RGB, written into `out` (a (size, size, 3) uint8 array: a sample's slot in a batch)
    when given. draft=False decodes a JPEG at full size (for comparison).

    Baseline JPEGs in YCbCr, RGB or grey go through the region decoder (torchlab_jpeg, when it is built) and
    torch's resize; everything else, and any file the decoder refuses, through Pillow, as before. choose_box
    is called once either way, so the augmentation drawn for a sample does not depend on the path.
    """
    header = None
    if torchlab_jpeg is not None:
        source = encoded_bytes(source)
        header = torchlab_jpeg.image_size(source)
    if header is not None and header[2]:
        width, height, _ = header
        box = choose_box(width, height)
        pixels = region_crop(source, box, width, height, size, draft, flip, out)
        if pixels is not None:
            return pixels
        choose_box = functools.partial(fixed_box, box)
    crop = pillow_crop(BytesIO(source) if torchlab_jpeg is not None else source, choose_box, size, draft)
    if out is not None:
        copy_mirrored(out, np.asarray(crop), flip)
        return out
    if flip:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(crop)


def fixed_box(box, width, height):
    return box


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

    def augmentation(self, position, epoch):
        """(flip, choose_box) of a sample: drawn from its own generator in training, the centre box in validation.
        choose_box(width, height) is to be called once, with the image's full-size dimensions."""
        if not self.train:
            return False, center_crop_box
        rng = random.Random(f"{self.seed}/{epoch}/{position}")
        flip = rng.random() < 0.5
        return flip, functools.partial(random_resized_crop_box, rng=rng)

    def __getitem__(self, key):
        position, epoch = key
        label = int(self.index.labels[position])
        flip, choose_box = self.augmentation(position, epoch)
        try:
            pixels = load_crop(self.index.source(position), choose_box, self.image_size, flip, self.draft)
        except UNREADABLE_IMAGE_ERRORS:
            return None, label, position
        return pixels, label, position

    @property
    def batch_fields(self):
        """The thread loader's slots for a batch of samples, (shape, dtype) each: the image's and the label's."""
        return [((self.image_size, self.image_size, 3), torch.uint8), ((), torch.int64)]

    def write_sample(self, key, slots, row):
        """Decode the sample `key` straight into row `row` of `slots` (the numpy views of a batch's batch_fields:
        the thread loader's way, no collate copy). Returns whether it was readable; the same pixels as
        __getitem__'s."""
        position, epoch = key
        slots[1][row] = self.index.labels[position]
        flip, choose_box = self.augmentation(position, epoch)
        try:
            load_crop(self.index.source(position), choose_box, self.image_size, flip, self.draft, out=slots[0][row])
        except UNREADABLE_IMAGE_ERRORS:
            return False
        return True

    @staticmethod
    def batch_of(fields, unreadable):
        """The thread loader's batch of the readable rows' fields: (images, labels, unreadable positions)."""
        images, labels = fields
        return images, labels, unreadable
