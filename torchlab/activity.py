"""Training runs that idle cullers can see: each live run leaves a record that Jupyter's server reads.

While train.main runs, each of its processes keeps ACTIVITY_DIR/<pid>.json (ACTIVITY_DIR is
$TORCHLAB_ACTIVITY_DIR, which the image's start sets unless TRAINING_IS_ACTIVITY=no; unset, nothing is
written). A record counts while its process lives (its PID with the same start time, so a reused PID does not
count): a run killed with SIGKILL leaves a record that no longer counts. torchlab.jupyter_activity, a Jupyter
server extension, turns live records into the server's activity. docs/training.md, "Idle cullers", says which
cullers see it.
"""

import contextlib
import json
import os

ACTIVITY_DIR_VARIABLE = "TORCHLAB_ACTIVITY_DIR"


def process_start(pid):
    """The start time of process `pid` (clock ticks since boot, /proc/PID/stat's 22nd field); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@contextlib.contextmanager
def announced(run_dir):
    """This process's record in ACTIVITY_DIR for the length of the `with` block; nothing where the variable is
    unset, or where the folder cannot be written (a run never stops for its record)."""
    folder = os.environ.get(ACTIVITY_DIR_VARIABLE)
    path = None
    if folder:
        pid = os.getpid()
        record = {"pid": pid, "start": process_start(pid), "run_dir": os.path.abspath(run_dir)}
        with contextlib.suppress(OSError):
            os.makedirs(folder, mode=0o700, exist_ok=True)
            with open(os.path.join(folder, f".{pid}.tmp"), "w") as temp:
                json.dump(record, temp)
            os.replace(temp.name, os.path.join(folder, f"{pid}.json"))
            path = os.path.join(folder, f"{pid}.json")
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)


def live_runs(folder):
    """The records in `folder` whose process is alive: a list of dicts (pid, start, run_dir)."""
    try:
        names = [name for name in os.listdir(folder) if name.endswith(".json")]
    except OSError:
        return []
    live = []
    for name in names:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            with open(os.path.join(folder, name), encoding="utf-8") as file:
                record = json.load(file)
            if process_start(int(record["pid"])) == record["start"]:
                live.append(record)
    return live
