"""autotune.py and the /dev/shm guard: tuned settings saved, read back by --workers auto, never too big."""

import argparse

import pytest
import torch

import autotune
import cli
import data
import loader

MB = 10**6


def test_in_flight_batches_are_lowered_to_fit_and_one_batch_too_many_fails_with_the_fix():
    batch = loader.batch_bytes(64, 224)  # 9.6 MB
    assert loader.fit_to_shared_memory(2, 4, batch, 1000 * MB) == (2, 4)
    assert loader.fit_to_shared_memory(2, 4, batch, 64 * MB) == (2, 2)  # (2 x 2 + 2) x 9.6 MB = 58 MB
    assert loader.fit_to_shared_memory(4, 1, batch, 40 * MB) == (2, 1)
    # Any flag value is fitted at once (it once took a step per unit of --prefetch-factor).
    assert loader.fit_to_shared_memory(2, 10**30, batch, 64 * MB) == (2, 2)
    assert loader.fit_to_shared_memory(10**30, 10**30, batch, 40 * MB) == (2, 1)
    with pytest.raises(loader.SharedMemoryError, match="--shm-size=8g"):
        loader.fit_to_shared_memory(2, 4, batch, 20 * MB)


def options(workers, prefetch_factor):
    return argparse.Namespace(
        batch_size=8,
        workers=workers,
        prefetch_factor=prefetch_factor,
        persistent_workers=False,
        pin_memory=False,
        seed=0,
    )


def test_the_loader_lowers_its_prefetch_to_a_small_shm_and_says_so(sample_set, monkeypatch, capsys):
    _, train_index, _ = data.load_splits(str(sample_set), 0.1, 0)
    dataset = data.ImageDataset(train_index, image_size=32, train=True, seed=0)
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (64 * MB, (2 * 2 + 2) * batch))

    train_loader = loader.build_loader(dataset, options(2, 4), torch.device("cpu"), train=True)
    assert (train_loader.num_workers, train_loader.prefetch_factor) == (2, 2)
    assert "using 2 workers x 2" in capsys.readouterr().err
    assert next(iter(train_loader))[0].shape == (8, 32, 32, 3)  # and it runs

    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (64 * MB, batch))
    with pytest.raises(loader.SharedMemoryError, match="/dev/shm has 0 MB free"):
        loader.build_loader(dataset, options(2, 4), torch.device("cpu"), train=True)


def test_autotune_saves_the_fastest_setting_that_fits_and_workers_auto_reads_it(
    sample_set, tmp_path, monkeypatch, capsys
):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--run-dir", str(tmp_path / "run"), "--autotune-file", str(settings_file)]
    args = cli.parse_args([*argv, "--autotune", "--autotune-seconds", "1"])
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(loader, "usable_cpu_count", lambda: 2)  # candidates: 1, 2 and 3 workers
    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (64 * MB, (2 * 4 + 2) * batch))
    _, train_index, _ = data.load_splits(str(sample_set), 0.1, 0)
    dataset = data.ImageDataset(train_index, image_size=32, train=True, seed=0)
    key = autotune.setting_key(args, cli.distributed.processes_from_environment())

    best = autotune.tune(dataset, args, torch.device("cpu"), key)

    table = capsys.readouterr().out
    assert "3        8     on  skipped: /dev/shm too small" in table
    assert best["workers"] * best["prefetch_factor"] <= 2 * 4
    saved = autotune.saved_setting(str(settings_file), key)
    assert {name: saved[name] for name in best} == best
    later = cli.parse_args(argv)
    assert (later.workers, later.prefetch_factor, later.jpeg_draft, later.autotuned) == (
        best["workers"],
        best["prefetch_factor"],
        best["jpeg_draft"],
        True,
    )
    explicit = cli.parse_args([*argv, "--workers", "1"])
    assert (explicit.workers, explicit.prefetch_factor, explicit.autotuned) == (1, cli.DEFAULT_PREFETCH_FACTOR, False)
    other_batch = cli.parse_args([*argv, "--batch-size", "16"])
    assert not other_batch.autotuned
