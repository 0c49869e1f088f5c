"""torchlab autotune (tools/autotune.py) and the /dev/shm guard: tuned settings saved, read back by --workers auto,
never too big."""

import os

import pytest
import torch

from torchlab import config, distributed, resolve
from torchlab.data import decode, splits
from torchlab.pipeline import loader, settings
from torchlab.tools import autotune, doctor

MB = 10**6


def fitted(workers, prefetch_factor, one_batch_bytes, free_bytes, processes=1):
    fit = loader.fit_shared_memory(workers, prefetch_factor, one_batch_bytes, free_bytes, processes)
    return (fit.workers, fit.prefetch_factor) if fit.possible else None


def test_in_flight_batches_are_lowered_to_fit_and_one_batch_too_many_fails_with_the_fix():
    batch = loader.batch_bytes(64, 224)  # 9.6 MB
    assert fitted(2, 4, batch, 1000 * MB) == (2, 4)
    assert fitted(2, 4, batch, 64 * MB) == (2, 2)  # (2 x 2 + 2) x 9.6 MB = 58 MB
    assert fitted(4, 1, batch, 40 * MB) == (2, 1)
    # Two processes on the machine share /dev/shm: each gets half.
    assert fitted(2, 4, batch, 128 * MB, processes=2) == (2, 2)
    assert loader.fit_shared_memory(2, 4, batch, 1000 * MB, 2).needed == 2 * (2 * 4 + 2) * batch
    # Any flag value is fitted in one step, however large.
    assert fitted(2, 10**30, batch, 64 * MB) == (2, 2)
    assert fitted(10**30, 10**30, batch, 40 * MB) == (2, 1)
    assert fitted(2, 4, batch, 20 * MB) is None
    assert fitted(0, 4, batch, 0) == (0, 4)  # no workers: nothing in /dev/shm


def options(workers, prefetch_factor):
    return loader.LoaderSettings(
        batch_size=8, workers=workers, prefetch_factor=prefetch_factor, persistent_workers=False, pin_memory=False
    )


def test_the_loader_lowers_its_prefetch_to_a_small_shm_and_says_so(sample_set, monkeypatch, capsys):
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    dataset = decode.ImageDataset(train_index, image_size=32, train=True, seed=0)
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (64 * MB, (2 * 2 + 2) * batch))

    train_loader = loader.build_loader(dataset, options(2, 4), torch.device("cpu"), train=True)
    assert (train_loader.num_workers, train_loader.prefetch_factor) == (2, 2)
    assert "using 2 workers x 2" in capsys.readouterr().err
    assert next(iter(train_loader))[0].shape == (8, 32, 32, 3)  # and it runs

    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (64 * MB, batch))
    with pytest.raises(loader.SharedMemoryError, match="/dev/shm has 0 MB free"):
        loader.build_loader(dataset, options(2, 4), torch.device("cpu"), train=True)


def resolved(argv, tuning=False):
    return resolve.resolve(config.parse_args(argv), distributed.processes_from_environment(), tuning)


def test_autotune_saves_the_fastest_setting_that_fits_and_workers_auto_reads_it(
    sample_set, tmp_path, monkeypatch, capsys, recwarn
):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--run-dir", str(tmp_path / "run"), "--autotune-file", str(settings_file)]
    flags = resolved([*argv, "--autotune-seconds", "1"], tuning=True)
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(loader, "usable_cpu_count", lambda *args: 2)  # candidates: 1, 2 and 3 workers
    monkeypatch.setattr(autotune, "MIN_SECONDS_EACH", 0.01)  # every setting tried within the 1 s
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # what torch's DataLoader counts
    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (64 * MB, (2 * 4 + 2) * batch))
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    key = settings.setting_key(flags.data, flags.image_size, flags.batch_size, flags.device, 1)

    best = autotune.tune(train_index, flags, torch.device("cpu"), key)

    # 3 workers on 2 CPUs, timed on purpose: torch's warning about it would cut into the table.
    assert [str(warning.message) for warning in recwarn if "will create" in str(warning.message)] == []
    table = capsys.readouterr().out
    assert "    cpu processes        3        8     on  skipped: /dev/shm too small" in table
    assert "    cpu   threads        3        8     on " in table  # threads need no /dev/shm
    assert best["decode"] == "cpu" and "    gpu " not in table  # no CUDA: only the CPU decoder is tried
    assert best["loader"] == "threads" or best["workers"] * best["prefetch_factor"] <= 2 * 4
    saved = settings.saved_setting(str(settings_file), key)
    assert {name: saved[name] for name in best} == best
    later = resolved(argv)
    assert (later.workers, later.prefetch_factor, later.jpeg_draft, later.decode, later.autotuned) == (
        best["workers"],
        best["prefetch_factor"],
        best["jpeg_draft"],
        best["decode"],
        True,
    )
    explicit = resolved([*argv, "--workers", "1"])
    assert (explicit.workers, explicit.prefetch_factor, explicit.autotuned) == (
        1,
        config.DEFAULT_THREAD_BATCHES_AHEAD,
        False,
    )
    assert not resolved([*argv, "--batch-size", "16"]).autotuned
    # The doctor resolves --workers auto the same way, saved setting included.
    report = doctor.run_checks(str(sample_set), batch_size=8, image_size=32, autotune_file=str(settings_file))
    if best["loader"] == "processes":
        shm = next(check for check in report if check.name == "shared memory")
        assert (shm.facts["workers"], shm.facts["prefetch_factor"]) == (best["workers"], best["prefetch_factor"])
    # The saved workers are shown as autotuned, not flagged, even where there are more than CPUs (issue 30).
    cpus = next(check for check in report if check.name == "cpus")
    assert cpus.status == doctor.OK and cpus.facts["autotuned"], cpus
    assert f"autotuned: {best['workers']} " in cpus.detail and "for these flags" in cpus.detail


@pytest.mark.parametrize("cpus", [1, 2, 6, 32])
@pytest.mark.parametrize("free_batches", [0, 3, 7, 12, 40, 1000])
def test_the_doctors_shared_memory_row_agrees_with_the_loader(sample_set, monkeypatch, cpus, free_batches):
    """For /dev/shm sizes and CPU counts, the doctor reports the workers and prefetch factor that
    build_loader then uses (or a failure exactly where build_loader refuses)."""
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(loader, "usable_cpu_count", lambda *args: cpus)
    monkeypatch.setattr(loader, "shared_memory_bytes", lambda: (10**12, free_batches * batch))
    report = doctor.run_checks(
        str(sample_set), batch_size=8, image_size=32, autotune_file=os.devnull, backend="processes"
    )
    row = next(check for check in report if check.name == "shared memory")

    argv = ["--data", str(sample_set), "--autotune-file", os.devnull]
    flags = resolved([*argv, *"--batch-size 8 --image-size 32 --device cpu --loader processes".split()])
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    dataset = decode.ImageDataset(train_index, image_size=32, train=True, seed=0)
    assert row.facts["workers"] == flags.workers == min(loader.MAX_AUTO_WORKERS, cpus)
    try:
        train_loader = loader.build_loader(dataset, resolve.loader_settings(flags), torch.device("cpu"), train=True)
    except loader.SharedMemoryError:
        assert row.status == doctor.FAIL
        return
    assert row.status != doctor.FAIL
    assert (row.facts["loader_workers"], row.facts["loader_prefetch_factor"]) == (
        train_loader.num_workers,
        train_loader.prefetch_factor,
    )


def test_autotune_tries_the_gpu_decoder_only_where_auto_would_pick_it(sample_set):
    _, jpegs, _ = splits.load_splits(str(sample_set), 0.1, 0)
    cuda, cpu = torch.device("cuda:0"), torch.device("cpu")  # only named: nothing runs on them here
    assert autotune.decoders_to_try("auto", cuda, jpegs) == ("cpu", "gpu")
    assert autotune.decoders_to_try("auto", cpu, jpegs) == ("cpu",)
    assert autotune.decoders_to_try("gpu", cuda, jpegs) == ("gpu",)
    assert autotune.decoders_to_try("cpu", cuda, jpegs) == ("cpu",)
    assert autotune.decoders_to_try("auto", cuda, []) == ("cpu",)  # no JPEGs


def test_a_setting_saved_before_decoders_were_tuned_still_applies_with_the_cpu_decoder(sample_set, tmp_path):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--device", "cpu", "--run-dir", str(tmp_path / "run")]
    argv += ["--autotune-file", str(settings_file)]
    key = settings.setting_key(str(sample_set), 224, 64, "cpu", 1)
    settings.save_setting(str(settings_file), key, {"workers": 1, "prefetch_factor": 2, "jpeg_draft": False})

    cfg = resolved(argv)
    assert (cfg.workers, cfg.prefetch_factor, cfg.jpeg_draft, cfg.decode, cfg.autotuned) == (1, 2, False, "cpu", True)


@pytest.mark.parametrize("started", [0.0, 6.0, 9.2])
def test_autotune_shares_what_is_left_of_its_budget_after_the_start(sample_set, tmp_path, monkeypatch, started):
    # Issue 30: --autotune-seconds 10 took 19.5 s. The budget counts from the process's start (`started`: torch's
    # import, indexing), each setting gets at least MIN_SECONDS_EACH, and what cannot fit is left untried.
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--run-dir", str(tmp_path / "run"), "--autotune-file", str(tmp_path / "autotune.json")]
    flags = resolved([*argv, "--autotune-seconds", "10"], tuning=True)
    monkeypatch.setattr(loader, "usable_cpu_count", lambda *args: 2)
    given = []

    def measured(dataset, decoder, settings, device, seconds):
        given.append(seconds)  # what each setting is allowed; the measurement itself is not run
        return float(settings.workers)

    monkeypatch.setattr(autotune, "measure_images_per_sec", measured)
    lines = []
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    best = autotune.tune(train_index, flags, torch.device("cpu"), "key", print_line=lines.append, started=started)
    left = 10 * (1 - autotune.BUDGET_RESERVE) - started
    if left < autotune.MIN_SECONDS_EACH:
        assert best is None and given == [] and "nothing saved" in lines[-1]
        return
    assert given and sum(given) <= left + 1e-9 and min(given) >= autotune.MIN_SECONDS_EACH
    candidates = len(autotune.candidate_settings(2, ("cpu",)))
    assert len(given) == min(candidates, int(left // autotune.MIN_SECONDS_EACH))
    assert any("not tried within --autotune-seconds 10" in line for line in lines) == (len(given) < candidates)


def test_autotune_is_a_command_of_its_own_and_train_has_no_autotune_mode(sample_set, tmp_path, monkeypatch, capsys):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--autotune-file", str(settings_file), "--autotune-seconds", "2", "--run-dir", str(tmp_path / "run")]
    monkeypatch.setattr(autotune, "process_age_seconds", lambda: 0.0)  # this pytest process is older than 2 s
    monkeypatch.setattr(autotune, "MIN_SECONDS_EACH", 0.2)
    monkeypatch.setattr(loader, "usable_cpu_count", lambda *args: 1)

    autotune.main(argv, prog="torchlab autotune")

    assert "autotune: best --decode cpu" in capsys.readouterr().out
    key = settings.setting_key(str(sample_set), 32, 8, "cpu", 1)
    assert settings.saved_setting(str(settings_file), key)["decode"] == "cpu"
    assert not (tmp_path / "run").exists()  # autotune writes no run
    with pytest.raises(SystemExit) as exit_info:
        autotune.main([*argv, "--data", str(tmp_path / "absent")], prog="torchlab autotune")
    assert exit_info.value.code == 2 and capsys.readouterr().err.startswith("torchlab autotune: error: ")
    with pytest.raises(SystemExit) as exit_info:
        config.parse_args(["--autotune"])
    assert exit_info.value.code == 2 and "ambiguous option: --autotune could match" in capsys.readouterr().err
