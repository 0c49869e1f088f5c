"""train.py --autotune (torchlab autotune): time loader settings on the real data and device, keep the fastest.

It tries --decode x --workers x --prefetch-factor x --jpeg-draft for a bounded time in all, each through
loader.build_loader and the device step exactly as training reads batches, prints a table, and saves the
fastest to a JSON file (DEFAULT_FILE unless --autotune-file), keyed by the data folder, image size, batch
size, device type and processes on the machine. A later run with --workers auto and the same key reads it
(one small file: --workers auto stays cheap); any other run ignores it. Settings whose batches in flight
would not fit in /dev/shm's free space are never tried, so never picked.
"""

import dataclasses
import json
import os
import time
import warnings

from torchlab import io, loader
from torchlab.data import device_decode

DEFAULT_FILE = "~/.cache/torchlab/autotune.json"
PREFETCH_FACTORS = (2, 4, 8)
JPEG_DRAFT_CHOICES = (True, False)


@dataclasses.dataclass(frozen=True)
class LoaderChoice:
    """What --workers, --prefetch-factor and --jpeg-draft resolve to, and whether a tuned setting gave them."""

    workers: int
    prefetch_factor: int
    jpeg_draft: bool
    decode: str
    autotuned: bool


def setting_key(data, image_size, batch_size, device, processes_on_machine):
    """What a tuned setting holds for: data folder, image size, batch size, device type, processes."""
    device_type = str(device).split(":")[0]
    return (
        f"{os.path.abspath(data)}|image_size={image_size}|batch_size={batch_size}"
        f"|device={device_type}|processes={processes_on_machine}"
    )


def resolve_loader(workers, prefetch_factor, jpeg_draft, decoder, settings_file, key, processes_on_machine):
    """The one answer to --workers auto: with "auto", the setting saved in `settings_file` for `key` (None: do
    not read one), else this process's share of the usable CPUs; --prefetch-factor and --jpeg-draft left None,
    and --decode auto, take the saved setting's, else their defaults (decode stays "auto" for
    config.resolve_decoder). train.py and the doctor both call this."""
    tuned = saved_setting(settings_file, key) if workers == "auto" and settings_file is not None else None
    if workers == "auto":
        workers = tuned["workers"] if tuned else loader.auto_worker_count(processes_on_machine)
    if prefetch_factor is None:
        prefetch_factor = tuned["prefetch_factor"] if tuned else loader.DEFAULT_PREFETCH_FACTOR
    if jpeg_draft is None:
        jpeg_draft = tuned["jpeg_draft"] if tuned else True
    if decoder == "auto" and tuned:
        decoder = tuned.get("decode", "cpu")  # settings saved before decoders were tuned timed the CPU's
    return LoaderChoice(workers, prefetch_factor, jpeg_draft, decoder, autotuned=tuned is not None)


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
    """Add or replace `key`'s setting, keeping the others (io.atomic_write)."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    settings = json.dumps({**read_settings(path), key: setting}, indent=2)
    io.atomic_write(path, lambda settings_file: settings_file.write(settings.encode()))


def candidate_settings(usable_cpus, decoders):
    """(decoder, workers, prefetch_factor, jpeg_draft) to try: each decoder, from half the CPUs to one more than
    there are (JPEG draft only matters where the workers decode: on the GPU it stays on)."""
    worker_counts = sorted({max(1, usable_cpus // 2), usable_cpus, usable_cpus + 1})
    return [
        (decoder, workers, prefetch_factor, jpeg_draft)
        for decoder in decoders
        for workers in worker_counts
        for prefetch_factor in PREFETCH_FACTORS
        for jpeg_draft in (JPEG_DRAFT_CHOICES if decoder == "cpu" else (True,))
    ]


def decoders_to_try(decoder, device, index):
    """--decode as given: cpu or gpu alone; auto: both where auto would mean gpu (device_decode.resolve_decoder),
    else cpu."""
    if decoder != "auto":
        return (decoder,)
    return ("cpu", "gpu") if device_decode.resolve_decoder("auto", device, index) == "gpu" else ("cpu",)


def measure_images_per_sec(dataset, decoder, settings, device, seconds):
    """Images/s of the training loader for `settings` (and make_dataset's `dataset` for `decoder`) over about
    `seconds`, leaving out each pass's first batch (the pipeline filling up, paid once per epoch)."""
    with warnings.catch_warnings():
        # Autotune times one worker more than there are CPUs on purpose: torch's warning about that setting
        # (when the loader is made, and at each pass) would only cut into the table.
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        train_loader = loader.build_loader(dataset, settings, device, train=True)
        to_device = device_decode.make_device_step(decoder, device, dataset.image_size)
        images, elapsed, epoch = 0, 0.0, 0
        while elapsed < seconds:
            train_loader.sampler.set_epoch(epoch)
            timing = loader.timed_pass(
                train_loader, to_device, device, lambda t, left=seconds - elapsed: t.seconds - t.fill_seconds >= left
            )
            images += timing.images - timing.first_batch_images
            elapsed += timing.seconds - timing.fill_seconds
            epoch += 1
    return images / elapsed


def fitting_settings(datasets, batch_size):
    """The candidate settings whose batches fit in /dev/shm's free space, and those that do not."""
    shm = loader.shared_memory_bytes()
    one_batch_bytes = {name: loader.dataset_batch_bytes(dataset, batch_size) for name, dataset in datasets.items()}
    fitting, skipped = [], []
    for setting in candidate_settings(loader.usable_cpu_count(), tuple(datasets)):
        decoder, workers, prefetch_factor, _ = setting
        fit = loader.fit_shared_memory(
            workers, prefetch_factor, one_batch_bytes[decoder], None if shm is None else shm[1]
        )
        (fitting if fit.fits else skipped).append(setting)
    if not fitting:
        raise loader.SharedMemoryError(
            f"/dev/shm has {shm[1] / loader.MB:.0f} MB free: no loader setting fits; start the container with "
            "--shm-size=8g (or --ipc=host)"
        )
    return fitting, skipped


def setting_row(decoder, workers, prefetch_factor, jpeg_draft):
    return f"{decoder:>7} {workers:>8} {prefetch_factor:>8} {'on' if jpeg_draft else 'off':>6}"


def tune(index, flags, device, key, print_line=print):
    """Try every candidate setting (decoder, workers, prefetch factor, JPEG draft) on the training samples of
    `index` for flags.autotune_seconds in all, print a table, save and return the best.

    `flags` is train.py's TrainConfig (its decode before config.resolve_decoder); settings whose batches would
    not fit in /dev/shm's free space are skipped.
    """
    datasets = {
        decoder: device_decode.make_dataset(decoder, index, flags.image_size, True, flags.seed, True)
        for decoder in decoders_to_try(flags.decode, device, index)
    }
    fitting, skipped = fitting_settings(datasets, flags.batch_size)
    seconds_each = flags.autotune_seconds / len(fitting)
    print_line(f"autotune: {len(fitting)} settings x {seconds_each:.1f} s on {device}; {key}")
    print_line(f"{'decode':>7} {'workers':>8} {'prefetch':>8} {'draft':>6} {'images/s':>9}")
    results = []
    for decoder, workers, prefetch_factor, jpeg_draft in fitting:
        # Workers stop after each measurement.
        settings = dataclasses.replace(
            flags.loader_settings(), workers=workers, prefetch_factor=prefetch_factor, persistent_workers=False
        )
        datasets[decoder].draft = jpeg_draft
        rate = measure_images_per_sec(datasets[decoder], decoder, settings, device, seconds_each)
        results.append((rate, decoder, workers, prefetch_factor, jpeg_draft))
        print_line(f"{setting_row(decoder, workers, prefetch_factor, jpeg_draft)} {rate:>9.1f}")
    for setting in skipped:
        print_line(f"{setting_row(*setting)}  skipped: /dev/shm too small")
    rate, decoder, workers, prefetch_factor, jpeg_draft = max(results)
    best = {"decode": decoder, "workers": workers, "prefetch_factor": prefetch_factor, "jpeg_draft": jpeg_draft,
            "images_per_sec": rate}  # fmt: skip
    try:
        save_setting(flags.autotune_file, key, {**best, "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        saved = f"saved to {flags.autotune_file} for runs with --workers auto"
    except OSError as error:  # a read-only home still gets the table
        saved = f"not saved: {error}"
    print_line(
        f"autotune: best --decode {decoder}, {workers} workers x prefetch {prefetch_factor}, JPEG draft "
        f"{'on' if jpeg_draft else 'off'}: {rate:.1f} images/s; {saved}"
    )
    return best
