"""How fast, and how close to Pillow, each way of resizing a crop to the network's input is: `python
benchmarks/resize.py` in the image with the sources mounted (benchmarks/resize.sh runs it so, with OpenCV and
Pillow-SIMD added in a throwaway container). It answered a design question (torch's filter stays: the dated
figures are in docs/performance.md), so it is no command of the package.

It generates photo-like images (tools/bench_data.py's 1/f shapes and texture, through a JPEG round trip) of
two sizes, ImageNet's usual 465x384 and 1600x1200, draws RandomResizedCrop boxes on them
(decode.random_resized_crop_box), cuts the crops out once, and resizes every crop to SIZE x SIZE with each
resizer:

  pillow       Pillow's BILINEAR with reducing_gap 3.0 (decode.RESIZE_REDUCING_GAP): the reference
  torch        torch.nn.functional.interpolate(mode="bilinear", antialias=True) on uint8: decode.resize_box
  opencv       cv2.resize: INTER_AREA when the crop shrinks more than 2x each way, else INTER_LINEAR (when cv2
               imports)
  pillow-simd  the same call as pillow, in a child process whose PIL is Pillow-SIMD (--pillow-simd DIR: a
               folder holding a `pip install --target DIR pillow-simd`)

For each: the median over the crops of each crop's best time over --passes, in ms per image, on one thread;
and the PSNR of its output against the reference's, min and median over the crops. A resizer that cannot be
measured here is listed with the reason. Results: a table on stdout and OUT_DIR/bench_resize.json.
"""

import functools
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from io import BytesIO

import numpy as np
import PIL
import torch
from PIL import Image

import torchlab
from torchlab import io, machine, parsing
from torchlab.data import decode
from torchlab.tools import bench_data
from torchlab.tools.gpu_check import psnr

# The crops' source images: name -> (width, height).
IMAGE_SIZES = {"465x384": (465, 384), "1600x1200": (1600, 1200)}
JPEG_QUALITY = 95  # the round trip that gives the images a decoded photo's artefacts
REFERENCE = "pillow"
REQUIRED_PSNR_DB = 40.0  # against the reference: what a replacement must reach on every crop
SIMD_VERSION_MARK = "post"  # Pillow-SIMD's versions look like 9.5.0.post1
RESULT_FILE = "bench_resize.json"
METHODS = {
    "pillow": f"Pillow resize, BILINEAR, reducing_gap={decode.RESIZE_REDUCING_GAP}",
    "torch": "torch interpolate, bilinear, antialias=True, uint8",
    "opencv": "cv2.resize, INTER_AREA past a 2x shrink each way, else INTER_LINEAR",
    "pillow-simd": f"Pillow-SIMD resize, BILINEAR, reducing_gap={decode.RESIZE_REDUCING_GAP} (child process)",
}
# What the child process with Pillow-SIMD on its path runs: pillow_child(crops.npz, out_dir, size, passes).
CHILD_CODE = "import sys; from benchmarks import resize; resize.pillow_child(*sys.argv[1:])"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Unavailable(Exception):
    """A resizer this run cannot measure; the message says why."""


def photo_like(rng, width, height):
    """A width x height HWC uint8 image like bench_data's, encoded as a JPEG and decoded again."""
    encoded = BytesIO()
    Image.fromarray(bench_data.natural_image(rng, (width, height))).save(encoded, "JPEG", quality=JPEG_QUALITY)
    encoded.seek(0)
    with Image.open(encoded) as image:
        return np.asarray(image.convert("RGB"))


def draw_crops(width, height, crops, images, seed):
    """`crops` RandomResizedCrop boxes cut out of `images` photo-like width x height images (HWC uint8)."""
    rng = np.random.default_rng([seed, width, height])
    photos = [photo_like(rng, width, height) for _ in range(images)]
    box_rng = random.Random(f"{seed}/{width}x{height}")
    result = []
    for number in range(crops):
        left, top, right, bottom = decode.random_resized_crop_box(width, height, box_rng)
        result.append(np.ascontiguousarray(photos[number % images][top:bottom, left:right]))
    return result


def pillow_resize(crop, size):
    """The reference, as decode.pillow_crop resizes (the PIL imported here: Pillow-SIMD in the child)."""
    resized = Image.fromarray(crop).resize(
        (size, size), Image.Resampling.BILINEAR, reducing_gap=decode.RESIZE_REDUCING_GAP
    )
    return np.asarray(resized)


def torch_resize(crop, size):
    """The training path's resize, decode.resize_box on the whole crop (as decode.region_crop calls it, on
    channels_last uint8): HWC uint8 in, HWC uint8 out."""
    height, width = crop.shape[:2]
    pixels = torch.from_numpy(crop).permute(2, 0, 1)[None]
    return decode.resize_box(pixels, (0, 0, width, height), size, flip=False)[0].permute(1, 2, 0).numpy()


def opencv_resize(cv2, crop, size):
    """INTER_AREA (a box filter: antialiased) when shrinking more than 2x each way, else INTER_LINEAR."""
    height, width = crop.shape[:2]
    shrinks_past_2x = width > 2 * size and height > 2 * size
    return cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA if shrinks_past_2x else cv2.INTER_LINEAR)


def opencv_resizer():
    """(cv2's version, its resize on one thread); Unavailable when cv2 does not import."""
    try:
        import cv2
    except ImportError as error:
        fix = "benchmarks/resize.sh installs opencv-python-headless"
        raise Unavailable(f"cv2 does not import ({error}); {fix}") from None
    cv2.setNumThreads(1)
    return cv2.__version__, functools.partial(opencv_resize, cv2)


def time_resizer(resize, crops, size, passes):
    """{group: (outputs, each crop's best seconds over `passes`)} for crops = {group: [HWC uint8]}."""
    resize(next(iter(crops.values()))[0], size)  # warm-up: first-call costs (allocation, dispatch)
    result = {}
    for group, group_crops in crops.items():
        outputs, best = [None] * len(group_crops), [math.inf] * len(group_crops)
        for _ in range(passes):
            for position, crop in enumerate(group_crops):
                start = time.perf_counter()
                outputs[position] = resize(crop, size)
                best[position] = min(best[position], time.perf_counter() - start)
        result[group] = (outputs, best)
    return result


def save_crops(path, crops):
    np.savez(path, **{f"{group}_{number:05d}": crop for group in crops for number, crop in enumerate(crops[group])})


def load_crops(path, groups):
    with np.load(path) as saved:
        names = sorted(saved.files)
        return {group: [saved[name] for name in names if name.startswith(f"{group}_")] for group in groups}


def pillow_child(crops_path, out_dir, size, passes):
    """In the child process: time pillow_resize with this process's PIL; write outputs.npz and timing.json."""
    crops = load_crops(crops_path, IMAGE_SIZES)
    timed = time_resizer(pillow_resize, crops, int(size), int(passes))
    save_crops(os.path.join(out_dir, "outputs.npz"), {group: outputs for group, (outputs, _) in timed.items()})
    with open(os.path.join(out_dir, "timing.json"), "w") as timing_file:
        json.dump(
            {
                "version": PIL.__version__,
                "file": PIL.__file__,
                "seconds": {group: seconds for group, (_, seconds) in timed.items()},
            },
            timing_file,
        )


def run_pillow_child(simd_dir, crops, size, passes, temp_dir):
    """pillow_child in a process with PYTHONPATH=simd_dir first: (its PIL's version and file, timed)."""
    crops_path = os.path.join(temp_dir, "crops.npz")
    save_crops(crops_path, crops)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torchlab.__file__)))
    path = os.pathsep.join([simd_dir, REPOSITORY, package_root])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", CHILD_CODE, crops_path, temp_dir, str(size), str(passes)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(f"the child process with PYTHONPATH={simd_dir} failed: {last_line}")
    with open(os.path.join(temp_dir, "timing.json")) as timing_file:
        timing = json.load(timing_file)
    outputs = load_crops(os.path.join(temp_dir, "outputs.npz"), crops)
    return timing, {group: (outputs[group], timing["seconds"][group]) for group in crops}


def pillow_simd_resizer(simd_dir, crops, size, passes):
    """(Pillow-SIMD's version, timed) measured in a child process; Unavailable unless its PIL is Pillow-SIMD."""
    if simd_dir is None:
        raise Unavailable("not asked for (--pillow-simd DIR; benchmarks/resize.sh builds it)")
    with tempfile.TemporaryDirectory(prefix="bench-resize-") as temp_dir:
        timing, timed = run_pillow_child(os.path.abspath(simd_dir), crops, size, passes, temp_dir)
    if SIMD_VERSION_MARK not in timing["version"]:
        raise Unavailable(
            f"not Pillow-SIMD: with PYTHONPATH={simd_dir}, PIL is Pillow {timing['version']} from {timing['file']} "
            f"(Pillow-SIMD's versions look like 9.5.0.post1)"
        )
    return timing["version"], timed


def finite_or_none(value):
    """JSON has no infinity: None stands for "identical to the reference"."""
    return value if math.isfinite(value) else None


def psnr_summary(psnrs):
    return {"min": finite_or_none(min(psnrs)), "median": finite_or_none(statistics.median(psnrs))}


def measured_row(name, version, timed, reference):
    """The report's row of a measured resizer: ms per image for each image size, PSNR against `reference`
    (min and median over all crops, and by image size)."""
    psnrs = {
        group: [psnr(output, expected) for output, expected in zip(outputs, reference[group][0], strict=True)]
        for group, (outputs, _) in timed.items()
    }
    row = {
        "available": True,
        "method": METHODS[name],
        "version": version,
        "reference": name == REFERENCE,
        "ms_per_image": {group: 1000 * statistics.median(seconds) for group, (_, seconds) in timed.items()},
        "psnr_db": psnr_summary([value for values in psnrs.values() for value in values]),
        "psnr_db_by_size": {group: psnr_summary(values) for group, values in psnrs.items()},
    }
    reference_ms = {group: 1000 * statistics.median(seconds) for group, (_, seconds) in reference.items()}
    row["speedup"] = {group: reference_ms[group] / ms for group, ms in row["ms_per_image"].items()}
    row["verdict"] = verdict(row)
    return row


def verdict(row):
    if row["reference"]:
        return "reference"
    lowest = math.inf if row["psnr_db"]["min"] is None else row["psnr_db"]["min"]
    speedups = " / ".join(f"{speedup:.1f}x" for speedup in row["speedup"].values())
    close = "close enough (>=" if lowest >= REQUIRED_PSNR_DB else "too far (<"
    return f"{close} {REQUIRED_PSNR_DB:.0f} dB), {speedups} Pillow's speed"


def resizer_rows(crops, size, passes, simd_dir, print_line):
    """Every resizer's row, the reference first: measured, or {"available": False, "reason": ...}."""
    in_process = {
        "pillow": lambda: (PIL.__version__, pillow_resize),
        "torch": lambda: (torch.__version__, torch_resize),
        "opencv": opencv_resizer,
    }
    rows, reference = {}, None
    for name in [*in_process, "pillow-simd"]:
        print_line(f"{name} ...")
        try:
            if name == "pillow-simd":
                version, timed = pillow_simd_resizer(simd_dir, crops, size, passes)
            else:
                version, resize = in_process[name]()
                timed = time_resizer(resize, crops, size, passes)
        except Unavailable as reason:
            rows[name] = {"available": False, "method": METHODS[name], "reason": str(reason)}
            continue
        reference = timed if name == REFERENCE else reference
        rows[name] = measured_row(name, version, timed, reference)
    return rows


def format_psnr(summary):
    """ "min / median" in dB; "identical" for infinity (the reference against itself)."""
    return " / ".join("identical" if summary[key] is None else f"{summary[key]:.1f}" for key in ("min", "median"))


def report_lines(report):
    groups = list(IMAGE_SIZES)
    settings = report["settings"]
    lines = [
        f"{settings['crops']} crops of each image size to {settings['size']} px, best of {settings['passes']} "
        f"passes, one thread; {report['machine']['usable_cpus']} usable CPUs, load average "
        f"{report['machine']['load_average_1min']:.2f} at the start",
        "",
        f"{'resizer':<12} "
        + " ".join(f"{'ms ' + group:>14}" for group in groups)
        + f" {'PSNR min / median':>21}  verdict",
    ]
    for name, row in report["resizers"].items():
        if not row["available"]:
            lines.append(f"{name:<12} not available: {row['reason']}")
            continue
        times = " ".join(f"{row['ms_per_image'][group]:>14.3f}" for group in groups)
        lines.append(f"{name:<12} {times} {format_psnr(row['psnr_db']):>21}  {row['verdict']}")
    lines += ["", "PSNR min / median (dB) by image size"]
    for name, row in report["resizers"].items():
        if row["available"] and not row["reference"]:
            by_size = ", ".join(f"{group}: {format_psnr(row['psnr_db_by_size'][group])}" for group in groups)
            lines.append(f"{name:<12} {by_size}")
    return lines


def run_bench_resize(args, print_line=print):
    """Measure every resizer on the same crops; write args.out_dir/bench_resize.json; return the report."""
    load_average = os.getloadavg()[0]
    print_line(f"generating {args.images} images and {args.crops} crops of each size ...")
    crops = {
        group: draw_crops(width, height, args.crops, args.images, args.seed)
        for group, (width, height) in IMAGE_SIZES.items()
    }
    settings = {"crops": args.crops, "images": args.images, "passes": args.passes, "size": args.size}
    settings.update(seed=args.seed, image_sizes=IMAGE_SIZES, required_psnr_db=REQUIRED_PSNR_DB)
    host = {"usable_cpus": machine.usable_cpu_count(), "load_average_1min": load_average}
    host.update(python=platform.python_version(), torch_threads=torch.get_num_threads())
    report = {
        "settings": settings,
        "machine": host,
        "resizers": resizer_rows(crops, args.size, args.passes, args.pillow_simd, print_line),
    }
    io.write_report(args.out_dir, RESULT_FILE, report, report_lines(report), print_line)
    return report


def build_parser(prog):
    parser = parsing.OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=parsing.positive_int, default=64, help="crops of each image size (default: 64)")
    parser.add_argument(
        "--images", type=parsing.positive_int, default=8, help="generated images of each size (default: 8)"
    )
    parser.add_argument(
        "--passes", type=parsing.positive_int, default=3, help="timed passes; each crop's best counts (default: 3)"
    )
    parser.add_argument("--size", type=parsing.image_size, default=224, help="output side in px (default: 224)")
    parser.add_argument("--seed", type=parsing.seed, default=0, help="the same seed, the same crops (default: 0)")
    parser.add_argument(
        "--pillow-simd",
        metavar="DIR",
        default=None,
        help="a folder holding Pillow-SIMD (pip install --target DIR pillow-simd), measured in a child process "
        "(default: none, not measured)",
    )
    parser.add_argument(
        "--out-dir", default="bench-results", help="where bench_resize.json goes (default: bench-results)"
    )
    return parser


def main(argv=None, prog="benchmarks/resize.py"):
    args = build_parser(prog).parse_args(argv)
    if args.pillow_simd is not None and not os.path.isdir(args.pillow_simd):
        io.exit_with_error(prog, f"--pillow-simd {args.pillow_simd}: not a folder (pip install --target DIR makes one)")
    io.writable_folder(prog, args.out_dir, f"--out-dir {args.out_dir}")
    torch.set_num_threads(1)  # one thread, as in each loader worker
    return run_bench_resize(args, print_line=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
