"""The `torchlab COMMAND [FLAGS]` table: the top layer.

Each command is one module's main(argv, prog); the module is imported only when its command runs, so that
`torchlab --help` answers at once.
"""

import importlib
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
