"""The image's flavour, and whether this torch can run on the GPUs and driver it sees.

The flavours are buildtools/flavours.tsv, which the image carries as /opt/torchlab/flavours.tsv: each row's `sm`
column is the range of compute capabilities its torch has kernels for, `cuda` the CUDA it is built for. A build
runs on a device when it has kernels of the device's major version at or below its minor (sm_86 runs sm_80's),
or PTX at or below its capability (compiled at first use: slow to start); and on a driver whose CUDA has at least
the build's major version (CUDA's minor version compatibility).
"""

import csv
import dataclasses

FLAVOURS_FILE = "/opt/torchlab/flavours.tsv"


@dataclasses.dataclass(frozen=True)
class Flavour:
    name: str
    cuda: tuple  # (major, minor)
    lowest: tuple  # the lowest and highest compute capability it has kernels for
    highest: tuple
    driver: str  # the oldest NVIDIA driver for its CUDA
    gpus: str

    def runs_on(self, capability, driver_cuda):
        """Whether this flavour's build has kernels for `capability` and its CUDA runs on `driver_cuda`."""
        fits_kernels = self.lowest <= capability and capability[0] <= self.highest[0]
        return fits_kernels and (driver_cuda is None or driver_cuda[0] >= self.cuda[0])


def version_pair(text):
    """'12.0' or '13.2' -> (12, 0) or (13, 2)."""
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def read_flavours(path=FLAVOURS_FILE):
    """Every flavour of the table at `path`, in its order; [] where there is no such file (outside the image)."""
    try:
        with open(path, newline="") as table:
            rows = list(csv.DictReader((line for line in table if not line.startswith("#")), delimiter="\t"))
    except OSError:
        return []
    flavours = []
    for row in rows:
        lowest, highest = row["sm"].split("-")
        flavours.append(
            Flavour(
                row["flavour"],
                version_pair(row["cuda"]),
                version_pair(lowest),
                version_pair(highest),
                row["driver"],
                row["gpus"],
            )
        )
    return flavours


def build_targets(arch_flags):
    """torch._C._cuda_getArchFlags()'s 'sm_80 sm_90 compute_90' -> ({(8, 0), (9, 0)}, {(9, 0)}): kernels, PTX."""
    kernels, ptx = set(), set()
    for flag in arch_flags.split():
        kind, _, number = flag.partition("_")
        number = number.rstrip("af")  # sm_90a, sm_100f: the same capability, with its own extra instructions
        if number.isdigit():
            (kernels if kind == "sm" else ptx).add((int(number[:-1]), int(number[-1])))
    return kernels, ptx


def build_runs_on(capability, kernels, ptx):
    """'kernels' or 'ptx' when a build with these targets runs on a device of `capability`, else None."""
    if any(major == capability[0] and minor <= capability[1] for major, minor in kernels):
        return "kernels"
    if any(target <= capability for target in ptx):
        return "ptx"
    return None


def capability_text(capability):
    return f"sm_{capability[0]}{capability[1]}"


def instead(capabilities, driver_cuda, flavours, this):
    """One line: a flavour other than `this` that runs on every device with this driver; else the driver update
    that lets a flavour (this one first) run; else that no flavour has kernels for these GPUs."""
    for flavour in flavours:
        if flavour.name != this and all(flavour.runs_on(capability, driver_cuda) for capability in capabilities):
            return (
                f"use the {flavour.name} flavour instead (make build FLAVOUR={flavour.name}: CUDA "
                f"{'.'.join(map(str, flavour.cuda))}, {flavour.gpus}, driver >= {flavour.driver})"
            )
    for flavour in sorted(flavours, key=lambda f: f.name != this):
        if all(flavour.runs_on(capability, None) for capability in capabilities):
            then = (
                ""
                if flavour.name == this
                else f", then use the {flavour.name} flavour (make build FLAVOUR={flavour.name})"
            )
            return f"update the host's NVIDIA driver to >= {flavour.driver} (CUDA {flavour.cuda[0]}){then}"
    return "no flavour of this image has kernels for these GPUs"


def fit(capabilities, arch_flags, build_cuda, driver_cuda, flavours, this):
    """Whether a torch built for `arch_flags` and CUDA `build_cuda` (both (major, minor) pairs or text as torch
    gives them) runs on devices of `capabilities` with a driver of CUDA `driver_cuda` (None: unknown).

    Returns (problems, notes, fix): what stops it, what slows it (PTX compiled at first use), and the one-line fix
    for either.
    """
    kernels, ptx = build_targets(arch_flags)
    problems, notes = [], []
    for index, capability in enumerate(capabilities):
        runs = build_runs_on(capability, kernels, ptx)
        if runs is None:
            problems.append(f"gpu {index} ({capability_text(capability)}) has no kernels in this build")
        elif runs == "ptx":
            notes.append(f"gpu {index} ({capability_text(capability)}) runs PTX compiled at first use (slow start)")
    if driver_cuda is not None and driver_cuda[0] < build_cuda[0]:
        problems.append(
            f"the driver supports CUDA {driver_cuda[0]}.{driver_cuda[1]}, this build needs " f"CUDA {build_cuda[0]}.x"
        )
    fix = instead(capabilities, driver_cuda, flavours, this) if problems or notes else ""
    return problems, notes, fix


def this_flavour(image_facts):
    """The image's flavour as its labels say (environment.image()), or 'unknown' (outside the image)."""
    return image_facts.get("flavour") or "unknown"
