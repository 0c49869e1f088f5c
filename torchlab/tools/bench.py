"""How fast the input pipelines are on this machine: `torchlab bench` (or `make bench`).

In one run, on the same generated files (tools/bench_data.py) and with a warm page cache, it measures, interleaved
over --repetitions after a warm-up pass:

  naive              torchvision ImageFolder + RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize;
                     DataLoader(num_workers=0), float batches
  classic            the same with --workers auto's count of workers (plan.auto_workers), pin_memory,
                     prefetch_factor=2, persistent workers
  torchlab           train.py's default pipeline, as --loader-only runs it (build.build_input)
  torchlab-prepared  the same on a prepared copy (torchlab prepare) of the files
  own-create_loader  a user's own Dataset of the usual kind (paths in __init__, Image.open and a resize to 224 px
                     in __getitem__) through torchlab.pipeline.create_loader, the public way in
  own-DataLoader     the same Dataset through the DataLoader a user sets by hand: classic's settings
  torchlab-gpu-decode  where CUDA is present: torchlab with --decode gpu (the workers read the files; the GPU
                     decodes, crops, resizes and normalises each batch: its device step)

and two ceilings: decode-only (every file decoded at full size, no augmentation, one process per usable CPU)
and transport (ready-made uint8 samples through train.py's DataLoader settings, no device step). The
ready/s column is torchlab's loaders with no device step: the batches ready for the device, the CPU's share,
which is what a GPU host sees (its device step runs on the GPU). Each
pipeline then feeds a simulated consumer that takes batch_size / (1.5 x classic's images/s) seconds per
batch, and its data-wait fraction is the share of that pass spent waiting for batches. A per-stage timing
on one core tells which stage limits each pipeline; tools/bench_gil.py then measures what would limit the threads on
a machine with many CPUs, the GIL (the loader's own ceiling, the decode path's GIL-held time per sample), and
predicts images/s at 8 to 64 CPUs for threads beside processes. Results: a table on stdout, OUT_DIR/bench.json and
OUT_DIR/bench.png.

images/s is over whole passes (from asking for the first batch to the last), as --loader-only counts them.
data_wait_frac leaves out the wait for each pass's first batch (the pipeline filling up, paid once per epoch:
one batch in 20,000 on ImageNet, one in 31 here); data_wait_frac_with_fill and fill_s report it.
"""

import dataclasses
import gc
import multiprocessing
import os
import platform
import statistics
import sys
import time
import warnings
from io import BytesIO

import numpy as np
import PIL
import torch
import torchvision
from PIL import Image
from torchvision import transforms

from torchlab import config, io, machine, parsing, resolve
from torchlab.data import decode, folder, prepared, splits
from torchlab.pipeline import build, loader, plan, public, sampler, threads
from torchlab.tools import bench_data, bench_gil

DEFAULT_CACHE_DIR = "~/.cache/torchlab/bench"
CONSUMER_SPEEDUP = 1.5  # the simulated consumer runs at 1.5 x classic's images/s
CONSUMER_PASSES = 2
STAGE_SAMPLES = 128  # images timed one by one for the per-stage table
MEMORY_INDEX_SAMPLES = 1_000_000
# Stages done in the main process, one batch at a time; the others run in every worker at once.
MAIN_PROCESS_STAGES = ("transfer", "device step")
# The same loader with no device step: batches ready for the device, the CPU's share (on a GPU host the
# device step leaves the CPU, so this is the figure that matters there).
READY_SUFFIX = ":ready"
GPU_DECODE = "torchlab-gpu-decode"  # a row only where CUDA is present
THREADS, THREADS_PREPARED = "torchlab-threads", "torchlab-threads-prepared"  # --loader threads
OWN_CREATE_LOADER, OWN_DATALOADER = "own-create_loader", "own-DataLoader"  # a user's own Dataset
NAME_WIDTH = len("torchlab-threads-prepared")  # the report's column of row names fits the longest


def naive_transform(image_size):
    """The torchvision training transforms of the classic recipe."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(loader.IMAGENET_MEAN, loader.IMAGENET_STD),
        ]
    )


class Pipeline:
    """A loader (data_loader), what turns its batches into (images, labels) on the device, and its --loader
    (threads, or processes: any DataLoader) with its workers."""

    def __init__(self, name, data_loader, to_device, workers, loader="processes"):
        self.name = name
        self.data_loader = data_loader
        self.to_device = to_device
        self.workers = workers
        self.loader = loader

    def set_epoch(self, epoch):
        if isinstance(self.data_loader.sampler, sampler.EpochSampler):
            self.data_loader.sampler.set_epoch(epoch)


def torchvision_pipeline(name, train_root, batch_size, device, workers):
    """naive (workers=0) or classic: ImageFolder + torchvision transforms, float batches."""
    # allow_empty: a class folder with no images (.ipynb_checkpoints, which torchvision counts as a class) is no error
    dataset = torchvision.datasets.ImageFolder(train_root, transform=naive_transform(224), allow_empty=True)
    worker_options = {}
    if workers > 0:
        worker_options = {"pin_memory": True, "prefetch_factor": 2, "persistent_workers": True}
    data_loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True, **worker_options
    )

    return Pipeline(name, data_loader, CopyToDevice(device), workers)


class CopyToDevice:
    """naive's and classic's device step: their batches are normalised float already, and only copied."""

    def __init__(self, device):
        self.device = device

    def __call__(self, images, labels):
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def batches(self, loader_batches):
        """As loader.BatchToDevice.batches, for (images, labels) batches (ImageFolder has no unreadable ones)."""
        for images, labels in loader_batches:
            yield (*self(images, labels), [])


class OwnPhotos(torch.utils.data.Dataset):
    """A user's own Dataset of the usual kind: paths in __init__, Image.open and a fixed-size resize in
    __getitem__, (uint8 HWC array, label) out."""

    def __init__(self, paths, labels, image_size):
        self.paths, self.labels, self.image_size = paths, labels, image_size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as image:
            return np.asarray(image.convert("RGB").resize((self.image_size, self.image_size))), int(self.labels[i])


class OwnBatchToDevice(loader.BatchToDevice):
    """train.py's device step (uint8 to normalised float) for (images, labels[, ...]) batches of a user's loader."""

    def batches(self, loader_batches):
        for images, labels, *_ in loader_batches:
            yield (*self(images, labels), [])


def own_dataset_pipelines(data_root, batch_size, device, workers):
    """A user's own Dataset through create_loader (the plan it prints, silenced) and through a DataLoader with
    classic's settings (`workers`, pin_memory, prefetch_factor=2, persistent workers)."""
    _, train_index, _ = splits.load_splits(data_root, 0.0, 0)
    paths = [train_index.path(position) for position in range(len(train_index))]
    dataset = OwnPhotos(paths, train_index.labels, config.DEFAULTS.image_size)
    tuned = public.create_loader(dataset, batch_size, device=device.type, print_plan=None)
    seed_settings = {"pin_memory": True, "prefetch_factor": 2, "persistent_workers": True}
    by_hand = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True, **seed_settings
    )
    return {
        OWN_CREATE_LOADER: Pipeline(
            OWN_CREATE_LOADER, tuned, OwnBatchToDevice(device), tuned.plan.workers, tuned.plan.loader
        ),
        OWN_DATALOADER: Pipeline(OWN_DATALOADER, by_hand, OwnBatchToDevice(device), workers),
    }


def torchlab_pipeline(name, data_root, batch_size, device, decoder="cpu", loader="auto", workers="auto"):
    """train.py's training loader with its defaults but for --batch-size, --decode `decoder`, --loader `loader`
    and --workers `workers` (no saved autotune setting read), planned and built by the calls train.py makes."""
    flags = dataclasses.replace(
        config.DEFAULTS, data=data_root, batch_size=batch_size, decode=decoder, loader=loader, workers=workers
    )
    _, train_index, _ = splits.load_splits(data_root, flags.val_fraction, flags.seed)
    used = resolve.loader_plan(flags, str(device), train_index, read_tuned=False)
    train_loader, _, to_device = build.build_input(used, flags.image_size, device, train_index)
    return Pipeline(name, train_loader, to_device, used.workers, used.loader)


def measure_pass(pipeline, epoch, device, consumer_seconds=0.0):
    """One pass: images/s, and the share of it spent waiting for batches when each takes consumer_seconds."""
    pipeline.set_epoch(epoch)
    consume = (lambda timing: time.sleep(consumer_seconds)) if consumer_seconds else None
    timing = loader.timed_pass(pipeline.data_loader, pipeline.to_device, device, consume)
    return {
        "images_per_sec": timing.images_per_sec,
        "data_wait_frac": timing.wait_seconds / (timing.seconds - timing.fill_seconds),
        "data_wait_frac_with_fill": (timing.wait_seconds + timing.fill_seconds) / timing.seconds,
        "fill_s": timing.fill_seconds,
    }


def decode_file(path):
    """Full-size decode to RGB, no augmentation: the decode-only ceiling's unit of work."""
    with Image.open(path) as image:
        image.load()
        return decode.rgb_image(image).size


def decode_prepared(job):
    data_path, start, end = job
    with open(data_path, "rb") as data_file:
        data_file.seek(start)
        encoded = data_file.read(end - start)
    return decode_file(BytesIO(encoded))


def decode_rate(pool, function, jobs):
    start = time.perf_counter()
    for _ in pool.imap_unordered(function, jobs, chunksize=16):
        pass
    return len(jobs) / (time.perf_counter() - start)


class ReadyMadeSamples(torch.utils.data.Dataset):
    """Samples that cost nothing to make: the same uint8 image every time (the transport ceiling)."""

    def __init__(self, length, image_size):
        self.length = length
        self.image_size = image_size
        self.pixels = np.full((image_size, image_size, loader.IMAGE_CHANNELS), 127, dtype=np.uint8)

    def __len__(self):
        return self.length

    def __getitem__(self, key):
        return self.pixels, 0, key[0]


def transport_pipeline(length, batch_size, device):
    """Worker processes' way through /dev/shm, as the loader plan makes it for train.py's defaults."""
    image_size = config.DEFAULTS.image_size
    asked = dataclasses.replace(config.DEFAULTS.asked_loader(), loader="processes", decode="cpu", batch_size=batch_size)
    data = plan.Data(batch_bytes={"cpu": loader.batch_bytes(batch_size, image_size)})
    used = plan.plan(asked, None, machine.probe(cuda=device.type == "cuda"), data)
    data_loader = loader.build_loader(ReadyMadeSamples(length, image_size), used, device)
    return Pipeline("transport", data_loader, KeepOnHost(), used.workers)


def seconds_per_item(function, items):
    start = time.perf_counter()
    results = [function(item) for item in items]
    return (time.perf_counter() - start) / len(items), results


def device_step_seconds(to_device, batch, labels, device):
    """Seconds per call of to_device on one batch (the mean of 4 calls), the device's queued work finished."""

    def step(_):
        to_device(batch, labels)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return seconds_per_item(step, [None] * 4)[0]


def stage_timings(pipelines, train_index, prepared_index, batch_size, device, transport_rates):
    """Milliseconds per image of each stage, on one core, and the stage that limits each pipeline.

    A stage in the workers runs `workers` at a time; one in the main process (receiving batches, the device
    step: on a CPU device, normalising to float) one at a time: the stage with the lowest images/s so
    computed is the limit. transfer is 1 / the transport ceiling (uint8 or float32 batches).
    """
    paths = [train_index.path(position) for position in range(min(STAGE_SAMPLES, len(train_index)))]
    transform = naive_transform(224)
    decode_seconds, decoded = seconds_per_item(lambda path: Image.open(path).convert("RGB"), paths)
    augment, tensors = seconds_per_item(transform, decoded)
    batch = [(tensor, 0) for tensor in tensors[:batch_size]]
    collate_float, _ = seconds_per_item(torch.utils.data.default_collate, [batch] * 4)
    torchvision_stages = {
        "decode": decode_seconds,
        "augmentation": augment,
        "collate": collate_float / len(batch),
        "transfer": 1 / transport_rates["float32"],
    }
    result = {}
    for name in ("naive", "classic"):
        result[name] = {"ms_per_image": torchvision_stages, "workers": pipelines[name].workers}
    indexes = {
        "torchlab": train_index,
        "torchlab-prepared": prepared_index,
        GPU_DECODE: train_index,
        THREADS: train_index,
        THREADS_PREPARED: prepared_index,
    }
    for name, index in ((name, index) for name, index in indexes.items() if name in pipelines):
        dataset = pipelines[name].data_loader.dataset
        collate = pipelines[name].data_loader.collate_fn  # the one build_loader chose for this dataset; None: in place
        keys = [(position, 0) for position in range(min(STAGE_SAMPLES, len(index)))]
        worker_stage = "read file + augmentation draw" if name == GPU_DECODE else "decode+augmentation (fused)"
        if collate is None:  # decode threads write each sample into its slot: no collate, no transfer
            buffer = threads.BatchBuffer(len(keys), dataset.batch_fields)
            worker_seconds, _ = seconds_per_item(
                lambda key, dataset=dataset, slots=buffer.slots: dataset.write_sample(key, slots, key[0]), keys
            )
            batch, labels = buffer.fields[0][:batch_size], buffer.fields[1][:batch_size]
            stages = {f"{worker_stage}, written in place": worker_seconds}
        else:
            worker_seconds, samples = seconds_per_item(dataset.__getitem__, keys)
            samples = samples[:batch_size]
            collate_seconds, ((batch, labels, _),) = seconds_per_item(collate, [samples])
            stages = {worker_stage: worker_seconds, "collate": collate_seconds / len(samples)}
            if pipelines[name].loader == "processes":
                stages["transfer"] = 1 / transport_rates["uint8"]
        device_step = device_step_seconds(pipelines[name].to_device, batch, labels, device)
        stages["device step"] = device_step / len(batch)
        result[name] = {"ms_per_image": stages, "workers": pipelines[name].workers}
    for name in (OWN_CREATE_LOADER, OWN_DATALOADER):
        stages = own_dataset_stages(pipelines[name], batch_size, device)
        result[name] = {"ms_per_image": stages, "workers": pipelines[name].workers}
    for timing in result.values():
        timing["limit"] = limiting_stage(timing["ms_per_image"], timing["workers"])
        timing["ms_per_image"] = {stage: 1000 * seconds for stage, seconds in timing["ms_per_image"].items()}
    return result


def own_dataset_stages(pipeline, batch_size, device):
    """Seconds per image of a user's own Dataset's __getitem__ and of the device step."""
    dataset = pipeline.data_loader.dataset
    getitem_seconds, samples = seconds_per_item(dataset.__getitem__, range(min(STAGE_SAMPLES, len(dataset))))
    batch = torch.from_numpy(np.stack([image for image, _ in samples[:batch_size]]))
    labels = torch.tensor([label for _, label in samples[:batch_size]])
    device_step = device_step_seconds(pipeline.to_device, batch, labels, device)
    return {"your __getitem__": getitem_seconds, "device step": device_step / len(batch)}


def limiting_stage(seconds_per_image, workers):
    """The stage with the fewest images/s: one in the workers runs `workers` at a time, one in the main process
    one at a time; with no workers, one process does every stage in turn, and the slowest limits."""
    if workers == 0:
        return max(seconds_per_image, key=seconds_per_image.get)

    def images_per_sec(stage):
        return (1 if stage in MAIN_PROCESS_STAGES else workers) / seconds_per_image[stage]

    return min(seconds_per_image, key=images_per_sec)


def private_dirty_bytes():
    with open("/proc/self/smaps_rollup") as smaps:
        fields = dict(line.split(":", 1) for line in smaps if line.startswith("Private_Dirty"))
    return int(fields["Private_Dirty"].split()[0]) * 1024


def memory_growth_in_a_fork(read):
    """Private memory that a forked child (as a loader worker is) gains by calling read()."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child():
        gc.disable()  # measure the reads, not a collection walking the parent's objects
        before = private_dirty_bytes()
        read()
        sender.send(private_dirty_bytes() - before)

    gc.collect()
    process = context.Process(target=child)
    process.start()
    growth = receiver.recv()
    process.join()
    return growth


def worker_memory_growth(dataset_index, epochs=1):
    """Bytes a forked process (as a loader worker is) gains per epoch reading every sample's index entry."""
    # The sampler's orders are made in the main process, as sampler.EpochSampler's are.
    orders = [np.random.default_rng(epoch).permutation(len(dataset_index)) for epoch in range(epochs)]

    def read_epochs():
        for order in orders:
            for position in order:  # what ImageDataset reads of each sample before decoding it
                dataset_index.source(position)
                int(dataset_index.labels[position])

    return memory_growth_in_a_fork(read_epochs) / epochs


def memory_measurements(prepared_root):
    """Per-epoch growth of a forked reader of a 1-million-sample SampleIndex and PreparedIndex, in MB."""
    count = MEMORY_INDEX_SAMPLES
    paths = [f"/data/train/n{number % 1000:08d}/n{number % 1000:08d}_{number}.JPEG" for number in range(count)]
    labels = np.arange(count) % 1000
    sample_index = folder.SampleIndex(paths, labels)
    del paths
    ends = np.arange(1, count + 1, dtype=np.int64)
    prepared_index = prepared.PreparedIndex(
        os.path.join(prepared_root, prepared.DATA_FILE), ends - 1, ends, labels, sample_index
    )
    return {
        "samples": count,
        "sample_index_mb_per_epoch": worker_memory_growth(sample_index) / plan.MB,
        "prepared_index_mb_per_epoch": worker_memory_growth(prepared_index) / plan.MB,
    }


def process_tree_memory():
    """(RSS, PSS) bytes of this process and its child processes (a DataLoader's workers), from /proc."""
    pids = [os.getpid()]
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                pids += [int(pid) for pid in children.read().split()]
        except OSError:
            continue
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as smaps:
                fields = dict(line.split(":", 1) for line in smaps if ":" in line and not line[0].isdigit())
        except OSError:
            continue
        rss += int(fields["Rss"].split()[0]) * 1024
        pss += int(fields["Pss"].split()[0]) * 1024
    return rss, pss


def loader_memory(data_root, batch_size, loader):
    """Resident memory (RSS and PSS, MB) of a fresh training process running train.py's loader with --loader
    `loader`, its worker processes counted in, after a few batches. A process of its own, so that no other
    pipeline's workers or buffers are counted."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=measure_loader_memory, args=(data_root, batch_size, loader, sender))
    process.start()
    sender.close()
    try:
        return receiver.recv()
    except EOFError:
        raise RuntimeError(f"the {loader} loader's memory measurement exited with {process.exitcode}") from None
    finally:
        process.join()


def measure_loader_memory(data_root, batch_size, loader, sender):
    torch.set_num_threads(1)  # as in the bench's own process
    pipeline = torchlab_pipeline(loader, data_root, batch_size, torch.device("cpu"), loader=loader)
    batches = iter(pipeline.data_loader)
    for _ in zip(range(3), batches, strict=False):
        pass
    rss, pss = process_tree_memory()
    sender.send({"loader": loader, "workers": pipeline.workers, "rss_mb": rss / plan.MB, "pss_mb": pss / plan.MB})
    # What the workers print as they stop ("terminate called without an active exception") is not the bench's.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())


def warm_page_cache(paths):
    for path in paths:
        with open(path, "rb") as data_file:
            while data_file.read(1 << 20):
                pass


def data_statistics(train_index):
    sizes = []
    for position in range(len(train_index)):
        with Image.open(train_index.path(position)) as image:
            sizes.append(image.size)
    sizes = np.array(sizes)
    file_bytes = [os.path.getsize(train_index.path(position)) for position in range(len(train_index))]
    return {
        "images": len(train_index),
        "mean_width": float(sizes[:, 0].mean()),
        "mean_height": float(sizes[:, 1].mean()),
        "large_share": float((sizes.max(axis=1) >= bench_data.LARGE_LONG_SIDE[0]).mean()),
        "mean_file_kb": float(np.mean(file_bytes) / 1000),
    }


def ratio_table(results):
    names = list(results)
    lines = [f"{'images/s ratio':<{NAME_WIDTH}}" + "".join(f"{name:>{NAME_WIDTH + 1}}" for name in names)]
    for name in names:
        rate = results[name]["images_per_sec"]
        ratios = (rate / results[other]["images_per_sec"] for other in names)
        lines.append(f"{name:<{NAME_WIDTH}}" + "".join(f"{ratio:>{NAME_WIDTH}.2f}x" for ratio in ratios))
    return lines


def report_lines(report):
    pipelines, ceilings = report["pipelines"], report["ceilings"]
    files = report["data"]
    lines = [
        f"{files['images']} images, mean {files['mean_width']:.0f}x{files['mean_height']:.0f} px, "
        f"{files['mean_file_kb']:.1f} KB, {files['large_share']:.1%} large; "
        f"{report['machine']['usable_cpus']} usable CPUs; device {report['settings']['device']}; "
        f"median of {report['settings']['repetitions']} passes",
        "",
        f"{'pipeline':<{NAME_WIDTH}} {'workers':>7} {'images/s':>9} {'min':>8} {'max':>8} {'vs naive':>8} "
        f"{'vs classic':>10} {'data wait':>9} {'w/ fill':>8} {'ready/s':>8}  limit (per-stage timing)",
    ]
    for name, result in pipelines.items():
        lines.append(
            f"{name:<{NAME_WIDTH}} {result['workers']:>7} {result['images_per_sec']:>9.1f} {min(result['runs']):>8.1f} "
            f"{max(result['runs']):>8.1f} {result['vs_naive']:>7.2f}x {result['vs_classic']:>9.2f}x "
            f"{result['data_wait_frac']:>9.1%} {result['data_wait_frac_with_fill']:>8.1%} "
            f"{format(result['ready_images_per_sec'], '8.1f') if result['ready_images_per_sec'] else '-':>8}  "
            f"{result['limit']}"
        )
    lines += [""] + [f"ceiling {name:<24} {rate:>9.1f} images/s" for name, rate in ceilings.items()]
    lines += [
        f"torchlab / decode-only ceiling: {pipelines['torchlab']['images_per_sec'] / ceilings['decode_only']:.1%}",
        *(
            f"{THREADS} / decode-only ceiling: {pipelines[THREADS]['images_per_sec'] / ceilings['decode_only']:.1%}"
            for _ in [None]
            if THREADS in pipelines
        ),
        f"simulated consumer: {report['consumer']['seconds_per_batch'] * 1000:.1f} ms per batch "
        f"({report['consumer']['images_per_sec']:.1f} images/s)",
        "",
        *ratio_table(pipelines),
        "",
        "per-stage ms/image on one core (limit: the stage with the fewest images/s given its parallelism)",
    ]
    for name, timing in report["stages"].items():
        stages = ", ".join(f"{stage} {ms:.2f}" for stage, ms in timing["ms_per_image"].items())
        lines.append(f"  {name:<{NAME_WIDTH}} {stages}  -> {timing['limit']}")
    lines += [
        f"resident memory of a training process with the loader running, {name} ({memory['workers']} "
        f"{memory['loader']}): RSS {memory['rss_mb']:.0f} MB, PSS {memory['pss_mb']:.0f} MB (with its workers)"
        for name, memory in report.get("loader_memory", {}).items()
    ]
    memory = report["worker_memory"]
    lines.append(
        f"worker memory per epoch, {memory['samples']:,}-sample index: SampleIndex "
        f"{memory['sample_index_mb_per_epoch']:.1f} MB, PreparedIndex {memory['prepared_index_mb_per_epoch']:.1f} MB"
    )
    return lines + bench_gil.report_lines(report["gil"])


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["pipelines"]) + [f"ceiling: {name}" for name in report["ceilings"]]
    rates = [result["images_per_sec"] for result in report["pipelines"].values()] + list(report["ceilings"].values())
    colours = ["tab:blue"] * len(report["pipelines"]) + ["tab:grey"] * len(report["ceilings"])
    figure, axes = plt.subplots(figsize=(8, 4))
    bars = axes.barh(names[::-1], rates[::-1], color=colours[::-1])
    axes.bar_label(bars, fmt="%.0f")
    axes.set_xlabel("images/s (median)")
    axes.set_title(f"input pipelines, {report['machine']['usable_cpus']} CPUs, {report['data']['images']} images")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


class KeepOnHost:
    """No device step, for the transport ceilings and the ready/s rows: the loader's batches as they come."""

    def __call__(self, images, labels):
        return images, labels

    def batches(self, loader_batches):
        """As loader.BatchToDevice.batches: (images, labels, unreadable positions) of each batch, on the host."""
        for images, labels, *unreadable in loader_batches:
            yield images, labels, unreadable[0].tolist() if unreadable else []


def make_pipelines(data_root, prepared_root, batch_size, device, cpus, gpu_decode=None):
    """The four pipelines compared, the torchlab-gpu-decode row when gpu_decode is set (None: where `device` is
    CUDA), and the transport ceilings (uint8 and float32 batches, and the ready/s rows)."""
    train_root = folder.train_folder(data_root)
    pipelines = {
        "naive": torchvision_pipeline("naive", train_root, batch_size, device, workers=0),
        "classic": torchvision_pipeline("classic", train_root, batch_size, device, workers=plan.auto_workers(cpus)),
        "torchlab": torchlab_pipeline("torchlab", data_root, batch_size, device, loader="processes"),
        "torchlab-prepared": torchlab_pipeline(
            "torchlab-prepared", prepared_root, batch_size, device, loader="processes"
        ),
        THREADS: torchlab_pipeline(THREADS, data_root, batch_size, device, loader="threads"),
        THREADS_PREPARED: torchlab_pipeline(THREADS_PREPARED, prepared_root, batch_size, device, loader="threads"),
        **own_dataset_pipelines(data_root, batch_size, device, workers=plan.auto_workers(cpus)),
    }
    if device.type == "cuda" if gpu_decode is None else gpu_decode:  # --decode gpu: the workers read, the GPU decodes
        pipelines[GPU_DECODE] = torchlab_pipeline(GPU_DECODE, data_root, batch_size, device, decoder="gpu")
    length = len(pipelines["torchlab"].data_loader.dataset)
    transport = transport_pipeline(length, batch_size, device)
    float_transport = Pipeline(
        "transport-float",
        torch.utils.data.DataLoader(
            [(torch.zeros(3, 224, 224), 0)] * length,
            batch_size=batch_size,
            num_workers=transport.workers,
            persistent_workers=transport.workers > 0,
        ),
        KeepOnHost(),
        transport.workers,
    )
    ready = {
        f"{name}{READY_SUFFIX}": Pipeline(
            f"{name}{READY_SUFFIX}",
            pipelines[name].data_loader,
            KeepOnHost(),
            transport.workers,
            pipelines[name].loader,
        )
        for name in ("torchlab", "torchlab-prepared", THREADS, THREADS_PREPARED, GPU_DECODE)
        if name in pipelines
    }
    return pipelines, {"transport": transport, "transport-float": float_transport, **ready}


def measure_rates(pipelines, transports, decode_jobs, repetitions, device, cpus, print_line):
    """images/s of every pipeline, transport and decode-only ceiling, interleaved over the passes (the first
    a warm-up): {name: [images/s of each timed pass]}."""
    runs = {name: [] for name in [*pipelines, *transports, *decode_jobs]}
    with multiprocessing.get_context("fork").Pool(cpus) as pool:
        for repetition in range(repetitions + 1):
            print_line(f"pass {repetition}{' (warm-up)' if repetition == 0 else ''} ...")
            rates = {
                name: measure_pass(pipeline, repetition, device)["images_per_sec"]
                for name, pipeline in {**pipelines, **transports}.items()
            }
            for name, (function, jobs) in decode_jobs.items():
                rates[name] = decode_rate(pool, function, jobs)
            if repetition > 0:
                for name, rate in rates.items():
                    runs[name].append(rate)
    return runs


def pipeline_rows(pipelines, runs, medians, waits, stages):
    """The report's row of each pipeline: images/s, ratios, data wait under the simulated consumer, limit."""
    rows = {}
    for name, pipeline in pipelines.items():
        rows[name] = {
            "images_per_sec": medians[name],
            "runs": runs[name],
            "vs_naive": medians[name] / medians["naive"],
            "vs_classic": medians[name] / medians["classic"],
            "workers": pipeline.workers,
            "loader": pipeline.loader,
            "ready_images_per_sec": medians.get(f"{name}{READY_SUFFIX}"),
            **{key: statistics.median(wait[key] for wait in waits[name]) for key in waits[name][0] if "wait" in key},
            "fill_s": statistics.median(wait["fill_s"] for wait in waits[name]),
            "limit": stages[name]["limit"],
        }
    return rows


def decode_only_jobs(train_index, prepared_index):
    """The decode-only ceilings' work: {name: (function, its jobs)} for the files and for the prepared copy."""
    prepared_jobs = [
        (prepared_index.data_path, int(start), int(end))
        for start, end in zip(prepared_index.starts, prepared_index.ends, strict=True)
    ]
    return {
        "decode_only": (decode_file, [train_index.path(position) for position in range(len(train_index))]),
        "decode_only_prepared": (decode_prepared, prepared_jobs),
    }


def run_bench(data_root, prepared_root, out_dir, batch_size, repetitions, device, print_line=print, gpu_decode=None):
    """Measure everything on the files at data_root and prepared_root; write out_dir/bench.{json,png}. gpu_decode:
    as make_pipelines (on a CPU device, DeviceDecoder decodes with torchvision's CPU decoder: a dry run)."""
    _, train_index, _ = splits.load_splits(data_root, 0.0, 0)
    if len(train_index) < batch_size:  # every pipeline drops a last, partial batch: it would time nothing
        raise folder.DataError(
            f"{data_root}: {len(train_index)} training images, fewer than one batch (--batch-size {batch_size})"
        )
    _, prepared_train_index, _ = splits.load_splits(prepared_root, 0.0, 0)
    warm_page_cache([*(train_index.path(p) for p in range(len(train_index))), prepared_train_index.data_path])
    cpus = machine.usable_cpu_count()
    pipelines, transports = make_pipelines(data_root, prepared_root, batch_size, device, cpus, gpu_decode)
    decode_jobs = decode_only_jobs(train_index, prepared_train_index)
    runs = measure_rates(pipelines, transports, decode_jobs, repetitions, device, cpus, print_line)
    medians = {name: statistics.median(rates) for name, rates in runs.items()}

    consumer_seconds = batch_size / (CONSUMER_SPEEDUP * medians["classic"])
    print_line(f"simulated consumer: {consumer_seconds * 1000:.1f} ms per batch ...")
    waits = {name: [] for name in pipelines}
    for consumer_pass in range(CONSUMER_PASSES):
        for name, pipeline in pipelines.items():
            waits[name].append(measure_pass(pipeline, repetitions + 1 + consumer_pass, device, consumer_seconds))

    print_line("per-stage timing, worker memory and the GIL ...")
    transport_rates = {"uint8": medians["transport"], "float32": medians["transport-float"]}
    stages = stage_timings(pipelines, train_index, prepared_train_index, batch_size, device, transport_rates)
    report = {
        "settings": {"batch_size": batch_size, "repetitions": repetitions, "device": str(device)},
        "machine": {
            "usable_cpus": cpus,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "pillow": PIL.__version__,
        },
        "data": {**data_statistics(train_index), "root": data_root, "prepared_root": prepared_root},
        "pipelines": pipeline_rows(pipelines, runs, medians, waits, stages),
        "ceilings": {
            "decode_only": medians["decode_only"],
            "decode_only_prepared": medians["decode_only_prepared"],
            "transport": medians["transport"],
            "transport_float32": medians["transport-float"],
        },
        "consumer": {"seconds_per_batch": consumer_seconds, "images_per_sec": batch_size / consumer_seconds},
        "stages": stages,
        "worker_memory": memory_measurements(prepared_root),
        "loader_memory": {
            name: loader_memory(data_root, batch_size, pipelines[name].loader) for name in ("torchlab", THREADS)
        },
        # train.py's ImageDataset, as the threads read it
        "gil": bench_gil.measure(pipelines[THREADS].data_loader.dataset),
    }
    png_path = os.path.join(out_dir, "bench.png")
    os.makedirs(out_dir, exist_ok=True)
    plot(report, png_path)
    io.write_report(out_dir, "bench.json", report, report_lines(report), print_line, beside=[png_path])
    return report


def build_parser(prog):
    parser = parsing.OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--images", type=bench_data.image_count, default=2000, help="generated training images (default: 2000)"
    )
    parser.add_argument(
        "--cache-dir",
        default=DEFAULT_CACHE_DIR,
        help=f"where the generated images and their prepared copy are kept between runs (default: {DEFAULT_CACHE_DIR})",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="benchmark these images instead (laid out as train.py's --data); its prepared copy goes to --cache-dir "
        "(default: generated)",
    )
    parser.add_argument(
        "--out-dir", default="bench-results", help="where bench.json and bench.png go (default: bench-results)"
    )
    parser.add_argument(
        "--repetitions", type=parsing.positive_int, default=3, help="timed passes of each pipeline (default: 3)"
    )
    parser.add_argument("--batch-size", type=parsing.positive_int, default=64, help="images per batch (default: 64)")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA if present (default: auto)"
    )
    return parser


def main(argv=None, prog="torchlab bench"):
    args = build_parser(prog).parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        io.exit_with_error(prog, f"--device cuda: {resolve.NO_CUDA_DEVICE}")
    cache_dir = io.writable_folder(prog, os.path.expanduser(args.cache_dir), f"--cache-dir {args.cache_dir}")
    io.writable_folder(prog, args.out_dir, f"--out-dir {args.out_dir}")
    data_root = args.data or os.path.join(cache_dir, f"images-{args.images}-seed0")
    if args.data is None:
        print(f"generating {args.images} images in {data_root} (once) ...", flush=True)
        bench_data.write_bench_data(data_root, args.images)
    prepared_root = os.path.join(cache_dir, f"{os.path.basename(os.path.abspath(data_root))}.prepared")
    print(f"preparing {prepared_root} (once) ...", flush=True)
    try:
        prepared.prepare(data_root, prepared_root, processes=machine.usable_cpu_count())
    except folder.DataError as error:
        io.exit_with_error(prog, error)
    # One torch thread in this process: with more, torchvision's per-image Normalize (naive) waits on its
    # threads at every call, ~10x slower on 2 busy cores; train.py's workers run one thread each as well.
    torch.set_num_threads(1)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # classic's pin_memory without a GPU
    try:
        run_bench(
            data_root,
            prepared_root,
            args.out_dir,
            args.batch_size,
            args.repetitions,
            torch.device("cuda" if use_cuda else "cpu"),
            print_line=lambda line: print(line, flush=True),
        )
    except (folder.DataError, plan.PlanError) as error:  # a /dev/shm too small for the worker processes' rows
        io.exit_with_error(prog, error)
    except decode.UNREADABLE_IMAGE_ERRORS as error:  # torchvision's ImageFolder raises them, in a worker or not
        cause = str(error).strip().splitlines()[-1]
        io.exit_with_error(
            prog,
            f"--data {data_root}: the reference loaders (naive, classic, decode-only) stop "
            f"at an unreadable image ({cause}); bench a folder without such files (train.py "
            "skips them and lists them in bad_images.txt)",
        )


if __name__ == "__main__":
    main()
