"""Write a small, realistic ImageFolder to try train.py on: `torchlab sample-data OUT_DIR`.

OUT_DIR/train/CLASS/*.JPEG and OUT_DIR/val/CLASS/*.JPEG: JPEGs of ImageNet-like size (400-500 x 350-400 px,
quality 90-96) with natural-looking 1/f ("pink") noise texture. Each class has its own dominant hue and
stripe orientation, so a model can learn to tell them apart within a few epochs. The same seed gives the
same files.

The set is built in a hidden temporary folder beside OUT_DIR and renamed to OUT_DIR when complete, so a
half-written set is never seen. If OUT_DIR already holds a complete set, nothing is done.
"""

import colorsys
import math
import os

import numpy as np
from PIL import Image

from torchlab import io, parsing

SPLIT_SEEDS = {"train": 0, "val": 1}
NOISE_FFT_SIDE = 512  # the smallest FFT side; larger images get the next power of two
IMAGE_BYTES = 88_000  # a file's size on average: the default set is 17.6 MB for 200 files


def pink_noise(rng, height, width):
    """Gaussian noise whose amplitude falls as 1/frequency, like natural images; unit standard deviation."""
    side = max(NOISE_FFT_SIDE, 1 << (max(height, width) - 1).bit_length())  # a square power of two (a fast FFT)
    frequency = np.hypot(np.fft.fftfreq(side)[:, None], np.fft.rfftfreq(side)[None, :])
    frequency[0, 0] = 1.0
    spectrum = (rng.standard_normal(frequency.shape) + 1j * rng.standard_normal(frequency.shape)) / frequency
    spectrum[0, 0] = 0.0
    noise = np.fft.irfft2(spectrum, s=(side, side))[:height, :width]
    return noise / noise.std()


def class_image(rng, class_id, classes):
    """One image of class `class_id`: its hue and stripe angle, jittered, over pink-noise texture; HWC uint8."""
    width, height = int(rng.integers(400, 501)), int(rng.integers(350, 401))
    hue = (class_id / classes + rng.normal(0, 0.02)) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.5, 0.9), rng.uniform(0.6, 0.9)))
    angle = math.pi * class_id / classes + rng.normal(0, 0.1)
    period = rng.uniform(25, 45)
    y, x = np.mgrid[0:height, 0:width]
    stripes = np.sin(2 * np.pi * (x * math.cos(angle) + y * math.sin(angle)) / period + rng.uniform(0, 2 * np.pi))
    shade = 0.75 + 0.12 * pink_noise(rng, height, width) + 0.15 * stripes
    tint = 0.06 * pink_noise(rng, height, width)[..., None] * rng.normal(size=3)  # colour blotches
    pixels = 255 * (colour * shade[..., None] + tint)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def write_split(folder, split, classes, per_class, seed):
    for class_id in range(classes):
        class_folder = os.path.join(folder, split, f"class_{class_id:02d}")
        os.makedirs(class_folder)
        for number in range(per_class):
            rng = np.random.default_rng([seed, SPLIT_SEEDS[split], class_id, number])
            path = os.path.join(class_folder, f"class_{class_id:02d}_{number:04d}.JPEG")
            Image.fromarray(class_image(rng, class_id, classes)).save(path, quality=int(rng.integers(90, 97)))


def write_sample_data(out_dir, classes, per_class, val_per_class, seed):
    """Build the set beside `out_dir` and rename it into place; returns False when it was already there."""

    def write_into(folder):
        write_split(folder, "train", classes, per_class, seed)
        if val_per_class > 0:  # without val/, train.py holds out --val-fraction of train/
            write_split(folder, "val", classes, val_per_class, seed)

    settings = {"classes": classes, "per_class": per_class, "val_per_class": val_per_class, "seed": seed}
    return io.publish_folder(out_dir, write_into, settings)


def generated_folder_parser(prog, description, example):
    """The flags of a command that writes a generated ImageFolder: the folder (e.g. `example`) and --seed; the
    command adds its counts."""
    parser = parsing.OneLineErrorParser(prog=prog, description=description)
    parser.add_argument("out_dir", help=f"folder to create, e.g. {example}")
    parser.add_argument("--seed", type=parsing.seed, default=0, help="the same seed writes the same files (default: 0)")
    return parser


def main(argv=None, prog="torchlab sample-data"):
    parser = generated_folder_parser(prog, __doc__.split("\n\n")[0], "/workspace/sample-data")
    parser.add_argument("--classes", type=parsing.positive_int, default=4, help="number of classes (default: 4)")
    parser.add_argument(
        "--per-class", type=parsing.positive_int, default=40, help="training images per class (default: 40)"
    )
    parser.add_argument(
        "--val-per-class", type=parsing.non_negative_int, default=10, help="validation images per class (default: 10)"
    )
    args = parser.parse_args(argv)
    images = args.classes * (args.per_class + args.val_per_class)
    counts = f"--classes {args.classes} x (--per-class {args.per_class} + --val-per-class {args.val_per_class})"
    io.report_published(
        prog,
        args.out_dir,
        lambda: write_sample_data(args.out_dir, args.classes, args.per_class, args.val_per_class, args.seed),
        size=(images * IMAGE_BYTES, f"{images:,} images ({counts})"),
    )


if __name__ == "__main__":
    main()
