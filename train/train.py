"""Train a torchvision image classifier on an ImageFolder, resumably: `python train.py --data /data`.

It reads top to bottom: the flags, the data index and the model are checked before anything is written;
then the run directory, the loaders and the optimiser; then the epoch loop, which reports progress,
checkpoints, and stops cleanly on SIGTERM or SIGINT. README.md beside this file tells how to run it over
SSH, on several GPUs or machines (torchrun), and what lands in the run directory.
"""

import functools
import json
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel

import autotune
import checkpoint
import cli
import data
import distributed
import loader
import metrics
import model
import optim

BAD_IMAGE_EXAMPLES = 5  # unreadable files named in the log and in the error when there are too many
BAD_IMAGES_FILE = "bad_images.txt"  # in the run directory: every unreadable file of the run, with the reason


class TooManyBadImages(RuntimeError):
    """More unreadable images in an epoch than --max-bad-images: one line on stderr, exit code 1."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, say); the earlier ones are untouched: exit code 1."""


class StopRequest:
    """SIGTERM and SIGINT set a flag that the loop reads between steps: it then checkpoints and exits 0.

    SIGHUP, sent when the SSH session ends, is ignored: the run outlives the login, with or without nohup.
    Under torchrun SIGHUP stops the run like SIGTERM: the agent forwards it when it is being hung up
    itself, and kills its workers soon after.
    """

    def __init__(self, under_torchrun):
        self.signal_name = None
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGHUP, self.handle if under_torchrun else signal.SIG_IGN)

    def handle(self, signum, frame):
        self.signal_name = signal.Signals(signum).name


def should_stop(stop, global_step, args, processes):
    """A signal reached any process, or --max-steps is reached (a collective under torchrun)."""
    signalled = distributed.any_process(stop.signal_name is not None, processes)
    return signalled or (args.max_steps is not None and global_step >= args.max_steps)


def stop_reason(stop, args):
    return stop.signal_name or f"--max-steps {args.max_steps}"


class BadImages:
    """The unreadable images of a run, as this process met them: the first few are named in the log at the
    end of each epoch that had any, and all of them, with the reason, in RUN_DIR/bad_images.txt."""

    def __init__(self, index, run_dir, enabled):
        self.index, self.enabled = index, enabled
        self.path = os.path.join(run_dir, BAD_IMAGES_FILE)
        self.reasons = {}  # path -> reason, over the whole run (a resumed run reads the file back)
        self.this_epoch = []
        if enabled and os.path.exists(self.path):
            with open(self.path, encoding="utf-8", errors="replace") as lines:
                self.reasons = dict(line.rstrip("\n").split("\t", 1) for line in lines if "\t" in line)

    def add(self, positions):
        for position in positions:
            path = self.index.path(position)
            self.this_epoch.append(path)
            if self.enabled and path not in self.reasons:
                self.reasons[path] = data.unreadable_reason(self.index.source(position))

    def start_epoch(self):
        self.this_epoch = []

    def report(self, epoch, log):
        """Name the first few of this epoch in the log, and write every one of the run to the file."""
        if self.enabled and self.this_epoch:
            text = "".join(f"{path}\t{reason}\n" for path, reason in sorted(self.reasons.items()))
            checkpoint.write_atomically(self.path, lambda file: file.write(text.encode("utf-8", "replace")))
            named = "; ".join(f"{path} ({self.reasons[path]})" for path in self.this_epoch[:BAD_IMAGE_EXAMPLES])
            log.print(f"epoch {epoch}: skipped {len(self.this_epoch)} unreadable images: {named}; all in {self.path}")

    def check(self, count, epoch, args, log):
        """More than --max-bad-images in this epoch (over all processes) stops the run, naming them."""
        if count > args.max_bad_images:
            self.report(epoch, log)
            examples = ", ".join(self.this_epoch[:BAD_IMAGE_EXAMPLES]) or "(on other processes)"
            raise TooManyBadImages(
                f"{count} images of epoch {epoch} could not be decoded, more than --max-bad-images "
                f"{args.max_bad_images}; e.g. {examples}"
            )


def open_run_dir(args, processes, class_names):
    """Rank 0 makes the run directory and writes config.json; returns the RunLog (silent on other ranks)."""
    if not processes.is_main:
        return metrics.RunLog(None, interactive=False)
    os.makedirs(args.run_dir, exist_ok=True)
    checkpoint.remove_stale_temp_files(args.run_dir)
    config = {**vars(args), "world_size": processes.world_size, "classes": class_names}
    with open(os.path.join(args.run_dir, "config.json"), "w") as config_file:
        json.dump(config, config_file, indent=2)
    return metrics.RunLog(os.path.join(args.run_dir, "metrics.jsonl"), interactive=sys.stdout.isatty())


def save_checkpoint(args, network, optimizer, scheduler, scaler, epoch, step_in_epoch, global_step):
    path = checkpoint.checkpoint_path(args.run_dir, global_step)
    state = {
        "model": network.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": epoch,
        "step_in_epoch": step_in_epoch,
        "global_step": global_step,
        "rng": checkpoint.capture_rng_states(),
        "config": vars(args),
    }
    try:
        checkpoint.save_atomically(state, path)
    except (OSError, RuntimeError) as error:
        # torch.save reports a failed write (ENOSPC, EIO) as a RuntimeError raised while handling the OSError.
        cause = error if isinstance(error, OSError) else error.__context__
        if not isinstance(cause, OSError):
            raise
        previous = checkpoint.latest_checkpoint(args.run_dir)
        kept = f"the previous checkpoint {previous} is intact" if previous else "there is no earlier checkpoint"
        raise CheckpointWriteError(f"could not write {path}: {cause.strerror or cause}; {kept}") from None
    checkpoint.remove_old_checkpoints(args.run_dir, args.keep_checkpoints)
    return path


@torch.no_grad()
def evaluate(forward_model, val_loader, to_device, criterion, autocast, device, processes):
    forward_model.eval()
    meter = metrics.Meter(device)
    for host_images, host_labels, unreadable in val_loader:
        meter.add_batch(0.0, len(unreadable))
        if len(host_labels) > 0:
            images, labels = to_device(host_images, host_labels)
            with autocast():
                logits = forward_model(images)
                loss = criterion(logits, labels)
            meter.add_predictions(loss, logits, labels)
    summary = meter.summary(processes)
    return {"val_loss": summary["loss"], "val_accuracy": summary["accuracy"], "val_bad_images": summary["bad_images"]}


def measure_loader(train_loader, args, device, processes, log, stop):
    """--loader-only: one epoch of batches, decoded, copied and normalised as in training, with no model."""
    to_device = loader.BatchToDevice(device)
    images, steps = 0, 0
    start = time.perf_counter()
    for batch, labels, _ in train_loader:
        to_device(batch, labels)
        images += len(labels)
        steps += 1
        if should_stop(stop, steps, args, processes):
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    images = int(distributed.sum_over_processes(torch.tensor([images], device=device), processes).item())
    record = {"kind": "loader_only", "epoch": 0, "step": steps, "images": images, "workers": args.workers}
    log.write({**record, "images_per_sec": images / elapsed})
    log.print(f"loader-only: {images / elapsed:.1f} images/s over {images} images ({args.workers} workers)")


def train(args, network, train_loader, val_loader, device, processes, log, stop):
    steps_per_epoch = len(train_loader)
    network.to(device, memory_format=torch.channels_last)
    optimizer = optim.build_optimizer(network.parameters(), args.optimizer, args.lr, args.momentum, args.weight_decay)
    scheduler = optim.warmup_cosine_schedule(
        optimizer, round(args.warmup_epochs * steps_per_epoch), args.epochs * steps_per_epoch
    )
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    epoch, step_in_epoch, global_step = 0, 0, 0
    if args.resume_path is not None:
        state = torch.load(args.resume_path, map_location="cpu", weights_only=True)
        network.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        checkpoint.restore_rng_states(state["rng"])
        epoch, step_in_epoch, global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        log.print(f"resumed from {args.resume_path}: epoch {epoch}, step {global_step}")

    forward_model = torch.compile(network) if args.compile else network
    train_model = forward_model
    if processes.is_distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        train_model = DistributedDataParallel(forward_model, device_ids=device_ids)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    to_device = loader.BatchToDevice(device)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    autocast = functools.partial(torch.autocast, device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
    checkpoint_args = (args, network, optimizer, scheduler, scaler)
    bad_images = BadImages(train_loader.dataset.index, args.run_dir, enabled=processes.is_main)
    last_save = time.monotonic()

    while epoch < args.epochs and not should_stop(stop, global_step, args, processes):
        train_loader.sampler.set_epoch(epoch, skip=step_in_epoch * args.batch_size)
        train_model.train()
        log.start_epoch(epoch, steps_per_epoch, step_in_epoch)
        bad_images.start_epoch()
        epoch_meter, interval_meter = metrics.Meter(device), metrics.Meter(device)
        stopped = False
        tick = time.perf_counter()
        for host_images, host_labels, unreadable in train_loader:
            for meter in (epoch_meter, interval_meter):
                meter.add_batch(time.perf_counter() - tick, len(unreadable))
            bad_images.add(unreadable.tolist())
            # A batch of unreadable images only is skipped (under torchrun the other processes would then
            # wait for its gradients: with shuffled data and --max-bad-images that stays theoretical).
            if len(host_labels) > 0:
                images, labels = to_device(host_images, host_labels)
                with autocast():
                    logits = train_model(images)
                    loss = criterion(logits, labels)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                for meter in (epoch_meter, interval_meter):
                    meter.add_predictions(loss, logits, labels)
            scheduler.step()
            step_in_epoch += 1
            global_step += 1
            log.step()

            if global_step % args.log_interval == 0:
                record = {"kind": "interval", "epoch": epoch, "step": global_step, **interval_meter.summary(processes)}
                log.interval({**record, "lr": scheduler.get_last_lr()[0], **metrics.gpu_stats(device)})
                bad_images.check(epoch_meter.summary(processes)["bad_images"], epoch, args, log)
                interval_meter = metrics.Meter(device)
            if step_in_epoch < steps_per_epoch and should_stop(stop, global_step, args, processes):
                stopped = True
                break
            minutes_since_save = (time.monotonic() - last_save) / 60
            if processes.is_main and args.checkpoint_minutes and minutes_since_save >= args.checkpoint_minutes:
                save_checkpoint(*checkpoint_args, epoch, step_in_epoch, global_step)
                last_save = time.monotonic()
            tick = time.perf_counter()

        if stopped:
            if processes.is_main:
                path = save_checkpoint(*checkpoint_args, epoch, step_in_epoch, global_step)
                log.print(f"stopped by {stop_reason(stop, args)} at epoch {epoch}, step {global_step}: saved {path}")
            return
        record = {"kind": "epoch", "epoch": epoch, "step": global_step, **epoch_meter.summary(processes)}
        bad_images.report(epoch, log)
        bad_images.check(record["bad_images"], epoch, args, log)
        if val_loader is not None:
            record.update(evaluate(forward_model, val_loader, to_device, criterion, autocast, device, processes))
        log.end_epoch({**record, "lr": scheduler.get_last_lr()[0]})
        epoch, step_in_epoch = epoch + 1, 0
        if processes.is_main:
            save_checkpoint(*checkpoint_args, epoch, step_in_epoch, global_step)
            last_save = time.monotonic()
    if epoch < args.epochs:
        log.print(f"stopped by {stop_reason(stop, args)} after epoch {epoch - 1}, step {global_step}")
    else:
        log.print(f"finished --epochs {args.epochs} at step {global_step}")


def main(argv=None):
    processes = distributed.processes_from_environment()
    stop = StopRequest(under_torchrun="TORCHELASTIC_RUN_ID" in os.environ)
    args = cli.parse_args(argv, processes)
    device = torch.device(args.device)

    # Everything that can be wrong with the input is found here, before the run directory exists.
    torch.manual_seed(args.seed)
    try:
        class_names, train_index, val_index = data.load_splits(args.data, args.val_fraction, args.seed)
        network = None
        if not args.loader_only:
            network = model.build_model(args.arch, len(class_names))
            try:
                model.check_trainable(network, args.batch_size, args.image_size)
            except model.ModelInputError as error:
                cli.exit_with_usage_error(
                    f"--arch {args.arch} cannot train on --image-size {args.image_size} with --batch-size "
                    f"{args.batch_size}: {error}"
                )
            if args.weights is not None:
                kept = model.load_weights(network, args.weights)
                if processes.is_main:
                    print(f"weights from {args.weights}; left as initialised: {', '.join(kept) or 'none'}")
    except (data.DataError, model.WeightsError) as error:
        cli.exit_with_usage_error(str(error))

    def make_dataset(index, train):
        return data.ImageDataset(index, args.image_size, train=train, seed=args.seed, draft=args.jpeg_draft)

    def make_loader(index, train):
        return loader.build_loader(
            make_dataset(index, train), args, device, train, processes.rank, processes.world_size
        )

    try:
        if args.autotune:
            if processes.world_size > 1:
                cli.exit_with_usage_error("--autotune: run it in one process, without torchrun")
            autotune.tune(make_dataset(train_index, train=True), args, device, autotune.setting_key(args, processes))
            return
        train_loader = make_loader(train_index, train=True)
        val_loader = make_loader(val_index, train=False) if len(val_index) > 0 else None
    except loader.SharedMemoryError as error:
        cli.exit_with_usage_error(str(error))
    if len(train_loader) == 0:
        cli.exit_with_usage_error(
            f"{len(train_index)} training images make no full batch of --batch-size {args.batch_size} "
            f"in each of {processes.world_size} processes"
        )

    processes = distributed.start(processes, device)
    log = open_run_dir(args, processes, class_names)
    log.print(
        f"{len(train_index)} training and {len(val_index)} validation images of {len(class_names)} classes; "
        f"{args.arch} on {device} x {processes.world_size}; {args.workers} loader workers"
        f"{' (autotuned)' if args.autotuned else ''}; run dir {args.run_dir}"
    )
    try:
        if args.loader_only:
            measure_loader(train_loader, args, device, processes, log, stop)
        else:
            train(args, network, train_loader, val_loader, device, processes, log, stop)
    except (TooManyBadImages, CheckpointWriteError) as error:
        print(f"{cli.PROG}: error: {error}", file=sys.stderr)
        sys.exit(1)
    finally:
        log.close()
    # Only after a run every process finished: one that failed leaves the group to torchrun to tear down,
    # since the others may still be inside a collective.
    distributed.finish(processes)


if __name__ == "__main__":
    main()
