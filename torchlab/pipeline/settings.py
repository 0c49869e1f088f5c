"""Autotune's settings store: what `torchlab autotune` saved, by the flags it holds for.

One small JSON file (--autotune-file, config.AUTOTUNE_FILE by default), keyed by setting_key: the data
folder, image size, batch size, device type and processes on the machine. What it holds for a run's flags
(saved_for) is the loader plan's `tuned` input for --workers auto (one small file: auto stays cheap); autotune
writes it.
"""

import json
import os

from torchlab import io

REQUIRED = ("workers", "prefetch_factor", "jpeg_draft")


def setting_key(data, image_size, batch_size, device, processes_on_machine):
    """What a tuned setting holds for: data folder, image size, batch size, device type, processes."""
    device_type = str(device).split(":")[0]
    return (
        f"{os.path.abspath(data)}|image_size={image_size}|batch_size={batch_size}"
        f"|device={device_type}|processes={processes_on_machine}"
    )


def read_settings(path):
    """Every saved setting by key; {} when the file is missing or unreadable."""
    try:
        with open(os.path.expanduser(path)) as settings_file:
            settings = json.load(settings_file)
    except (OSError, json.JSONDecodeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def saved_setting(path, key):
    """The setting saved for `key` ({"workers", "prefetch_factor", "jpeg_draft", "loader", "decode", "tuned_at",
    ...}), or None (also for path None)."""
    if path is None:
        return None
    setting = read_settings(path).get(key)
    return setting if isinstance(setting, dict) and all(name in setting for name in REQUIRED) else None


def save_setting(path, key, setting):
    """Add or replace `key`'s setting, keeping the others (io.atomic_write)."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    settings = json.dumps({**read_settings(path), key: setting}, indent=2)
    io.atomic_write(path, lambda settings_file: settings_file.write(settings.encode()))


def saved_for(path, data, image_size, batch_size, device, processes_on_machine):
    """The setting saved for these flags, or None (path None: none read)."""
    return saved_setting(path, setting_key(data, image_size, batch_size, device, processes_on_machine))
