"""Read environment.yml, the one source of the env's pins, for the PyPI path and the checks.

    python envspec.py requirements [--flavour F] torch environment.yml  # pip pins of torch, torchvision, torchaudio
    python envspec.py requirements [--flavour F] rest  environment.yml  # pip pins of everything else
    python envspec.py check [--flavour F] [--cuda 11.8] environment.yml  # installed versions == pins, else exit 1

A flavour (buildtools/flavours.tsv) takes a line's pin from its `[F=VERSION]` note where it has one.
It runs on the bare base image, before anything is installed, so it parses the
file's simple `- name=version` lines itself instead of importing a YAML library.
"""

import argparse
import re
import sys
from importlib import metadata

# conda packages with no PyPI wheel of their own: the wheels bundle them (CUDA, MKL)
# or the base image brings them (python).
CONDA_ONLY = {"python", "pytorch-cuda", "mkl"}
# conda name -> PyPI name, where they differ.
PYPI_NAME = {"pytorch": "torch"}
TORCH_PACKAGES = {"torch", "torchvision", "torchaudio"}

PIN = re.compile(r"^\s*-\s*([A-Za-z0-9_.\-]+)\s*=\s*([^=\s#]+)\s*(#.*)?$")
FLAVOUR_PIN = re.compile(r"\[([a-z]+)=([^\]\s]+)\]")
DEFAULT_FLAVOUR = "compat"  # the brief's: environment.yml's pins as written, the only flavour of the conda path


def conda_pins(path, flavour=DEFAULT_FLAVOUR):
    """{conda name: version} for every `- name=version` line under dependencies, as `flavour` pins it."""
    pins, in_deps = {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if re.match(r"^\S", line):
                in_deps = line.startswith("dependencies:")
                continue
            m = PIN.match(line)
            if in_deps and m:
                notes = dict(FLAVOUR_PIN.findall(m.group(3) or ""))
                pins[m.group(1)] = notes.get(flavour, m.group(2))
    if not pins:
        sys.exit(f"envspec: no `- name=version` pins found under dependencies: in {path}")
    return pins


def pypi_pins(path, flavour=DEFAULT_FLAVOUR):
    """{PyPI name: version} of the packages installed from wheels."""
    pins = conda_pins(path, flavour)
    return {PYPI_NAME.get(name, name): version for name, version in pins.items() if name not in CONDA_ONLY}


def check(path, cuda, flavour=DEFAULT_FLAVOUR):
    problems = []
    for name, want in pypi_pins(path, flavour).items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed, environment.yml pins {want}")
            continue
        if have.split("+")[0] != want:
            problems.append(f"{name}: installed {have}, environment.yml pins {want}")
    python = conda_pins(path, flavour).get("python", "")
    running = "{}.{}".format(*sys.version_info[:2])
    if not python.startswith(running + ".") and python != running:
        print(f"envspec: note: environment.yml pins python {python}; this base image has {running}", file=sys.stderr)
    if cuda:
        import torch

        if torch.version.cuda != cuda:
            problems.append(f"torch: built for CUDA {torch.version.cuda}, expected {cuda}")
    for p in problems:
        print(f"envspec: {p}", file=sys.stderr)
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("requirements", help="print pip requirement lines")
    req.add_argument("group", choices=["torch", "rest"])
    chk = sub.add_parser("check", help="compare installed versions with the pins")
    chk.add_argument("--cuda", default="", help="expected torch.version.cuda (default: not checked)")
    for command in (req, chk):
        command.add_argument("--flavour", default=DEFAULT_FLAVOUR, help="whose pins (default: %(default)s)")
        command.add_argument("environment")
    args = parser.parse_args()
    if args.command == "requirements":
        for name, version in pypi_pins(args.environment, args.flavour).items():
            if (name in TORCH_PACKAGES) == (args.group == "torch"):
                print(f"{name}=={version}")
        return 0
    return check(args.environment, args.cuda, args.flavour)


if __name__ == "__main__":
    sys.exit(main())
