"""`torchlab env export [-o FILE]`: this environment as a file that recreates it; `torchlab env diff RUN_DIR`: what
differs between this environment and the one a run recorded (train.py writes RUN_DIR/environment.json).

export writes, on the PyPI path, a requirements lock in `pip freeze` form (`pip install -r FILE`); on the conda
path, `conda env export --no-builds` without its prefix (`conda env create -f FILE`). Either holds the image's
pins with the user's changes (a --user install wins over the image's copy), and leaves out torchlab itself: it
comes with the image and is on no index.
"""

import os
import re
import sys

from torchlab import environment, io, parsing

# torch's local version labels (2.5.1+cu118, +cpu) are builds on PyTorch's own index, not on PyPI.
TORCH_INDEX = "https://download.pytorch.org/whl/{}"
LOCAL_LABEL = re.compile(r"\+(cu\d+|cpu|rocm[\d.]+)$")
LEFT_OUT = ("torchlab",)


def requirement(dist):
    """One line of `pip freeze`: name==version, or name @ URL for what pip installed from a URL or a file."""
    return f"{dist['name']} @ {dist['url']}" if dist.get("url") else f"{dist['name']}=={dist['version']}"


def requirements_lock(dists):
    """The PyPI path's lock: PyTorch's index first where a pin needs it, then one requirement a line."""
    kept = [dist for dist in dists if dist["name"] not in LEFT_OUT]
    labels = sorted({match.group(1) for dist in kept if (match := LOCAL_LABEL.search(dist["version"]))})
    lines = [f"--extra-index-url {TORCH_INDEX.format(label)}" for label in labels]
    return "\n".join(lines + [requirement(dist) for dist in kept]) + "\n"


def conda_lock(conda_text, dists, prefix):
    """conda's export (prefix already gone), less torchlab, with what the user installed outside the env (pip
    --user) in its pip section, replacing the env's pin of the same name."""
    import yaml  # only on the conda path

    def name(requirement_text):
        return environment.canonical_name(re.split(r"[=<>@ ]", requirement_text.strip(), maxsplit=1)[0])

    spec = yaml.safe_load(conda_text)
    dependencies = [d for d in spec.get("dependencies") or [] if isinstance(d, dict) or name(d) not in LEFT_OUT]
    pip = next((d for d in dependencies if isinstance(d, dict) and "pip" in d), None)
    if pip is None:
        pip = {"pip": []}
        dependencies.append(pip)
    prefix = os.path.realpath(prefix)
    overlay = [d for d in dists if not os.path.realpath(d["location"]).startswith(prefix) and d["name"] not in LEFT_OUT]
    replaced = {dist["name"] for dist in overlay} | set(LEFT_OUT)
    pip["pip"] = [line for line in pip["pip"] if name(line) not in replaced] + [requirement(d) for d in overlay]
    if not pip["pip"]:
        dependencies.remove(pip)
    spec["dependencies"] = dependencies
    return yaml.safe_dump(spec, sort_keys=False)


def export(output, prog):
    packages = environment.packages()
    if packages["env_source"] == "conda":
        text = conda_lock(packages["conda_environment"], packages["distributions"], packages["prefix"])
        what = "a conda environment.yml (conda env create -f FILE)"
    else:
        text = requirements_lock(packages["distributions"])
        what = "a pip requirements lock (pip install -r FILE)"
    if output is None:
        sys.stdout.write(text)
        print(f"{prog}: wrote {what} to stdout; torchlab itself left out", file=sys.stderr)
        return
    folder = os.path.dirname(os.path.abspath(output))
    if os.path.isdir(output):
        io.exit_with_error(prog, f"-o {output}: a folder; expected a file name")
    if not os.path.isdir(folder):
        io.exit_with_error(prog, f"-o {output}: no folder {folder}")
    reason = io.unwritable_reason(folder)
    if reason is not None:
        io.exit_with_error(prog, f"-o {output}: {reason}")
    io.atomic_write(output, lambda lock: lock.write(text.encode()))
    print(f"wrote {what} to {output}; torchlab itself left out")


def diff(run_dir, prog):
    """One line per difference; exit 0 when there is none, 1 when there are."""
    if not os.path.isdir(run_dir):
        io.exit_with_error(prog, f"{run_dir}: no such folder; expected a run directory")
    try:
        path, recorded = environment.latest_record(run_dir)
    except ValueError as error:
        io.exit_with_error(prog, error)
    current, problems = environment.collect(None, [])
    for part, why in problems:
        print(f"{prog}: could not read this environment's {part}: {why}", file=sys.stderr)
    lines = environment.differences(recorded, current)
    for _, line in lines:
        print(line)
    if not lines:
        print(f"the same environment as {path} recorded")
    sys.exit(1 if lines else 0)


def build_parser(prog):
    parser = parsing.OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{export,diff}")
    export_parser = commands.add_parser("export", help="write the file that recreates this environment")
    export_parser.add_argument("-o", "--output", metavar="FILE", help="write it here (default: stdout)")
    diff_parser = commands.add_parser("diff", help="what differs from the environment a run recorded (exit 1)")
    diff_parser.add_argument("run_dir", metavar="RUN_DIR")
    return parser


def main(argv=None, prog="torchlab env"):
    args = build_parser(prog).parse_args(argv)
    if args.command == "export":
        export(args.output, f"{prog} export")
    else:
        diff(args.run_dir, f"{prog} diff")


if __name__ == "__main__":
    main()
