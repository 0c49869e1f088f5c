"""`torchlab autotune`: time loader settings on the real data and device, keep the fastest.

It takes train.py's flags (they say what to tune for), tries --decode x --loader x --workers x
--prefetch-factor x --jpeg-draft within --autotune-seconds in all, each setting a plan.Asked with every choice
made, planned and built (build.build_input) and read exactly as training reads batches, prints a
table, and saves the fastest to --autotune-file, keyed by the data folder, image size, batch size, device type
and processes on the machine. A later run with --workers auto and the same key reads it; any other run ignores
it. Worker-process settings whose batches in flight would not fit in /dev/shm's free space (the plan lowers or
refuses them) are never tried, so never picked.
"""

import os
import time
import warnings

import torch

from torchlab import config, distributed, io, machine, resolve
from torchlab.data import folder, splits
from torchlab.pipeline import build, device_decode, loader, plan, settings

PREFETCH_FACTORS = (2, 4, 8)
JPEG_DRAFT_CHOICES = (True, False)
MIN_SECONDS_EACH = 1.0  # a shorter measurement times little more than the loader's start: fewer settings then
BUDGET_RESERVE = 0.05  # of --autotune-seconds kept for the table, saving, and the last setting's shut-down
# What a saved setting holds of the fastest plan, under the plan's (and the flags') names.
SAVED_FIELDS = ("decode", "loader", "workers", "prefetch_factor", "jpeg_draft")


def process_age_seconds():
    """Seconds since this process started (torch's import included), from /proc; 0 where it cannot be read."""
    try:
        with open("/proc/self/stat") as stat_file:
            start_ticks = int(stat_file.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime_file:
            uptime = float(uptime_file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def candidate_settings(usable_cpus, decoders, batch_size, seed):
    """The settings to try, each a plan.Asked with every choice made: each decoder, decode threads and worker
    processes, from half the CPUs to one more than there are (JPEG draft only matters where the CPU decodes: on
    the GPU it stays on); worker processes started afresh for each."""
    worker_counts = sorted({max(1, usable_cpus // 2), usable_cpus, usable_cpus + 1})
    shared = {"batch_size": batch_size, "seed": seed, "persistent_workers": False}
    return [
        plan.Asked(loader=choice, workers=workers, prefetch_factor=factor, jpeg_draft=draft, decode=decoder, **shared)
        for decoder in decoders
        for choice in plan.LOADERS
        for workers in worker_counts
        for factor in PREFETCH_FACTORS
        for draft in (JPEG_DRAFT_CHOICES if decoder == "cpu" else (True,))
    ]


def decoders_to_try(decoder, device, data):
    """--decode as given: cpu or gpu alone; auto: both where auto would mean gpu (plan.auto_decoder, for
    `data`, the plan's plan.Data), else cpu."""
    if decoder != "auto":
        return (decoder,)
    cuda = str(device).startswith("cuda")
    return ("cpu", "gpu") if plan.auto_decoder(cuda, data.mostly_jpegs) == "gpu" else ("cpu",)


def measure_images_per_sec(index, image_size, used, device, seconds):
    """Images/s of the training loader of the loader plan `used` on the samples of `index` within `seconds` of
    wall-clock time in all (the loader's start, each pass's first batch, the shut-down), the rate leaving out
    each pass's first batch (the pipeline filling up, paid once per epoch)."""
    deadline = time.monotonic() + seconds
    with warnings.catch_warnings():
        # Autotune times one worker more than there are CPUs on purpose: torch's warning about that setting
        # (when the loader is made, and at each pass) would only cut into the table.
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        train_loader, _, to_device = build.build_input(used, image_size, device, index)
        images, elapsed, epoch = 0, 0.0, 0
        while time.monotonic() < deadline:
            train_loader.sampler.set_epoch(epoch)
            timing = loader.timed_pass(train_loader, to_device, device, lambda t: time.monotonic() >= deadline)
            images += timing.images - timing.first_batch_images
            elapsed += timing.seconds - timing.fill_seconds
            epoch += 1
    return images / elapsed if elapsed > 0 else 0.0


def planned_settings(flags, device, data, decoders):
    """(plans of the candidate settings as the loader plan makes them, the candidates it would not run as asked):
    worker processes whose batches do not fit in /dev/shm's free space are lowered or refused by the plan, so
    they are left out."""
    here = machine.probe(cuda=str(device).startswith("cuda"))
    plans, skipped = [], []
    for setting in candidate_settings(here.cpus, decoders, flags.batch_size, flags.seed):
        try:
            used = plan.plan(setting, None, here, data)
        except plan.SharedMemoryError:
            used = None
        planned = (used.workers, used.prefetch_factor) if used is not None else None
        as_asked = planned == (setting.workers, setting.prefetch_factor)
        (plans if as_asked else skipped).append(used if as_asked else setting)
    return plans, skipped


def likelihood_rank(setting, cpus):
    """Where `setting` (a plan.Asked or LoaderPlan) comes in the order of trying: train.py's defaults first (as
    many workers as CPUs, default batches ahead, JPEG draft on), then other worker counts, then other prefetch
    factors, then draft off."""
    threads = setting.loader == "threads"
    default_prefetch = plan.DEFAULT_THREAD_BATCHES_AHEAD if threads else plan.DEFAULT_PREFETCH_FACTOR
    nearest_default_prefetch = min(PREFETCH_FACTORS, key=lambda factor: abs(factor - default_prefetch))
    return (
        not setting.jpeg_draft,
        setting.prefetch_factor != nearest_default_prefetch,
        setting.workers != cpus,
        not threads,
        setting.decode,
    )


def setting_row(setting):
    """A plan.Asked or LoaderPlan as a row of the table: decode, loader, workers, prefetch, draft."""
    draft = "on" if setting.jpeg_draft else "off"
    return f"{setting.decode:>7} {setting.loader:>9} {setting.workers:>8} {setting.prefetch_factor:>8} {draft:>6}"


def time_settings(index, image_size, plans, device, seconds_each, print_line):
    """images/s of each plan in `plans` on the samples of `index`, seconds_each each, printed as a table:
    [(rate, plan)]."""
    print_line(f"{'decode':>7} {'loader':>9} {'workers':>8} {'prefetch':>8} {'draft':>6} {'images/s':>9}")
    results = []
    for used in plans:
        rate = measure_images_per_sec(index, image_size, used, device, seconds_each)
        results.append((rate, used))
        print_line(f"{setting_row(used)} {rate:>9.1f}")
    return results


def tune(index, flags, device, key, print_line=print, started=0.0):
    """Try every candidate setting (decoder, workers, prefetch factor, JPEG draft) on the training samples of
    `index` for flags.autotune_seconds in all, print a table, save and return the best.

    `started`: seconds of the budget spent before the call (main: the process's age, process_age_seconds).
    `flags` is a TrainConfig, `device` a torch.device; worker-process settings whose batches would not fit in
    /dev/shm's free space are skipped.
    """
    possible = plan.decoders_possible(flags.decode, device.type == "cuda")
    data = device_decode.plan_data(index, flags.image_size, flags.batch_size, possible)
    decoders = decoders_to_try(flags.decode, device, data)
    fitting, skipped = planned_settings(flags, device, data, decoders)
    # The budget is the whole run's, from the process's start: what is left is shared by the settings, each
    # given at least MIN_SECONDS_EACH; where that leaves too little for all, the likeliest are tried first.
    left = max(flags.autotune_seconds * (1 - BUDGET_RESERVE) - started, 0.0)
    if left < MIN_SECONDS_EACH:
        print_line(
            f"autotune: --autotune-seconds {flags.autotune_seconds:g} leaves {left:.1f} s after the start "
            f"({started:.1f} s: torch's import, indexing --data), too little to time one setting "
            f"({MIN_SECONDS_EACH:g} s); nothing saved: give it more"
        )
        return None
    cpus = machine.usable_cpu_count()
    fitting.sort(key=lambda used: likelihood_rank(used, cpus))
    untried = fitting[max(1, int(left // MIN_SECONDS_EACH)) :]
    fitting = fitting[: max(1, int(left // MIN_SECONDS_EACH))]
    seconds_each = left / len(fitting)
    print_line(f"autotune: {len(fitting)} settings x {seconds_each:.1f} s on {device}; {key}")
    results = time_settings(index, flags.image_size, fitting, device, seconds_each, print_line)
    for setting in skipped:
        print_line(f"{setting_row(setting)}  skipped: /dev/shm too small")
    if untried:
        print_line(
            f"autotune: {len(untried)} more settings not tried within --autotune-seconds "
            f"{flags.autotune_seconds:g} (at least {MIN_SECONDS_EACH:g} s each)"
        )
    rate, used = max(results, key=lambda result: result[0])
    best = {name: getattr(used, name) for name in SAVED_FIELDS} | {"images_per_sec": rate}
    try:
        settings.save_setting(flags.autotune_file, key, {**best, "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        saved = f"saved to {flags.autotune_file} for runs with --workers auto"
    except OSError as error:  # a read-only home still gets the table
        saved = f"not saved: {error}"
    print_line(
        f"autotune: best --decode {used.decode}, --loader {used.loader}, {used.workers} {plan.UNITS[used.loader]} x "
        f"prefetch {used.prefetch_factor}, JPEG draft {'on' if used.jpeg_draft else 'off'}: {rate:.1f} images/s; "
        f"{saved}"
    )
    return best


DESCRIPTION = (
    "Time loader settings on --data and this device within --autotune-seconds, print the table, and save the "
    "fastest to --autotune-file for later runs with --workers auto. Takes train.py's flags: --data, "
    "--image-size, --batch-size, --device and --decode say what to tune for."
)


def main(argv=None, prog="torchlab autotune"):
    processes = distributed.processes_from_environment()
    try:
        cfg = config.parse_args(argv, prog, DESCRIPTION)
        setup = resolve.resolve(cfg, processes, writes_run=False)
        torch.manual_seed(cfg.seed)
        _, train_index, _ = splits.load_splits(cfg.data, cfg.val_fraction, cfg.seed)
        if processes.world_size > 1:
            raise config.ConfigError("run it in one process, without torchrun")
        key = settings.setting_key(cfg.data, cfg.image_size, cfg.batch_size, setup.device, processes.local_world_size)
        tune(train_index, cfg, torch.device(setup.device), key, started=process_age_seconds())
    except (config.ConfigError, folder.DataError, plan.PlanError) as error:
        io.exit_with_error(prog, error)


if __name__ == "__main__":
    main()
