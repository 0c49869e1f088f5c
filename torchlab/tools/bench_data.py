"""The benchmark's data set: ImageNet-like JPEGs, generated once and the same on every machine.

`python -m torchlab.tools.bench_data OUT_DIR [--images N]` writes OUT_DIR/train/CLASS/*.JPEG and
OUT_DIR/val/CLASS/*.JPEG.
The files are shaped like ImageNet's training set where decoding cost comes from: about 469 x 387 px on
average, quality 95-97 with full-resolution chroma (4:4:4), 110-115 KB on average, with a small tail of large
photos (1024-1400 px on the long side). The content is 1/f ("pink") noise in luminance and colour, the
spectrum of natural images, so JPEG's entropy coding does as much work as on photos (flat colours would
compress to a few KB and decode several times faster).

Every image is drawn from a generator seeded by (seed, split, number): the same seed gives the same bytes
with the same numpy and Pillow. The set is written beside OUT_DIR and renamed into place when complete.
"""

import functools
import math
import multiprocessing
import os

import numpy as np
from PIL import Image

from torchlab import io, machine, parsing
from torchlab.tools import sample_data

CLASSES = 10
image_count = parsing.number(int, CLASSES)  # --images: one training image per class at least
VAL_SHARE = 0.05  # val/ images per train/ image
LARGE_SHARE = 0.03  # the share of large photos (1024 px and more on the long side)
LARGE_LONG_SIDE = (1024, 1400)
LARGE_ASPECT = 3 / 4
# Ordinary images: uniform sizes whose mean, with the large tail, is ImageNet's ~469 x 387.
WIDTH_RANGE = (400, 492)
HEIGHT_RANGE = (340, 402)
QUALITY_RANGE = (95, 97)
IMAGE_BYTES = 111_000  # a file's size on average, the large photos included: 233 MB for the default 2,100
# Pink-noise amplitudes, in 8-bit levels per unit standard deviation. Shapes and shading: strong noise drawn
# at 1/SHAPE_SCALE of the size and enlarged, cheap to encode, as in photos; texture: weak full-resolution
# noise, chosen so that the mean file is 110-115 KB at these qualities with 4:4:4 chroma.
SHAPE_SCALE = 8
SHAPE_LUMINANCE_AMPLITUDE = 40.0
SHAPE_CHROMA_AMPLITUDE = 20.0
TEXTURE_LUMINANCE_AMPLITUDE = 5.0
TEXTURE_CHROMA_AMPLITUDE = 2.5


def image_size(rng):
    """(width, height) of one image: mostly ImageNet's usual sizes, LARGE_SHARE of them large photos."""
    if rng.random() < LARGE_SHARE:
        long_side = int(rng.integers(LARGE_LONG_SIDE[0], LARGE_LONG_SIDE[1] + 1))
        return long_side, round(long_side * LARGE_ASPECT)
    return int(rng.integers(WIDTH_RANGE[0], WIDTH_RANGE[1] + 1)), int(
        rng.integers(HEIGHT_RANGE[0], HEIGHT_RANGE[1] + 1)
    )


def pink_noise_fields(rng, height, width, scale=1):
    """Luminance and two chroma fields of pink noise (H, W, 3), drawn at 1/scale of the size and enlarged."""
    small_height, small_width = math.ceil(height / scale), math.ceil(width / scale)
    fields = [sample_data.pink_noise(rng, small_height, small_width).astype(np.float32) for _ in range(3)]
    if scale > 1:
        enlarge = Image.Resampling.BICUBIC
        fields = [np.asarray(Image.fromarray(field).resize((width, height), enlarge)) for field in fields]
    return np.stack(fields, axis=-1)


def natural_image(rng, size=None):
    """An HWC uint8 image: a base colour, large 1/f shapes in luminance and colour, and fine 1/f texture;
    `size` (width, height), or drawn by image_size."""
    width, height = size or image_size(rng)
    base = rng.uniform(60, 190, size=3)
    pixels = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
    for scale, luminance_amplitude, chroma_amplitude in (
        (SHAPE_SCALE, SHAPE_LUMINANCE_AMPLITUDE, SHAPE_CHROMA_AMPLITUDE),
        (1, TEXTURE_LUMINANCE_AMPLITUDE, TEXTURE_CHROMA_AMPLITUDE),
    ):
        fields = pink_noise_fields(rng, height, width, scale)
        colour_mix = np.concatenate([np.full((1, 3), luminance_amplitude), chroma_amplitude * rng.normal(size=(2, 3))])
        pixels += fields @ colour_mix.astype(np.float32)  # luminance moves all channels; chroma tints them
    return np.clip(pixels, 0, 255).astype(np.uint8)


def image_path(folder, split, number):
    return os.path.join(folder, split, f"class_{number % CLASSES:02d}", f"{split}_{number:06d}.JPEG")


def write_image(folder, seed, split_and_number):
    split, number = split_and_number
    rng = np.random.default_rng([seed, sample_data.SPLIT_SEEDS[split], number])
    quality = int(rng.integers(QUALITY_RANGE[0], QUALITY_RANGE[1] + 1))
    path = image_path(folder, split, number)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(natural_image(rng)).save(path, quality=quality, subsampling=0)


def val_image_count(images):
    return max(CLASSES, math.ceil(images * VAL_SHARE))  # every class in val/


def write_bench_data(out_dir, images, seed=0, processes=None):
    """Write `images` training images (and VAL_SHARE as many for val/) once; False when already there."""
    val_images = val_image_count(images)
    jobs = [("train", number) for number in range(images)] + [("val", number) for number in range(val_images)]

    def write_into(folder):
        with multiprocessing.get_context("fork").Pool(processes or machine.usable_cpu_count()) as pool:
            pool.map(functools.partial(write_image, folder, seed), jobs, chunksize=16)

    settings = {"images": images, "val_images": val_images, "seed": seed}
    return io.publish_folder(out_dir, write_into, settings)


def main(argv=None, prog="python -m torchlab.tools.bench_data"):
    parser = sample_data.generated_folder_parser(prog, __doc__.split("\n\n")[0], "~/.cache/torchlab/bench-data-2000")
    parser.add_argument("--images", type=image_count, default=2000, help="training images (default: 2000)")
    args = parser.parse_args(argv)
    images = args.images + val_image_count(args.images)
    size = (images * IMAGE_BYTES, f"{images:,} images (--images {args.images} and {images - args.images:,} for val/)")
    io.report_published(prog, args.out_dir, lambda: write_bench_data(args.out_dir, args.images, args.seed), size=size)


if __name__ == "__main__":
    main()
