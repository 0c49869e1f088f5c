"""The command line: argument types that check a flag's text, the parser whose errors are one line, and the
`torchlab COMMAND [FLAGS]` table.

Each command is one module's main(argv, prog); the module is imported only when its command runs, so that
`torchlab --help` answers at once.
"""

import argparse
import importlib
import math
import sys

from torchlab import io

PROG = "torchlab"
# command: (module whose main() runs it, what it does)
COMMANDS = {
    "train": ("torchlab.train", "train a classifier on --data, resumably (the same as python train.py)"),
    "doctor": ("torchlab.tools.doctor", "check the container before a long run: GPUs, data, /dev/shm, CPUs, disk"),
    "bench": ("torchlab.tools.bench", "measure the input pipelines on this machine, side by side"),
    "gpu-check": ("torchlab.tools.gpu_check", "what --decode gpu gives on this GPU: decode, training, PSNR"),
    "prepare": ("torchlab.tools.prepare", "write a prepared copy of an ImageFolder, which loads faster"),
    "env": ("torchlab.tools.env", "export this environment as a lock file, or diff it against a run's record"),
    "sample-data": ("torchlab.tools.sample_data", "write a small four-class ImageFolder to try training on"),
    "autotune": (
        "torchlab.tools.autotune",
        "time loader settings on --data, keep the fastest for --workers auto (train's flags say what to tune for)",
    ),
}


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage block), like every other input error here."""

    def error(self, message):
        io.exit_with_error(self.prog, f"{message} (see --help)")


def number(kind, minimum, *, above=False, below=None, at_most=None):
    """An argparse type: a finite `kind` (int or float) >= minimum (> when `above`), < `below` and
    <= `at_most` when given."""
    bounds = [f"{'>' if above else '>='} {minimum}"] + ([f"< {below}"] if below is not None else [])
    bounds += [f"<= {at_most}"] if at_most is not None else []
    expected = f"{'an integer' if kind is int else 'a number'} {' and '.join(bounds)}"

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if (
            not (math.isfinite(value) and (value > minimum if above else value >= minimum))
            or (below is not None and value >= below)
            or (at_most is not None and value > at_most)
        ):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.expected = expected  # what a --config null is told to give instead
    return parse


positive_int = number(int, 0, above=True)
non_negative_int = number(int, 0)
positive_float = number(float, 0, above=True)
non_negative_float = number(float, 0)
fraction = number(float, 0, below=1)
# Bounds where larger values only overflow: float32 steps, and the seeds of every RNG (numpy's are 32-bit).
step_size = number(float, 0, above=True, at_most=1000)
decay = number(float, 0, at_most=1000)
seed = number(int, 0, below=2**32)
image_size = number(int, 0, above=True, at_most=4096)


def worker_count(text):
    if text == "auto":
        return text
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {worker_count.expected}, got {text!r}") from None


worker_count.expected = "auto or an integer >= 0"


def usage():
    lines = [f"usage: {PROG} COMMAND [FLAGS]", "", "Commands:"]
    lines += [f"  {name:<12} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", f"`{PROG} COMMAND --help` lists the flags of each."]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if not argv:
        print(usage(), file=sys.stderr)
        sys.exit(io.USAGE_ERROR_STATUS)
    command, flags = argv[0], argv[1:]
    if command not in COMMANDS:
        io.exit_with_error(PROG, f"unknown command {command!r}; expected one of {', '.join(COMMANDS)} (see --help)")
    module_name, _ = COMMANDS[command]
    importlib.import_module(module_name).main(flags, prog=f"{PROG} {command}")
