"""The region decoder (torchlab_jpeg) and load_crop's fast path: exact pixels where it decodes, Pillow's
path where it does not, and a resize within 40 dB of Pillow's."""

import concurrent.futures
import io
import math
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from torchlab.data import decode
from torchlab.tools import bench_data

if os.environ.get("TORCHLAB_ENV_SOURCE"):  # inside the image, whose build always builds it
    import torchlab_jpeg
else:
    torchlab_jpeg = pytest.importorskip("torchlab_jpeg", reason="torchlab_jpeg is not built here (make build does)")

# (mode, subsampling, progressive) of the varied files: 4:4:4, 4:2:2, 4:2:0, grey, CMYK, progressive
KINDS = [("RGB", 0, False), ("RGB", 1, False), ("RGB", 2, False), ("L", 0, False), ("CMYK", 0, False), ("RGB", 2, True)]


def jpeg_bytes(pixels, mode, subsampling, progressive, quality):
    image = Image.fromarray(pixels)
    image = image if mode == "RGB" else image.convert(mode)
    encoded = io.BytesIO()
    options = {"subsampling": subsampling} if mode == "RGB" else {}
    image.save(encoded, "JPEG", quality=quality, progressive=progressive, **options)
    return encoded.getvalue()


def varied_jpegs(count=200, seed=0):
    """(bytes, mode, progressive, box) of `count` files: odd sizes, noisy content, boxes that touch each edge."""
    rng = np.random.default_rng(seed)
    for number in range(count):
        width, height = int(rng.integers(9, 700)), int(rng.integers(9, 600))
        pixels = (
            rng.integers(0, 256, (height, width, 3), dtype=np.uint8) // 2
            + np.linspace(0, 127, width).astype(np.uint8)[None, :, None]
        )
        mode, subsampling, progressive = KINDS[number % len(KINDS)]
        left, top = int(rng.integers(0, width)), int(rng.integers(0, height))
        right, bottom = int(rng.integers(left + 1, width + 1)), int(rng.integers(top + 1, height + 1))
        edge = number % 5  # 0: left and top edges, 1: right and bottom, 2: the whole image, else inside
        box = (
            [(0, 0, right, bottom), (left, top, width, height), (0, 0, width, height)][edge]
            if edge < 3
            else (left, top, right, bottom)
        )
        yield jpeg_bytes(pixels, mode, subsampling, progressive, int(rng.integers(60, 98))), mode, progressive, box


def test_regions_decode_to_the_full_decodes_pixels():
    decoded = 0
    for data, mode, progressive, (left, top, right, bottom) in varied_jpegs():
        width, height, supported = torchlab_jpeg.image_size(data)
        assert supported == (mode != "CMYK" and not progressive)
        if not supported:
            assert torchlab_jpeg.decode_region(data, 1, left, top, right, bottom) is None
            continue
        pixels, x, y, region_width, region_height = torchlab_jpeg.decode_region(data, 1, left, top, right, bottom)
        region = np.frombuffer(pixels, np.uint8).reshape(region_height, region_width, 3)
        region = region[top - y : bottom - y, left - x : right - x]
        with Image.open(io.BytesIO(data)) as image:
            full = np.asarray(image.convert("RGB"))[top:bottom, left:right]
            subsampled = mode == "RGB" and JpegImagePlugin.get_sampling(image) != 0
        difference = np.abs(region.astype(int) - full.astype(int))
        assert difference.max() <= 2 and (difference == 0).mean() >= 0.98, (mode, (width, height))
        # 4:4:4 and grey need no margin around the region: their pixels are a full decode's exactly.
        assert subsampled or difference.max() == 0, (mode, (width, height), (left, top, right, bottom))
        decoded += 1
    assert decoded >= 100


def test_files_the_region_decoder_refuses_take_pillows_path_unchanged(monkeypatch):
    for data, mode, progressive, box in varied_jpegs(count=40, seed=1):
        if mode != "CMYK" and not progressive:
            continue
        fast = decode.load_crop(io.BytesIO(data), lambda width, height, box=box: box, 64)
        monkeypatch.setattr(decode, "torchlab_jpeg", None)
        assert np.array_equal(fast, decode.load_crop(io.BytesIO(data), lambda width, height, box=box: box, 64))
        monkeypatch.undo()


def psnr(a, b):
    mse = np.mean((a.astype(float) - b.astype(float)) ** 2)
    return 10 * np.log10(255**2 / mse) if mse else float("inf")


def pillow_resize_of_the_same_region(data, box, size):
    """Pillow's BILINEAR (reducing_gap as load_crop's Pillow path) on the box the fast path resizes: the same
    DCT scale, the box rounded to that scale's pixels."""
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        wanted = (math.ceil(width * size / (box[2] - box[0])), math.ceil(height * size / (box[3] - box[1])))
        _, (_, _, scaled_width, _) = image.draft("RGB", wanted)  # Pillow's own choice of the DCT scale
        scale = width / scaled_width
        assert scale == decode.draft_scale(width, height, box, size)
        scaled_box = tuple(round(coordinate / scale) for coordinate in box)
        resized = image.convert("RGB").resize(
            (size, size), Image.Resampling.BILINEAR, box=scaled_box, reducing_gap=decode.RESIZE_REDUCING_GAP
        )
        return np.asarray(resized)


def test_the_fast_resize_is_within_40_db_of_pillows_and_the_whole_path_near_it(monkeypatch):
    """Training and validation crops of ImageNet-like images, through the fast path: against Pillow's resize
    of the same box of the same decode (the resize alone), and against Pillow's whole path (which also keeps
    the box's fractions at a DCT scale, where the fast path rounds them to whole pixels)."""
    worst_resize, worst_path = float("inf"), float("inf")
    for number in range(12):
        data = jpeg_bytes(bench_data.natural_image(np.random.default_rng([7, number])), "RGB", number % 3, False, 92)
        width, height = Image.open(io.BytesIO(data)).size
        for draw in range(6):
            rng = random.Random(f"{number}/{draw}")
            box = (
                decode.center_crop_box(width, height)
                if draw == 0
                else decode.random_resized_crop_box(width, height, rng)
            )
            chosen = []

            def once(width, height, box=box, chosen=chosen):
                chosen.append(box)
                return box

            fast = decode.load_crop(io.BytesIO(data), once, 224)
            assert len(chosen) == 1  # the box is drawn once
            worst_resize = min(worst_resize, psnr(fast, pillow_resize_of_the_same_region(data, box, 224)))
            monkeypatch.setattr(decode, "torchlab_jpeg", None)
            worst_path = min(worst_path, psnr(fast, decode.load_crop(io.BytesIO(data), lambda w, h, b=box: b, 224)))
            monkeypatch.undo()
    assert worst_resize >= 40, worst_resize
    assert worst_path >= 30, worst_path


def test_a_truncated_jpeg_is_unreadable_as_before():
    data = jpeg_bytes(np.full((64, 80, 3), 90, dtype=np.uint8), "RGB", 2, False, 90)
    truncated = data[: len(data) // 2]
    assert torchlab_jpeg.decode_region(truncated, 1, 0, 0, 80, 64) is None
    with pytest.raises(decode.UNREADABLE_IMAGE_ERRORS):
        decode.load_crop(io.BytesIO(truncated), decode.center_crop_box, 32)
    assert torchlab_jpeg.image_size(b"not a jpeg") is None


def test_an_empty_file_is_unreadable_not_a_crash():
    """libjpeg refuses empty data as it is handed over; that error must land where the decoder can catch it."""
    assert torchlab_jpeg.image_size(b"") is None
    assert torchlab_jpeg.decode_region(b"", 1, 0, 0, 8, 8) is None
    with pytest.raises(decode.UNREADABLE_IMAGE_ERRORS):
        decode.load_crop(io.BytesIO(b""), decode.center_crop_box, 32)


def test_the_decoder_loads_after_torchvision_and_pillow_have_their_own_libjpeg():
    """torchvision and Pillow bring libjpeg copies of their own (one answers to libjpeg.so.62): the region
    decoder must still load, as train.py imports torchvision first."""
    code = "import torchvision, PIL.Image; from torchlab.data import decode; print(decode.torchlab_jpeg is not None)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True"


def decode_calls_let_another_thread_run(decode_once, calls=20):
    """Whether another Python thread ran while `decode_once` was inside the C call, in at least one of `calls`
    calls. The switch interval is set far beyond the test's length, so the interpreter never takes the GIL from
    a thread running Python: the counting thread runs only where the decoding one lets the GIL go itself."""
    counter, done, overlapped = [0], threading.Event(), []

    def count():
        while not done.is_set():
            counter[0] += 1
            time.sleep(0)  # lets the GIL go, so the decoding thread can take it back after each call

    def decode_repeatedly():
        for _ in range(calls):
            before = counter[0]
            decode_once()
            overlapped.append(counter[0] > before)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    try:
        decoder = threading.Thread(target=decode_repeatedly)
        counter_thread = threading.Thread(target=count)
        counter_thread.start()
        decoder.start()
        decoder.join()
    finally:
        done.set()
        counter_thread.join()
        sys.setswitchinterval(interval)
    return any(overlapped)


def test_decoding_releases_the_gil():
    """Decode threads in one process decode in parallel only if the region decoder lets the GIL go around its
    libjpeg calls (it held it before issue 26); a corrupt file's error path must take it back correctly."""
    rng = np.random.default_rng(0)
    data = jpeg_bytes(rng.integers(0, 256, (1200, 1600, 3), dtype=np.uint8), "RGB", 2, False, 95)
    assert decode_calls_let_another_thread_run(lambda: torchlab_jpeg.decode_region(data, 1, 0, 0, 1600, 1200))
    truncated = data[: len(data) // 2]  # libjpeg's escape comes from inside the scan, the GIL let go
    results = []
    decode_calls_let_another_thread_run(
        lambda: results.append(torchlab_jpeg.decode_region(truncated, 1, 0, 0, 1600, 1200))
    )
    assert results == [None] * 20
    assert torchlab_jpeg.image_size(truncated)[:2] == (1600, 1200)


def test_threads_decode_what_one_thread_decodes():
    files = [(data, box) for data, mode, progressive, box in varied_jpegs(60) if mode != "CMYK" and not progressive]

    def region(item):
        data, (left, top, right, bottom) = item
        return torchlab_jpeg.decode_region(data, 1, left, top, right, bottom)

    alone = [region(item) for item in files]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        in_threads = list(pool.map(region, files))
    assert in_threads == alone
