"""What every command shares about files and bad input: atomic writes of a file and of a folder, and bad input
as one line and exit 2.

atomic_write writes to a hidden temporary file in the same folder, flushes and fsyncs it, renames it over its
final name (os.replace: atomic on POSIX) and fsyncs the folder, so that the rename survives a power cut. A
crash leaves at most a stale temporary file (.NAME.PID.tmp), which remove_stale_temp_files deletes.
publish_folder does the same for a generated folder (sample data, benchmark data): built beside its final
name (or inside it, where it is an empty folder already), marked complete, renamed into place.
"""

import contextlib
import errno
import json
import os
import re
import shutil
import sys
import tempfile

USAGE_ERROR_STATUS = 2  # argparse's convention for bad input
TEMP_NAME = re.compile(r"\..+[.-]\d+\.tmp")  # .NAME.PID.tmp, and .NAME-PID.tmp (.checkpoint-PID.tmp)
# Written last into a folder that publish_folder makes; hidden, so never taken for a class of an ImageFolder.
COMPLETE_MARKER = ".sample-data.json"


def exit_with_error(prog, message, status=USAGE_ERROR_STATUS):
    """One line on stderr, "PROG: error: MESSAGE", and exit. Control characters in what the user typed (a
    newline, say) are shown escaped, so the line stays one line."""
    message = "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(message))
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(status)


def nearest_existing(path):
    """`path` made absolute, or its nearest parent that exists."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return existing


def unwritable_reason(path):
    """Why this user could not make the folder `path` or write in it (None where it could), found without
    creating anything: `path`, or its nearest existing parent, must be a folder this user may write in."""
    existing = nearest_existing(path)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):  # also false on a read-only mount
        return f"{existing} is not a folder that UID {os.getuid()} can write in"
    return None


def writable_folder(prog, path, label):
    """Make the folder `path` before a command's work starts; where this user cannot (unwritable_reason), one line
    that begins with `label` (the flag and its value, say) and exit 2. Returns path."""
    reason = unwritable_reason(path)
    if reason is not None:
        exit_with_error(prog, f"{label}: {reason}")
    os.makedirs(path, exist_ok=True)
    return path


def fsync_directory(path):
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write(path, write):
    """write(binary file) into `path` so that `path` holds either the old file or the whole new one."""
    directory = os.path.dirname(path) or "."
    temp_path = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(temp_path, "wb") as temp_file:
            write(temp_file)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
    fsync_directory(directory)


def write_report(out_dir, name, report, lines, print_line, beside=()):
    """A benchmark's report as OUT_DIR/NAME (JSON; the folder made when missing), written atomically; then its
    `lines` printed, and where it went, with the files `beside` it (a plot). Returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    text = json.dumps(report, indent=2).encode()
    atomic_write(path, lambda report_file: report_file.write(text))
    for line in lines:
        print_line(line)
    print_line(f"wrote {' and '.join([path, *beside])}")
    return path


def remove_stale_temp_files(directory):
    """Delete what an interrupted atomic_write left in `directory`."""
    for name in os.listdir(directory):
        if TEMP_NAME.fullmatch(name):
            os.unlink(os.path.join(directory, name))


def publish_folder(out_dir, write_into, settings):
    """Run write_into(folder) on a hidden folder, mark it complete, and move it to `out_dir`: renamed into place
    beside it, or, where `out_dir` is an existing empty folder (a mount point, whose parent may be read-only and
    which no rename can replace), made inside it and its entries renamed up, the marker last.

    Returns False, writing nothing, when `out_dir` is already a complete set (of any settings).
    """
    if os.path.exists(os.path.join(out_dir, COMPLETE_MARKER)):
        return False
    in_place = os.path.isdir(out_dir)
    if in_place and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not a generated data set: not overwriting it")
    parent = out_dir if in_place else os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    temp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.", dir=parent)
    try:
        os.chmod(temp_dir, 0o755)  # mkdtemp makes it private; a data set is for everyone to read
        write_into(temp_dir)
        with open(os.path.join(temp_dir, COMPLETE_MARKER), "w") as marker:
            json.dump(settings, marker)
        if not in_place:
            os.rename(temp_dir, out_dir)  # atomic
            return True
        for name in sorted(os.listdir(temp_dir), key=lambda name: name == COMPLETE_MARKER):
            os.rename(os.path.join(temp_dir, name), os.path.join(out_dir, name))
        os.rmdir(temp_dir)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return True


def report_published(prog, out_dir, write, size):
    """Run write() (which publishes out_dir atomically) and say what it did; a clash, a file where the folder
    would go, or a parent folder this user cannot write in, is one line and exit 2, before write() starts. So is
    a set larger than the space free there: `size` is (its bytes, roughly; what they are, for the message). A
    disk that fills up all the same is one line and exit 1, with nothing of the set left behind."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        exit_with_error(prog, unwritable_reason(out_dir))
    if not os.path.exists(os.path.join(out_dir, COMPLETE_MARKER)):
        # Where publish_folder writes: in an existing folder, else beside it.
        folder = out_dir if os.path.isdir(out_dir) else os.path.dirname(os.path.abspath(out_dir))
        writable_folder(prog, folder, out_dir)
        free = shutil.disk_usage(folder).free
        if size[0] > free:
            exit_with_error(
                prog,
                f"{size[1]}: about {size[0] / 1e6:,.0f} MB, more than the {free / 1e6:,.0f} MB free in {folder}; "
                "expected a smaller set",
            )
    try:
        written = write()
    except FileExistsError as error:
        exit_with_error(prog, error)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        full = f"{out_dir}: no space left on its device while writing it; nothing of it was kept"
        exit_with_error(prog, full, status=1)
    print(f"{'wrote' if written else 'already complete:'} {out_dir}")
