"""What a run reports: progress on stdout, and one JSON object per line in RUN_DIR/metrics.jsonl.

On a terminal, a tqdm bar per epoch shows the latest interval; into a file (nohup ... > log.txt), a plain
line every --log-interval steps. Records have a "kind": "interval" (every --log-interval steps), "epoch"
(training and validation totals of an epoch) or "loader_only". Only rank 0 reports. The scalars of the
interval and epoch records also go to a TensorBoard event file in RUN_DIR (events.out.tfevents.*), flushed at
the end of each epoch and of the run.
"""

import contextlib
import json
import os
import time

import torch
from tqdm import tqdm

from torchlab import distributed

# How a record reads on one line: its fields in this order, each when present.
LINE_FIELDS = (
    ("loss", "loss {:.4f}"),
    ("accuracy", "acc {:.1%}"),
    ("val_loss", "val loss {:.4f}"),
    ("val_accuracy", "val acc {:.1%}"),
    ("lr", "lr {:.4g}"),
    ("images_per_sec", "{:.1f} images/s"),
    ("data_wait_frac", "data wait {:.0%}"),
    ("bad_images", "bad images {}"),
    ("gpu_util", "GPU {}%"),
    ("gpu_mem_gb", "GPU mem {:.1f} GB"),
)

# What TensorBoard shows: these fields of the interval and epoch records, as "<section>/<field>" at the record's step.
TENSORBOARD_FIELDS = (
    "loss",
    "accuracy",
    "val_loss",
    "val_accuracy",
    "lr",
    "images_per_sec",
    "data_wait_frac",
    "gpu_util",
    "gpu_mem_gb",
)
TENSORBOARD_SECTIONS = {"interval": "train", "epoch": "epoch"}


def format_record(record):
    done = " done at" if record["kind"] == "epoch" else ""
    head = f"epoch {record['epoch']}{done} step {record['step']}"
    return " | ".join([head] + [text.format(record[key]) for key, text in LINE_FIELDS if record.get(key) is not None])


def gpu_stats(device):
    """GPU utilisation (%, needs pynvml) and peak memory allocated since the last call (GB); {} off CUDA."""
    if device.type != "cuda":
        return {}
    stats = {"gpu_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30}
    torch.cuda.reset_peak_memory_stats(device)
    with contextlib.suppress(Exception):  # pynvml missing (ModuleNotFoundError) or NVML failing: memory only
        stats["gpu_util"] = torch.cuda.utilization(device)
    return stats


class Meter:
    """Sums over a span of steps. Loss and hits stay on the device: nothing waits for the GPU each step."""

    def __init__(self, device):
        self.device = device
        self.device_sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss x images, correct
        self.images = 0
        self.unreadable = 0
        self.data_wait = 0.0
        self.start = time.perf_counter()

    @classmethod
    def resumed(cls, device, states, processes):
        """A Meter that goes on from `states` (see resume), or a fresh one where they are None."""
        meter = cls(device)
        if states is not None:
            meter.resume(states, processes)
        return meter

    def add_batch(self, data_wait, unreadable):
        """Every step: seconds spent waiting for the batch, and how many of its images were unreadable."""
        self.data_wait += data_wait
        self.unreadable += unreadable

    def add_predictions(self, loss, logits, labels):
        count = labels.shape[0]
        self.device_sums[0] += loss.detach().double() * count
        self.device_sums[1] += (logits.argmax(dim=1) == labels).sum()
        self.images += count

    def state(self):
        """This process's sums so far, for a checkpoint taken mid-epoch: float64 [loss x images, correct, images,
        unreadable, data wait seconds, seconds since the start]."""
        host = [self.images, self.unreadable, self.data_wait, time.perf_counter() - self.start]
        return torch.cat([self.device_sums.cpu(), torch.tensor(host, dtype=torch.float64)])

    def resume(self, states, processes):
        """Go on from `states` (every process's state() at a checkpoint, stacked by rank): this process's own; with
        another number of processes, all of them added into rank 0's (the totals are sums over the processes)."""
        if len(states) == processes.world_size:
            state = states[processes.rank]
        elif processes.is_main:
            state = torch.cat([states[:, :4].sum(0), states[0, 4:]])
        else:
            return
        self.device_sums.copy_(state[:2])
        self.images, self.unreadable = int(state[2]), int(state[3])
        self.data_wait, self.start = float(state[4]), time.perf_counter() - float(state[5])

    def summary(self, processes):
        """Totals over all processes (a collective: every process calls it at the same step)."""
        host_sums = torch.tensor([self.images, self.unreadable], dtype=torch.float64, device=self.device)
        totals = distributed.sum_over_processes(torch.cat([self.device_sums, host_sums]), processes)
        loss_sum, correct, images, unreadable = totals.tolist()
        elapsed = time.perf_counter() - self.start
        return {
            "loss": loss_sum / max(images, 1),
            "accuracy": correct / max(images, 1),
            "images_per_sec": images / elapsed,
            "data_wait_frac": self.data_wait / elapsed,
            "bad_images": int(unreadable),
        }


class RunLog:
    """Rank 0's reporting: RunLog(None, ...) on the other ranks prints and writes nothing."""

    def __init__(self, metrics_path, interactive):
        self.metrics_path = metrics_path
        self.enabled = metrics_path is not None
        self.interactive = interactive
        self.bar = None
        self.tensorboard = None  # the SummaryWriter, made at the first scalar

    def start_epoch(self, epoch, steps, steps_done):
        if self.enabled and self.interactive:
            self.bar = tqdm(total=steps, initial=steps_done, desc=f"epoch {epoch}", dynamic_ncols=True)

    def step(self):
        if self.bar is not None:
            self.bar.update()

    def interval(self, record):
        self.write(record)
        if self.bar is not None:
            self.bar.set_postfix_str(format_record(record).split(" | ", 1)[1], refresh=False)
        else:
            self.print(format_record(record))

    def end_epoch(self, record):
        self.end_bar()
        self.write(record)
        self.print(format_record(record))
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def write(self, record):
        """Append a record to metrics.jsonl (the file is closed after each, so any reader sees whole lines), and
        its scalars to the TensorBoard event file."""
        if self.enabled:
            with open(self.metrics_path, "a") as metrics_file:
                metrics_file.write(json.dumps(record) + "\n")
            self.add_scalars(record)

    def add_scalars(self, record):
        section = TENSORBOARD_SECTIONS.get(record["kind"])
        if section is None:
            return
        if self.tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter  # only runs that log scalars pay for the import

            self.tensorboard = SummaryWriter(log_dir=os.path.dirname(self.metrics_path))
        for field in TENSORBOARD_FIELDS:
            if record.get(field) is not None:
                self.tensorboard.add_scalar(f"{section}/{field}", record[field], global_step=record["step"])

    def print(self, text):
        if not self.enabled:
            return
        if self.bar is not None:
            tqdm.write(text)
        else:
            print(text, flush=True)

    def end_bar(self):
        """End the progress bar, if any."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self):
        """At the end of the run: the progress bar ends, and the event file is flushed and closed."""
        self.end_bar()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
