"""train.py --autotune: time loader settings on the real data and device, and keep the fastest for later runs.

It tries --workers x --prefetch-factor x --jpeg-draft for a bounded time in all, each through
loader.build_loader and loader.BatchToDevice exactly as training reads batches, prints a table, and saves the
fastest to a JSON file (DEFAULT_FILE unless --autotune-file), keyed by the data folder, image size, batch
size, device type and processes on the machine. A later run with --workers auto and the same key reads it
(one small file: --workers auto stays cheap); any other run ignores it. Settings whose batches in flight
would not fit in /dev/shm's free space are never tried, so never picked.
"""

import json
import os
import time

import torch

import loader

DEFAULT_FILE = "~/.cache/torchlab/autotune.json"
PREFETCH_FACTORS = (2, 4, 8)
JPEG_DRAFT_CHOICES = (True, False)


def setting_key(args, processes):
    """What a tuned setting holds for: data folder, image size, batch size, device type, processes."""
    device_type = args.device.split(":")[0]
    return (
        f"{os.path.abspath(args.data)}|image_size={args.image_size}|batch_size={args.batch_size}"
        f"|device={device_type}|processes={processes.local_world_size}"
    )


def read_settings(path):
    """Every saved setting by key; {} when the file is missing or unreadable."""
    try:
        with open(os.path.expanduser(path)) as settings_file:
            settings = json.load(settings_file)
    except (OSError, json.JSONDecodeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def saved_setting(path, key):
    """The setting saved for `key` ({"workers", "prefetch_factor", "jpeg_draft", ...}), or None."""
    setting = read_settings(path).get(key)
    required = ("workers", "prefetch_factor", "jpeg_draft")
    return setting if isinstance(setting, dict) and all(name in setting for name in required) else None


def save_setting(path, key, setting):
    """Add or replace `key`'s setting, keeping the others; written to a temporary file and renamed."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    settings = {**read_settings(path), key: setting}
    temp_path = f"{path}.{os.getpid()}.tmp"
    with open(temp_path, "w") as temp_file:
        json.dump(settings, temp_file, indent=2)
    os.replace(temp_path, path)


def candidate_settings(usable_cpus):
    """(workers, prefetch_factor, jpeg_draft) to try: from half the CPUs to one more than there are."""
    worker_counts = sorted({max(1, usable_cpus // 2), usable_cpus, usable_cpus + 1})
    return [
        (workers, prefetch_factor, jpeg_draft)
        for workers in worker_counts
        for prefetch_factor in PREFETCH_FACTORS
        for jpeg_draft in JPEG_DRAFT_CHOICES
    ]


def measure_images_per_sec(dataset, options, device, seconds):
    """Images/s of the training loader for `options`, after its first batch, over about `seconds`."""
    train_loader = loader.build_loader(dataset, options, device, train=True)
    to_device = loader.BatchToDevice(device)
    images, epoch, start = 0, 0, None
    while start is None or time.perf_counter() - start < seconds:
        train_loader.sampler.set_epoch(epoch)
        for batch, labels, _ in train_loader:
            to_device(batch, labels)
            if start is None:  # the pipeline filling up is paid once per epoch, not per batch
                start = time.perf_counter()
            else:
                images += len(labels)
            if time.perf_counter() - start >= seconds:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return images / (time.perf_counter() - start)


def tune(dataset, args, device, key, print_line=print):
    """Try every candidate setting for args.autotune_seconds in all, print a table, save and return the best."""
    one_batch_bytes = loader.batch_bytes(args.batch_size, args.image_size)
    shm = loader.shared_memory_bytes()
    fitting, skipped = [], []
    for workers, prefetch_factor, jpeg_draft in candidate_settings(loader.usable_cpu_count()):
        needed = loader.shared_memory_needed(workers, prefetch_factor, one_batch_bytes)
        (fitting if shm is None or needed <= shm[1] else skipped).append((workers, prefetch_factor, jpeg_draft))
    if not fitting:
        raise loader.SharedMemoryError(
            f"/dev/shm has {shm[1] / loader.MB:.0f} MB free: no loader setting fits; start the container with "
            "--shm-size=8g (or --ipc=host)"
        )
    seconds_each = args.autotune_seconds / len(fitting)
    print_line(f"autotune: {len(fitting)} settings x {seconds_each:.1f} s on {device}; {key}")
    print_line(f"{'workers':>8} {'prefetch':>8} {'draft':>6} {'images/s':>9}")
    results = []
    for workers, prefetch_factor, jpeg_draft in fitting:
        options = with_loader_setting(args, workers, prefetch_factor)
        dataset.draft = jpeg_draft
        rate = measure_images_per_sec(dataset, options, device, seconds_each)
        results.append((rate, workers, prefetch_factor, jpeg_draft))
        print_line(f"{workers:>8} {prefetch_factor:>8} {'on' if jpeg_draft else 'off':>6} {rate:>9.1f}")
    for workers, prefetch_factor, jpeg_draft in skipped:
        print_line(f"{workers:>8} {prefetch_factor:>8} {'on' if jpeg_draft else 'off':>6}  skipped: /dev/shm too small")
    rate, workers, prefetch_factor, jpeg_draft = max(results)
    best = {"workers": workers, "prefetch_factor": prefetch_factor, "jpeg_draft": jpeg_draft, "images_per_sec": rate}
    try:
        save_setting(args.autotune_file, key, {**best, "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        saved = f"saved to {args.autotune_file} for runs with --workers auto"
    except OSError as error:  # a read-only home still gets the table
        saved = f"not saved: {error}"
    print_line(
        f"autotune: best {workers} workers x prefetch {prefetch_factor}, JPEG draft {'on' if jpeg_draft else 'off'}: "
        f"{rate:.1f} images/s; {saved}"
    )
    return best


def with_loader_setting(args, workers, prefetch_factor):
    """A copy of train.py's flags with these loader settings; workers stop after each measurement."""
    options = type(args)(**vars(args))
    options.workers, options.prefetch_factor, options.persistent_workers = workers, prefetch_factor, False
    return options
