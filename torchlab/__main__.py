"""`torchlab COMMAND [FLAGS]` (or `python -m torchlab`): one command for everything the image brings.

Each command is one module's main(argv, prog); the module is imported only when its command runs, so that
`torchlab --help` answers at once.
"""

import importlib
import sys

from torchlab import io

PROG = "torchlab"
# command: (module whose main() runs it, flags put first, what it does)
COMMANDS = {
    "train": ("torchlab.train", [], "train a classifier on --data, resumably (the same as python train.py)"),
    "doctor": ("torchlab.tools.doctor", [], "check the container before a long run: GPUs, data, /dev/shm, CPUs, disk"),
    "bench": ("torchlab.tools.bench", [], "measure the input pipelines on this machine, side by side"),
    "bench-resize": ("torchlab.tools.bench_resize", [], "time resizing crops to 224 px, and PSNR against Pillow"),
    "gpu-check": ("torchlab.tools.gpu_check", [], "what --decode gpu gives on this GPU: decode, training, PSNR"),
    "prepare": ("torchlab.data.prepared", [], "write a prepared copy of an ImageFolder, which loads faster"),
    "env": ("torchlab.tools.env", [], "export this environment as a lock file, or diff it against a run's record"),
    "sample-data": ("torchlab.tools.sample_data", [], "write a small four-class ImageFolder to try training on"),
    "autotune": (
        "torchlab.train",
        ["--autotune"],
        "time loader settings on --data, keep the fastest for --workers auto "
        "(train.py --autotune: train's flags say what to tune for)",
    ),
}


def usage():
    lines = [f"usage: {PROG} COMMAND [FLAGS]", "", "Commands:"]
    lines += [f"  {name:<12} {summary}" for name, (_, _, summary) in COMMANDS.items()]
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
    module_name, first_flags, _ = COMMANDS[command]
    importlib.import_module(module_name).main([*first_flags, *flags], prog=f"{PROG} {command}")


if __name__ == "__main__":
    main()
