"""Decoding with crop and resize in one pass, and the Dataset that does it for each sample.

Decoding goes straight from the file to the network's input size: the crop box is chosen from the image's
full-size dimensions first, a JPEG is then decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, PIL's
Image.draft) as long as the crop keeps at least the output's resolution, and one resize cuts out the box
and scales it. A 4000 x 3000 photo cropped to 224 px decodes at 1/8 size: most of the decode time is saved.
"""

import functools
import math
import random

import numpy as np
import torch
from PIL import Image

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
