"""What the loaders and --decode gpu give on this GPU: `torchlab gpu-check` (or `make gpu-check`), about 10 minutes.

On ImageNet-sized JPEGs generated here (tools/bench_data.py) and their prepared copy it reports:
  decode     images/s of train.py's loader with --decode cpu and --decode gpu, batches normalised on the
             GPU but no model (raw files and the prepared copy)
  scaling    the same on the raw files against the decode threads or worker processes (1, 2, 4, 8 and all
             usable CPUs), for --loader threads and processes, with each decoder; beside it, what the GIL model
             (pipeline/gil.py) predicts for --decode cpu from the one-thread rate on this host's CPUs
  model-only the ceiling: train.py's training step (ResNet-50, AMP, channels_last) fed one constant batch
             already on the GPU, with --compile off and on
  training   train.py itself (--max-steps) with each --loader and decoder, and the default with --compile:
             images/s and the data-wait fraction, and images/s as a share of the model-only ceiling
  agreement  PSNR of the GPU path's crops against the CPU path's, same samples, same boxes and flips
  streams    whether decoding overwrites memory the training stream still reads (pytorch/vision#9606), with
             a bare decode_jpeg call (the race, for comparison) and with DeviceDecoder
A table on stdout and OUT_DIR/gpu_check.json. --device cpu is a dry run of the same steps on the CPU (the
"gpu" decoder then runs torchvision's CPU decoder): it checks the script, not a GPU.
"""

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torchvision
from torchvision.io import decode_jpeg

from torchlab import config, distributed, io, machine, model, parsing, resolve, train
from torchlab.data import decode, prepared, splits
from torchlab.pipeline import device_decode, gil, loader, plan
from torchlab.tools import bench, bench_data, doctor

DECODERS = ("cpu", "gpu")
MODEL_ONLY_WARMUP_STEPS = 10  # --compile compiles in the first steps
STREAM_CHECK_ROUNDS = 20
FREED_BLOCKS, FREED_BLOCK_FLOATS = 32, 1 << 19  # 2 MB each: decoded images are carved out of such blocks
DEFAULT_CACHE_DIR = "~/.cache/torchlab/gpu-check"


def decode_rates(roots, batch_size, device, passes, print_line):
    """images/s of the training loader with each decoder on each data root, the last of `passes` passes."""
    rates = {}
    for source, root in roots.items():
        for decoder in DECODERS:
            pipeline = bench.torchlab_pipeline(f"{source}-{decoder}", root, batch_size, device, decoder)
            for epoch in range(passes):
                pipeline.set_epoch(epoch)
                timing = loader.timed_pass(pipeline.data_loader, pipeline.to_device, device)
            rates[f"{source} --decode {decoder}"] = timing.images_per_sec
            print_line(f"decode: {source} --decode {decoder}: {timing.images_per_sec:.0f} images/s")
    return rates


def parallel_counts(cpus):
    """1, 2, 4, 8 and every usable CPU, those at most `cpus`."""
    return sorted({count for count in (1, 2, 4, 8) if count <= cpus} | {cpus})


def predicted_scaling(scaling):
    """gil.py's prediction for the counts of `scaling` (scaling_rates' answer): {count: {"threads", "processes"}}
    images/s, a sample costing this host's one-thread seconds (1 / threads --decode cpu at 1) with the GIL-held
    share and loader time make bench measured. Set beside the measured rates, it checks the model."""
    measured = scaling["threads --decode cpu"]
    seconds = 1 / measured[1]
    predicted = {}
    for count in measured:
        threads, processes = gil.predicted_rates(count, seconds, gil.DECODE_GIL_SHARE * seconds)
        predicted[count] = {"threads": threads, "processes": processes}
    return predicted


def scaling_rates(data_root, batch_size, device, decoders, print_line):
    """images/s of train.py's loader on the raw files for each --loader, decoder and thread or worker count (the
    second of two passes): {"threads --decode cpu": {count: images/s}}."""
    rates = {}
    for loader_choice in plan.LOADERS:
        for decoder in decoders:
            name = f"{loader_choice} --decode {decoder}"
            rates[name] = {}
            for count in parallel_counts(machine.usable_cpu_count()):
                pipeline = bench.torchlab_pipeline(name, data_root, batch_size, device, decoder, loader_choice, count)
                for epoch in range(2):
                    pipeline.set_epoch(epoch)
                    timing = loader.timed_pass(pipeline.data_loader, pipeline.to_device, device)
                rates[name][count] = timing.images_per_sec
                print_line(
                    f"scaling: {name}, {count} {plan.UNITS[loader_choice]}: {timing.images_per_sec:.0f} images/s"
                )
    return rates


def model_only_rates(args, compile_settings, print_line):
    """images/s of train.py's training step (train.build_training and train.train_step, the flags resolved as
    train.py resolves them) on one constant batch on the device: the ceiling no loader can lift."""
    rates = {}
    processes = distributed.processes_from_environment()
    for compiled in compile_settings:
        with tempfile.TemporaryDirectory() as run_dir:
            folders = ["--data", run_dir, "--run-dir", run_dir, "--resume", "none"]
            run = ["--arch", args.arch, "--batch-size", str(args.batch_size), "--device", args.device]
            flags = config.parse_args([*folders, *run, *(["--compile"] if compiled else [])])
            setup = resolve.resolve(flags, processes)
        cfg, device = flags, torch.device(setup.device)
        network = model.build_model(cfg.arch, 1000)
        to_device = loader.BatchToDevice(device)
        training = train.build_training(cfg, setup, network, args.steps, to_device, processes)
        host_images = torch.randint(0, 256, (cfg.batch_size, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8)
        images, labels = training.to_device(host_images, torch.randint(0, 1000, (cfg.batch_size,)))
        for step in range(MODEL_ONLY_WARMUP_STEPS + args.steps):
            if step == MODEL_ONLY_WARMUP_STEPS:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            train.train_step(training, images, labels, [])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        name = f"--compile {'on' if compiled else 'off'}"
        rates[name] = cfg.batch_size * args.steps / (time.perf_counter() - start)
        print_line(f"model-only: {cfg.arch} {name}: {rates[name]:.0f} images/s")
    return rates


def training_runs(device_type):
    """(--loader, --decode, --compile) of each train.py run: every loader with each decoder, and the default
    with --compile. On the CPU (a dry run) --decode cpu alone (train.py refuses gpu) and no --compile."""
    if device_type != "cuda":
        return [(loader_choice, "cpu", False) for loader_choice in plan.LOADERS]
    runs = [(loader_choice, decoder, False) for loader_choice in plan.LOADERS for decoder in DECODERS]
    return runs + [(plan.DEFAULT_LOADER, "cpu", True)]


def training_rates(data_root, args, print_line):
    """train.py's images/s and data-wait fraction for each of training_runs (medians of the interval records
    after the first), from its own metrics.jsonl."""
    results = {}
    for loader_choice, decoder, compiled in training_runs(args.device):
        name = f"{loader_choice} --decode {decoder}{' --compile' if compiled else ''}"
        with tempfile.TemporaryDirectory() as run_dir:
            flags = {
                "--data": data_root,
                "--run-dir": run_dir,
                "--arch": args.arch,
                "--batch-size": args.batch_size,
                "--max-steps": args.steps,
                "--log-interval": max(1, args.steps // 5),
                "--epochs": 1000,
                "--device": args.device,
                "--loader": loader_choice,
                "--decode": decoder,
                "--resume": "none",
            }
            train_flags = [str(part) for flag in flags.items() for part in flag] + (["--compile"] if compiled else [])
            command = [sys.executable, "-m", "torchlab", "train", *train_flags]
            finished = subprocess.run(command, capture_output=True, text=True, check=False)
            if finished.returncode != 0:
                raise RuntimeError(f"train.py {name} failed: {finished.stderr.strip()[-500:]}")
            with open(os.path.join(run_dir, "metrics.jsonl")) as metrics_file:
                records = [json.loads(line) for line in metrics_file]
        intervals = [record for record in records if record.get("kind") == "interval"][1:]
        results[name] = {
            "images_per_sec": statistics.median(record["images_per_sec"] for record in intervals),
            "data_wait_frac": statistics.median(record["data_wait_frac"] for record in intervals),
            "compile": compiled,
        }
        print_line(
            f"training: {args.arch} {name}: {results[name]['images_per_sec']:.0f} images/s, "
            f"data wait {results[name]['data_wait_frac']:.1%}"
        )
    return results


def share_of_ceiling(training, model_only):
    """Each training run's images/s over the model-only ceiling with the same --compile setting."""
    return {
        name: result["images_per_sec"] / model_only[f"--compile {'on' if result['compile'] else 'off'}"]
        for name, result in training.items()
    }


def psnr(image, reference):
    """Peak signal-to-noise ratio of `image` against `reference` (uint8 arrays), in dB; inf when identical."""
    error = np.mean((np.asarray(image, dtype=np.float64) - np.asarray(reference, dtype=np.float64)) ** 2)
    return math.inf if error == 0 else 10 * math.log10(255**2 / error)


def crop_agreement(data_root, samples, image_size, device):
    """PSNR of each sample's GPU-path crop against its CPU-path crop (train.py's defaults: JPEG draft on), for
    the same (seed, epoch, position): min and median over `samples` samples."""
    _, train_index, _ = splits.load_splits(data_root, 0.0, 0)
    positions = range(min(samples, len(train_index)))
    cpu_dataset = decode.ImageDataset(train_index, image_size, train=True, seed=0)
    gpu_dataset = device_decode.EncodedImageDataset(train_index, image_size, train=True, seed=0)
    cpu_images, labels, _ = loader.collate_uint8([cpu_dataset[(position, 1)] for position in positions])
    batch, _, _ = gpu_dataset.collate([gpu_dataset[(position, 1)] for position in positions])
    to_device = device_decode.DeviceDecoder(device, image_size)
    normalised, _ = to_device(batch, labels)
    gpu_levels = (normalised * to_device.std + to_device.mean).clamp(0, 255).cpu()  # back to 0-255 levels
    cpu_levels = cpu_images.permute(0, 3, 1, 2)
    values = [psnr(gpu, cpu) for gpu, cpu in zip(gpu_levels, cpu_levels, strict=True)]
    return {"samples": len(values), "min_db": min(values), "median_db": statistics.median(values)}


def stream_check(data_root, batch_size, device, rounds=STREAM_CHECK_ROUNDS):
    """Rounds (of `rounds`) whose training-stream sums came out wrong, per decoder. Each round queues a long
    product on the current stream, then the sums of filled blocks that are freed at once, and decodes a batch
    while the sums still wait: a decoder that is handed a freed block and writes it early changes a sum."""
    pipeline = bench.torchlab_pipeline("stream-check", data_root, batch_size, device, "gpu")
    batches = []
    for batch, labels, *_ in pipeline.data_loader:
        batches.append((batch, labels))
        if len(batches) == 4:
            break
    decoders = {
        "decode_jpeg alone": lambda batch, labels: decode_jpeg(batch.files(), device=device),
        "DeviceDecoder": device_decode.DeviceDecoder(device, config.DEFAULTS.image_size),
    }
    slow = torch.randn(8192, 8192, device=device)
    expected = [value * FREED_BLOCK_FLOATS for value in range(FREED_BLOCKS)]
    wrong = {}
    for name, decode_batch in decoders.items():
        wrong[name] = 0
        for round_number in range(rounds):
            blocks = [torch.full((FREED_BLOCK_FLOATS,), float(value), device=device) for value in range(FREED_BLOCKS)]
            torch.cuda.synchronize(device)
            for _ in range(4):
                slow @ slow
            sums = [block.sum() for block in blocks]
            del blocks
            decode_batch(*batches[round_number % len(batches)])
            wrong[name] += torch.stack(sums).tolist() != expected
    return {"rounds": rounds, "wrong": wrong}


def print_line(line):
    print(line, flush=True)


def report_lines(report):
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items())
    lines = [
        f"gpu-check on {report['device_name']} ({report['usable_cpus']} usable CPUs), {report['images']} images; "
        f"{versions}; CPU path decodes with {report['cpu_decoder']}",
        f"  flavour ({report['flavour']['status']}): {report['flavour']['detail']}",
    ]
    if report["flavour"]["fix"]:
        lines.append(f"    fix: {report['flavour']['fix']}")
    lines += [f"  {name:<28} {rate:>9.0f} images/s" for name, rate in report["decode"].items()]
    for name, rates in report["scaling"].items():
        counts = ", ".join(f"{count}: {rate:.0f}" for count, rate in rates.items())
        lines.append(f"  scaling, {name} (count: images/s): {counts}")
    predicted = ", ".join(
        f"{count}: {rates['threads']:.0f} / {rates['processes']:.0f}" for count, rates in report["predicted"].items()
    )
    lines.append(f"  scaling predicted by pipeline/gil.py, --decode cpu (count: threads / processes): {predicted}")
    for name, rate in report["model_only"].items():
        lines.append(f"  model-only ceiling, {report['arch']} AMP {name}: {rate:.0f} images/s")
    for name, result in report["training"].items():
        lines.append(
            f"  {report['arch']} AMP {name:<34} {result['images_per_sec']:>7.0f} images/s, data wait "
            f"{result['data_wait_frac']:.1%}, {report['share_of_ceiling'][name]:.0%} of the ceiling"
        )
    if not report["streams"]["wrong"]:
        lines.append("  streams: not checked (no CUDA)")
    for name, wrong in report["streams"]["wrong"].items():
        lines.append(
            f"  streams: {name}: {wrong} of {report['streams']['rounds']} rounds changed the training stream's data"
        )
    agreement = report["agreement"]
    lines.append(
        f"  GPU vs CPU crops: PSNR min {agreement['min_db']:.1f} dB, median {agreement['median_db']:.1f} dB "
        f"over {agreement['samples']} samples"
    )
    return lines


def build_parser(prog):
    parser = parsing.OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=bench_data.image_count, default=4000, help="generated images (default: 4000)")
    parser.add_argument(
        "--cache-dir",
        default=DEFAULT_CACHE_DIR,
        help=f"where the images and their prepared copy are kept (default: {DEFAULT_CACHE_DIR})",
    )
    parser.add_argument("--out-dir", default="gpu-check", help="where gpu_check.json goes (default: gpu-check)")
    parser.add_argument("--batch-size", type=parsing.positive_int, default=128, help="(default: 128)")
    parser.add_argument("--arch", default="resnet50", help="the model trained (default: resnet50)")
    parser.add_argument(
        "--steps", type=parsing.positive_int, default=150, help="training steps per decoder (default: 150)"
    )
    parser.add_argument("--samples", type=parsing.positive_int, default=200, help="crops compared (default: 200)")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda; cpu: a dry run of the script (no GPU figures) (default: cuda)",
    )
    return parser


def main(argv=None, prog="torchlab gpu-check"):
    args = build_parser(prog).parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        io.exit_with_error(prog, f"{resolve.NO_CUDA_DEVICE}; --device cpu is a dry run")
    if args.images < args.batch_size:
        io.exit_with_error(prog, f"--images {args.images}: fewer than one batch (--batch-size {args.batch_size})")
    device = torch.device(args.device)
    cache_dir = io.writable_folder(prog, os.path.expanduser(args.cache_dir), f"--cache-dir {args.cache_dir}")
    io.writable_folder(prog, args.out_dir, f"--out-dir {args.out_dir}")
    data_root = os.path.join(cache_dir, f"images-{args.images}")
    print(f"generating {args.images} images in {data_root} and a prepared copy (once) ...", flush=True)
    bench_data.write_bench_data(data_root, args.images)
    prepared.prepare(data_root, data_root + ".prepared", processes=machine.usable_cpu_count())
    decoders = DECODERS  # on the CPU, the "gpu" decoder is torchvision's CPU decoder: the script is tried
    compile_settings = (False, True) if device.type == "cuda" else (False,)  # --compile needs a C++ compiler
    report = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU (dry run)",
        "usable_cpus": machine.usable_cpu_count(),
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__},
        "flavour": dataclasses.asdict(doctor.check_flavour()),
        "cpu_decoder": "region decoder (torchlab_jpeg)" if decode.torchlab_jpeg is not None else "Pillow",
        "images": args.images,
        "arch": args.arch,
        "decode": decode_rates(
            {"raw": data_root, "prepared": data_root + ".prepared"}, args.batch_size, device, 2, print_line
        ),
        "scaling": scaling_rates(data_root, args.batch_size, device, decoders, print_line),
        "model_only": model_only_rates(args, compile_settings, print_line),
        "training": training_rates(data_root, args, print_line),
        "agreement": crop_agreement(data_root, args.samples, config.DEFAULTS.image_size, device),
        "streams": stream_check(data_root, args.batch_size, device) if device.type == "cuda" else {"wrong": {}},
    }
    report["share_of_ceiling"] = share_of_ceiling(report["training"], report["model_only"])
    report["predicted"] = predicted_scaling(report["scaling"])
    io.write_report(args.out_dir, "gpu_check.json", report, report_lines(report), print_line)


if __name__ == "__main__":
    main()
