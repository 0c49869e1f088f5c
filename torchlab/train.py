"""Train a torchvision image classifier on an ImageFolder, resumably: `python train.py --data /data`
(or `torchlab train`, or `python -m torchlab.train`).

main() reads top to bottom: the flags are parsed and resolved, the data index and the model are checked
before anything is written; then the loaders, the optimiser and the checkpoint --resume picked (restored before
the run directory is touched), the run directory; then the epoch loop (train_one_epoch, evaluate), which reports
progress, checkpoints (CheckpointManager), and stops cleanly on SIGTERM or SIGINT. docs/training.md
(/opt/torchlab/docs/training.md in the image) tells how to run it over SSH, on several GPUs or machines
(torchrun), and what lands in the run directory.
"""

import dataclasses
import functools
import json
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel

from torchlab import activity, config, distributed, environment, io, metrics, model, optim, resolve
from torchlab.checkpoint import CheckpointManager, CheckpointReadError, CheckpointWriteError, Position
from torchlab.data import decode, folder, splits
from torchlab.pipeline import build, loader, plan, sampler

BAD_IMAGES_FILE = "bad_images.txt"  # in the run directory: every unreadable file of the run, with the reason
TRAINING_FAILURE_STATUS = 1


class TooManyBadImages(RuntimeError):
    """More unreadable images in an epoch than --max-bad-images: one line on stderr, exit code 1."""


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


def should_stop(stop, global_step, cfg, processes):
    """A signal reached any process, or --max-steps is reached (a collective under torchrun)."""
    return step_vote(stop, global_step, cfg, processes)[0]


def step_vote(stop, global_step, cfg, processes, checkpoint_due=False):
    """(stop, save a checkpoint now): should_stop's answer, and `checkpoint_due` (rank 0's --checkpoint-minutes
    clock), agreed by every process in one vote: a mid-epoch checkpoint gathers every process's epoch sums, so
    all of them save together."""
    signalled, due = distributed.any_process((stop.signal_name is not None, checkpoint_due), processes)
    return signalled or (cfg.max_steps is not None and global_step >= cfg.max_steps), due


def stop_reason(stop, global_step, cfg):
    """What stopped the run, once should_stop said so: this process's signal, --max-steps, or (under torchrun)
    a signal that reached another process only: the vote tells whether, not which."""
    if stop.signal_name is not None:
        return stop.signal_name
    if cfg.max_steps is not None and global_step >= cfg.max_steps:
        return f"--max-steps {cfg.max_steps}"
    return "a signal to another process"


class BadImages:
    """The unreadable images of a run, in both splits: the first few of each epoch's training or validation pass
    that had any are named in the log at its end, and every one of the run, with the reason, in
    RUN_DIR/bad_images.txt. Each process names its own (it finds the reason); at the pass's end rank 0 gathers
    every process's, so that the file names all of them (one small collective per pass with any, rather than a
    file per process to merge)."""

    def __init__(self, run_dir, processes):
        self.processes = processes
        self.path = os.path.join(run_dir, BAD_IMAGES_FILE)
        self.files = decode.UnreadableFiles(self.read_back())  # over the whole run, a resumed one included
        self.this_pass = []

    def read_back(self):
        if not self.processes.is_main or not os.path.exists(self.path):
            return {}
        with open(self.path, encoding="utf-8", errors="replace") as lines:
            return dict(line.rstrip("\n").split("\t", 1) for line in lines if "\t" in line)

    def add(self, index, positions):
        """The unreadable `positions` of the split `index` (a data index) in this pass."""
        for position in positions:
            path = index.path(position)
            self.this_pass.append(path)
            self.files.add(path, lambda position=position: decode.unreadable_reason(index.source(position)))

    def start_pass(self):
        self.this_pass = []

    def report(self, where, count, log):
        """The pass `where` ("epoch 3", "epoch 3's validation") had `count` unreadable images (over all processes;
        every process calls this together): rank 0 gathers every process's, names the first few in the log and
        writes every one of the run."""
        if count == 0:
            return
        mine = [(path, self.files.reasons[path]) for path in self.this_pass]
        everyone = [pair for pairs in distributed.gathered(mine, self.processes) for pair in pairs]
        if not self.processes.is_main:
            return
        self.this_pass = [path for path, _ in everyone]
        for path, reason in everyone:  # the other processes' files
            self.files.reasons.setdefault(path, reason)
        text = "".join(f"{path}\t{reason}\n" for path, reason in sorted(self.files.reasons.items()))
        io.atomic_write(self.path, lambda file: file.write(text.encode("utf-8", "replace")))
        named = self.files.named(self.this_pass) or "met before the resume"
        log.print(f"{where}: skipped {count} unreadable images: {named}; all in {self.path}")

    def check(self, count, epoch, cfg, log):
        """More than --max-bad-images in this epoch's training (over all processes) stops the run, naming them."""
        if count > cfg.max_bad_images:
            self.report(f"epoch {epoch}", count, log)
            examples = ", ".join(self.this_pass[: decode.UNREADABLE_EXAMPLES]) or "(on other processes)"
            raise TooManyBadImages(
                f"{count} images of epoch {epoch} could not be decoded, more than --max-bad-images "
                f"{cfg.max_bad_images}; e.g. {examples}"
            )


@dataclasses.dataclass
class Training:
    """What a training step needs: the model (as built, compiled and wrapped for DDP), the optimiser, the
    schedule, the gradient scaler, the loss, mixed precision and the batches' way to the device."""

    network: torch.nn.Module
    forward_model: torch.nn.Module  # the network, compiled with --compile: what evaluation runs
    train_model: torch.nn.Module  # forward_model, wrapped in DDP under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    criterion: torch.nn.Module
    autocast: functools.partial
    to_device: loader.BatchToDevice  # or its subclass device_decode.DeviceDecoder, with --decode gpu

    def components(self):
        """What a checkpoint holds of the training, by name."""
        return {"model": self.network, "optimizer": self.optimizer, "scheduler": self.scheduler, "scaler": self.scaler}


def build_training(cfg, setup, network, steps_per_epoch, to_device, processes):
    """The Training of `network` for cfg's flags as `setup` (resolve.Setup) resolved them; `to_device` is the
    batches' way to the device (build.build_input's for the loader plan's decoder)."""
    device = to_device.device
    network.to(device, memory_format=torch.channels_last)
    optimizer = optim.build_optimizer(network.parameters(), cfg.optimizer, setup.lr, cfg.momentum, cfg.weight_decay)
    scheduler = optim.warmup_cosine_schedule(
        optimizer, round(cfg.warmup_epochs * steps_per_epoch), cfg.epochs * steps_per_epoch
    )
    forward_model = torch.compile(network) if cfg.compile else network
    train_model = forward_model
    if processes.is_distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        train_model = DistributedDataParallel(forward_model, device_ids=device_ids)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.amp)
    return Training(
        network=network,
        forward_model=forward_model,
        train_model=train_model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(device.type, enabled=setup.amp == "fp16"),
        criterion=torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        autocast=functools.partial(torch.autocast, device.type, dtype=amp_dtype, enabled=amp_dtype is not None),
        to_device=to_device,
    )


def train_step(training, images, labels, meters):
    with training.autocast():
        logits = training.train_model(images)
        loss = training.criterion(logits, labels)
    training.optimizer.zero_grad(set_to_none=True)
    training.scaler.scale(loss).backward()
    training.scaler.step(training.optimizer)
    training.scaler.update()
    for meter in meters:
        meter.add_predictions(loss, logits, labels)


def train_one_epoch(training, train_loader, position, run):
    """Train from `position` (advanced in place) to the end of its epoch; returns the epoch's record, or None
    when a signal or --max-steps stopped it first. `run` holds the configuration, the processes, the log,
    the stop flag, the bad images and the checkpoints."""
    cfg, processes, log = run.cfg, run.processes, run.log
    # The whole epoch's steps: position.step_in_epoch counts from the epoch's start, also after a resume, when
    # this pass reads only the batches from there (len(train_loader) after the set_epoch below).
    steps_per_epoch = loader.batches_per_epoch(train_loader)
    train_loader.sampler.set_epoch(position.epoch, skip=position.step_in_epoch * cfg.batch_size)
    training.train_model.train()
    log.start_epoch(position.epoch, steps_per_epoch, position.step_in_epoch)
    run.bad_images.start_pass()
    device = training.to_device.device
    # Resumed mid-epoch: the epoch's summary and the interval's record go on from the steps before the stop.
    run.epoch_meter = epoch_meter = metrics.Meter.resumed(device, position.epoch_sums, processes)
    run.interval_meter = metrics.Meter.resumed(device, position.interval_sums, processes)
    position.epoch_sums = position.interval_sums = None
    tick = time.perf_counter()
    # The wait for each batch lasts until it is on the device, normalised (decoded there too, --decode gpu).
    for images, labels, bad in training.to_device.batches(train_loader):
        waited = time.perf_counter() - tick
        # A batch of unreadable images only is skipped (under torchrun the other processes would then
        # wait for its gradients: with shuffled data and --max-bad-images that stays theoretical). `bad`: the
        # workers' unreadable images, and those the device step could not decode (--decode gpu).
        if len(labels) > 0:
            train_step(training, images, labels, (epoch_meter, run.interval_meter))
        for meter in (epoch_meter, run.interval_meter):
            meter.add_batch(waited, len(bad))
        run.bad_images.add(train_loader.dataset.index, bad)
        training.scheduler.step()
        position.step_in_epoch += 1
        position.global_step += 1
        log.step()
        if position.global_step % cfg.log_interval == 0:
            record = {"kind": "interval", "epoch": position.epoch, "step": position.global_step}
            record.update(run.interval_meter.summary(processes), lr=training.scheduler.get_last_lr()[0])
            log.interval({**record, **metrics.gpu_stats(device)})
            run.bad_images.check(epoch_meter.summary(processes)["bad_images"], position.epoch, cfg, log)
            run.interval_meter = metrics.Meter(device)
        if position.step_in_epoch < steps_per_epoch:  # at the epoch's end, fit saves its checkpoint
            stopping, due = step_vote(run.stop, position.global_step, cfg, processes, run.checkpoint_due())
            if stopping:
                return None
            if due:
                run.save(position)
        tick = time.perf_counter()
    return {"kind": "epoch", "epoch": position.epoch, "step": position.global_step, **epoch_meter.summary(processes)}


@torch.no_grad()
def evaluate(training, val_loader, processes, bad_images):
    """The validation pass's record fields; its unreadable images go to `bad_images` (BadImages), which names them
    once the record is logged."""
    training.forward_model.eval()
    meter = metrics.Meter(training.to_device.device)
    bad_images.start_pass()
    for images, labels, bad in training.to_device.batches(val_loader):
        meter.add_batch(0.0, len(bad))
        bad_images.add(val_loader.dataset.index, bad)
        if len(labels) > 0:
            with training.autocast():
                logits = training.forward_model(images)
                loss = training.criterion(logits, labels)
            meter.add_predictions(loss, logits, labels)
    summary = meter.summary(processes)
    return {"val_loss": summary["loss"], "val_accuracy": summary["accuracy"], "val_bad_images": summary["bad_images"]}


@dataclasses.dataclass
class Run:
    """What the epoch loop shares: the configuration, the processes, the log, the stop flag, the bad images,
    the epoch's and the current interval's sums so far (their Meters) and the checkpoints (rank 0 writes them:
    every --checkpoint-minutes, at each epoch's end, when stopped)."""

    cfg: config.TrainConfig
    processes: distributed.Processes
    log: metrics.RunLog
    stop: StopRequest
    bad_images: BadImages
    checkpoints: CheckpointManager
    epoch_meter: metrics.Meter = None
    interval_meter: metrics.Meter = None
    last_save: float = dataclasses.field(default_factory=time.monotonic)

    def save(self, position):
        """Every process calls it together. A checkpoint taken mid-epoch keeps every process's epoch and interval
        sums, so that a run resumed from it reports the epoch's summary and the interval's record over all their
        steps, those before the stop included."""
        if position.step_in_epoch > 0:
            mine = torch.stack([self.epoch_meter.state(), self.interval_meter.state()])
            states = torch.stack(distributed.gathered(mine, self.processes))  # rank, meter, sums
            position = dataclasses.replace(position, epoch_sums=states[:, 0], interval_sums=states[:, 1])
        if not self.processes.is_main:
            return None
        self.last_save = time.monotonic()
        return self.checkpoints.save(position)

    def checkpoint_due(self):
        """Rank 0's --checkpoint-minutes clock says so (the other processes learn it in the step's vote)."""
        minutes = self.cfg.checkpoint_minutes
        return bool(self.processes.is_main and minutes and (time.monotonic() - self.last_save) / 60 >= minutes)


def start_training(cfg, setup, network, steps_per_epoch, to_device, record, processes):
    """(Training, CheckpointManager, the Position to start at): restored from the checkpoint --resume picked, if
    any; each checkpoint keeps `record` (run_record). It writes nothing, so that a checkpoint whose states do not
    fit this run (CheckpointReadError) leaves the run directory as it was."""
    training = build_training(cfg, setup, network, steps_per_epoch, to_device, processes)
    checkpoints = CheckpointManager(cfg.run_dir, cfg.keep_checkpoints, training.components(), record)
    position = Position() if setup.resume_path is None else checkpoints.restore(setup.resume_path)
    return training, checkpoints, position


def fit(cfg, setup, start, train_loader, val_loader, processes, log, stop):
    """The epoch loop, from `start` (what start_training returned) to --epochs, a signal or --max-steps."""
    training, checkpoints, position = start
    first_step = position.global_step
    if setup.resume_path is not None:
        log.print(f"resumed from {setup.resume_path}: epoch {position.epoch}, step {position.global_step}")
    bad_images = BadImages(cfg.run_dir, processes)
    run = Run(cfg, processes, log, stop, bad_images, checkpoints)
    while position.epoch < cfg.epochs and not should_stop(stop, position.global_step, cfg, processes):
        record = train_one_epoch(training, train_loader, position, run)
        if record is None:
            path = run.save(position)
            if path is not None:
                reason = stop_reason(stop, position.global_step, cfg)
                log.print(f"stopped by {reason} at epoch {position.epoch}, step {position.global_step}: saved {path}")
            return
        bad_images.check(record["bad_images"], position.epoch, cfg, log)  # over the limit: reports, then raises
        bad_images.report(f"epoch {position.epoch}", record["bad_images"], log)
        if val_loader is not None:
            record.update(evaluate(training, val_loader, processes, bad_images))
        log.end_epoch({**record, "lr": training.scheduler.get_last_lr()[0]})
        bad_images.report(f"epoch {position.epoch}'s validation", record.get("val_bad_images", 0), log)
        position = Position(position.epoch + 1, 0, position.global_step)
        run.save(position)
    if position.epoch >= cfg.epochs:
        log.print(f"finished --epochs {cfg.epochs} at step {position.global_step}")
    elif cfg.max_steps is not None and first_step >= cfg.max_steps:
        log.print(
            f"nothing to do: the run had already reached --max-steps {cfg.max_steps} at step {first_step} "
            "(a larger --max-steps continues it)"
        )
    else:  # stopped at the loop's head: at an epoch's end, or before this start's first step
        between_epochs = position.epoch > 0 and position.step_in_epoch == 0
        where = f"after epoch {position.epoch - 1}" if between_epochs else f"at epoch {position.epoch}"
        log.print(f"stopped by {stop_reason(stop, position.global_step, cfg)} {where}, step {position.global_step}")


def finished(position, cfg):
    """A run at `position` has no step left: --epochs done, or --max-steps reached."""
    return position.epoch >= cfg.epochs or (cfg.max_steps is not None and position.global_step >= cfg.max_steps)


def measure_loader(train_loader, used, cfg, to_device, processes, log, stop):
    """--loader-only: one epoch of batches of the loader plan `used`, decoded, copied and normalised as in
    training, with no model."""
    device = to_device.device
    timing = loader.timed_pass(train_loader, to_device, device, lambda t: should_stop(stop, t.batches, cfg, processes))
    images = int(distributed.sum_over_processes(torch.tensor([timing.images], device=device), processes).item())
    rate = images / timing.seconds
    record = {"kind": "loader_only", "epoch": 0, "step": timing.batches, "images": images}
    record.update(loader=used.loader, workers=used.workers, decode=used.decode)
    log.write({**record, "images_per_sec": rate, "wait_seconds": timing.wait_seconds})
    what = "decoded in the loop" if used.workers == 0 else f"{used.workers} {plan.UNITS[used.loader]}"
    log.print(f"loader-only: {rate:.1f} images/s over {images} images ({what}, --decode {used.decode})")


def run_record(cfg, setup, used, world_size, class_names):
    """What config.json and each checkpoint keep of the run: the flags as asked, what resolve found for them
    ("resolved"), the loader plan as used ("loader_plan"), the processes and the classes."""
    resolved = dataclasses.asdict(setup)
    return {
        **dataclasses.asdict(cfg),
        "resolved": resolved,
        "loader_plan": used.record(),
        "world_size": world_size,
        "classes": class_names,
    }


def open_run_dir(cfg, record, processes, trains=True):
    """Rank 0 makes the run directory and writes config.json (run_record); metrics.jsonl's first record is this
    start's loader plan, unless it `trains` no step (a finished run started again). Returns the RunLog (silent on
    other ranks)."""
    if not processes.is_main:
        return metrics.RunLog(None, interactive=False)
    os.makedirs(cfg.run_dir, exist_ok=True)
    io.remove_stale_temp_files(cfg.run_dir)
    with open(os.path.join(cfg.run_dir, "config.json"), "w") as config_file:
        json.dump(record, config_file, indent=2)
    log = metrics.RunLog(os.path.join(cfg.run_dir, "metrics.jsonl"), interactive=sys.stdout.isatty())
    if trains:
        log.write({"kind": "loader_plan", "epoch": 0, "step": 0, **record["loader_plan"]})
    return log


def checked_inputs(cfg, processes):
    """The data index and the model, checked before anything is written: (class_names, train index, val index,
    network or None with --loader-only). Raises ConfigError, folder.DataError or model errors."""
    class_names, train_index, val_index = splits.load_splits(cfg.data, cfg.val_fraction, cfg.seed)
    if cfg.loader_only:
        return class_names, train_index, val_index, None
    network = model.build_model(cfg.arch, len(class_names))
    try:
        model.check_trainable(network, cfg.batch_size, cfg.image_size)
    except model.ModelInputError as error:
        raise config.ConfigError(
            f"--arch {cfg.arch} cannot train on --image-size {cfg.image_size} with --batch-size "
            f"{cfg.batch_size}: {error}"
        ) from None
    if cfg.weights is not None:
        kept = model.load_weights(network, cfg.weights)
        if processes.is_main:
            print(f"weights from {cfg.weights}; left as initialised: {', '.join(kept) or 'none'}")
    return class_names, train_index, val_index, network


def make_input(cfg, used, train_index, val_index, device, processes):
    """The training and validation loaders and the device step (build.Input), as the loader plan `used` says.
    Raises ConfigError where the training images make no full batch."""
    share = sampler.EpochSampler(len(train_index), True, cfg.seed, processes.rank, processes.world_size)
    if share.samples_per_epoch() < cfg.batch_size:
        raise config.ConfigError(
            f"{len(train_index)} training images make no full batch of --batch-size {cfg.batch_size} "
            f"in each of {processes.world_size} processes"
        )
    return build.build_input(
        used, cfg.image_size, device, train_index, val_index, rank=processes.rank, world_size=processes.world_size
    )


def main(argv=None, prog=config.PROG):
    processes = distributed.processes_from_environment()
    stop = StopRequest(under_torchrun="TORCHELASTIC_RUN_ID" in os.environ)
    # Everything that can be wrong with the input is found here, before the run directory exists.
    try:
        cfg = config.parse_args(argv, prog)
        setup = resolve.resolve(cfg, processes)
        device = torch.device(setup.device)
        torch.manual_seed(cfg.seed)
        class_names, train_index, val_index, network = checked_inputs(cfg, processes)
        used = resolve.loader_plan(cfg, setup.device, train_index, processes.local_world_size)
        train_loader, val_loader, to_device = make_input(cfg, used, train_index, val_index, device, processes)
    except (config.ConfigError, folder.DataError, model.WeightsError, plan.PlanError) as error:
        io.exit_with_error(prog, error)

    processes = distributed.start(processes, device)
    record = run_record(cfg, setup, used, processes.world_size, class_names)
    try:  # before config.json is written: a --resume checkpoint of another model leaves the run dir as it was
        steps_per_epoch = loader.batches_per_epoch(train_loader)
        if not cfg.loader_only:
            start = start_training(cfg, setup, network, steps_per_epoch, to_device, record, processes)
    except CheckpointReadError as error:
        io.exit_with_error(prog, f"--resume {error}")
    log = open_run_dir(cfg, record, processes, trains=cfg.loader_only or not finished(start[2], cfg))
    log.print(
        f"{len(train_index)} training and {len(val_index)} validation images of {len(class_names)} classes; "
        f"{cfg.arch} on {device} x {processes.world_size}; loader: {used.describe()}; run dir {cfg.run_dir}"
    )
    if processes.is_main:  # environment.json: what this run ran in (a WARNING, never a stop, if it cannot be written)
        environment.record(cfg.run_dir, record["loader_plan"], argv)
    try:
        with activity.announced(cfg.run_dir):  # Jupyter's idle cullers see the run (torchlab.jupyter_activity)
            if cfg.loader_only:
                measure_loader(train_loader, used, cfg, to_device, processes, log, stop)
            else:
                fit(cfg, setup, start, train_loader, val_loader, processes, log, stop)
    except (TooManyBadImages, CheckpointWriteError) as error:
        io.exit_with_error(prog, error, status=TRAINING_FAILURE_STATUS)
    finally:
        log.close()
    # Only after a run every process finished: one that failed leaves the group to torchrun to tear down,
    # since the others may still be inside a collective.
    distributed.finish(processes)


if __name__ == "__main__":
    main()
