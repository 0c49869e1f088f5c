"""torchlab autotune (tools/autotune.py) and the /dev/shm guard: tuned settings saved, read back by --workers auto,
never too big."""

import os

import pytest
import torch

from torchlab import config, machine, resolve
from torchlab.data import decode, splits
from torchlab.pipeline import device_decode, loader, plan, settings
from torchlab.tools import autotune, doctor

MB = 10**6


def fitted(workers, prefetch_factor, one_batch_bytes, free_bytes, processes=1):
    fit = plan.fit_shared_memory(workers, prefetch_factor, one_batch_bytes, free_bytes, processes)
    return (fit.workers, fit.prefetch_factor) if fit.possible else None


def test_in_flight_batches_are_lowered_to_fit_and_one_batch_too_many_fails_with_the_fix():
    batch = loader.batch_bytes(64, 224)  # 9.6 MB
    assert fitted(2, 4, batch, 1000 * MB) == (2, 4)
    assert fitted(2, 4, batch, 64 * MB) == (2, 2)  # (2 x 2 + 2) x 9.6 MB = 58 MB
    assert fitted(4, 1, batch, 40 * MB) == (2, 1)
    # Two processes on the machine share /dev/shm: each gets half.
    assert fitted(2, 4, batch, 128 * MB, processes=2) == (2, 2)
    assert plan.fit_shared_memory(2, 4, batch, 1000 * MB, 2).needed == 2 * (2 * 4 + 2) * batch
    # Any flag value is fitted in one step, however large.
    assert fitted(2, 10**30, batch, 64 * MB) == (2, 2)
    assert fitted(10**30, 10**30, batch, 40 * MB) == (2, 1)
    assert fitted(2, 4, batch, 20 * MB) is None
    assert fitted(0, 4, batch, 0) == (0, 4)  # no workers: nothing in /dev/shm


def test_the_plan_lowers_prefetch_to_a_small_shm_and_the_loader_runs_as_planned(sample_set):
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    dataset = decode.ImageDataset(train_index, image_size=32, train=True, seed=0)
    batch = loader.batch_bytes(8, 32)
    asked = plan.Asked(loader="processes", workers=2, prefetch_factor=4, batch_size=8, persistent_workers=False)

    used = plan.plan(asked, None, machine.Machine(2, (2 * 2 + 2) * batch), plan.Data(batch_bytes={"cpu": batch}))
    assert (used.workers, used.prefetch_factor) == (2, 2) and used.reasons["workers"].startswith("lowered from 2 x 4")
    train_loader = loader.build_loader(dataset, used, torch.device("cpu"), shuffle=True)
    assert (train_loader.num_workers, train_loader.prefetch_factor) == (2, 2)
    assert next(iter(train_loader))[0].shape == (8, 32, 32, 3)  # and it runs

    with pytest.raises(plan.SharedMemoryError, match="/dev/shm has 0 MB free"):
        plan.plan(asked, None, machine.Machine(2, batch), plan.Data(batch_bytes={"cpu": batch}))


def planned(argv, sample_set):
    """The loader plan train.py makes for `argv` on the sample set's training images (on the CPU)."""
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    return resolve.loader_plan(config.parse_args(argv), "cpu", train_index)


def test_autotune_saves_the_fastest_setting_that_fits_and_workers_auto_reads_it(
    sample_set, tmp_path, monkeypatch, capsys, recwarn
):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--run-dir", str(tmp_path / "run"), "--autotune-file", str(settings_file)]
    flags = config.parse_args([*argv, "--autotune-seconds", "1"])
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(machine, "usable_cpu_count", lambda *args: 2)  # candidates: 1, 2 and 3 workers
    monkeypatch.setattr(autotune, "MIN_SECONDS_EACH", 0.01)  # every setting tried within the 1 s
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # what torch's DataLoader counts
    monkeypatch.setattr(machine, "shared_memory_bytes", lambda *args: (64 * MB, (2 * 4 + 2) * batch))
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    key = settings.setting_key(flags.data, flags.image_size, flags.batch_size, "cpu", 1)

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
    later = planned(argv, sample_set)
    assert (later.workers, later.prefetch_factor, later.jpeg_draft, later.decode, later.autotuned) == (
        best["workers"],
        best["prefetch_factor"],
        best["jpeg_draft"],
        best["decode"],
        True,
    )
    explicit = planned([*argv, "--workers", "1"], sample_set)
    assert (explicit.workers, explicit.prefetch_factor, explicit.autotuned) == (
        1,
        plan.DEFAULT_THREAD_BATCHES_AHEAD,
        False,
    )
    assert not planned([*argv, "--batch-size", "16"], sample_set).autotuned
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
    build_loader then uses (or a failure exactly where train.py's plan refuses)."""
    batch = loader.batch_bytes(8, 32)
    monkeypatch.setattr(machine, "usable_cpu_count", lambda *args: cpus)
    monkeypatch.setattr(machine, "shared_memory_bytes", lambda *args: (10**12, free_batches * batch))
    report = doctor.run_checks(
        str(sample_set), batch_size=8, image_size=32, autotune_file=os.devnull, loader="processes"
    )
    row = next(check for check in report if check.name == "shared memory")

    argv = ["--data", str(sample_set), "--autotune-file", os.devnull]
    argv += "--batch-size 8 --image-size 32 --device cpu --loader processes".split()
    try:
        used = planned(argv, sample_set)
    except plan.SharedMemoryError:
        assert row.status == doctor.FAIL
        return
    assert row.status != doctor.FAIL
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    dataset = decode.ImageDataset(train_index, image_size=32, train=True, seed=0)
    train_loader = loader.build_loader(dataset, used, torch.device("cpu"), shuffle=True)
    assert (row.facts["workers"], row.facts["prefetch_factor"]) == (
        train_loader.num_workers,
        train_loader.prefetch_factor,
    )
    assert used.workers == plan.auto_workers(cpus) or used.reasons["workers"].startswith("lowered")


def test_autotune_tries_the_gpu_decoder_only_where_auto_would_pick_it(sample_set):
    _, jpegs, _ = splits.load_splits(str(sample_set), 0.1, 0)
    cuda, cpu = torch.device("cuda:0"), torch.device("cpu")  # only named: nothing runs on them here
    jpeg_data, no_jpegs = device_decode.plan_data(jpegs, 32, 8), device_decode.plan_data([], 32, 8)
    assert autotune.decoders_to_try("auto", cuda, jpeg_data) == ("cpu", "gpu")
    assert autotune.decoders_to_try("auto", cpu, jpeg_data) == ("cpu",)
    assert autotune.decoders_to_try("gpu", cuda, jpeg_data) == ("gpu",)
    assert autotune.decoders_to_try("cpu", cuda, jpeg_data) == ("cpu",)
    assert autotune.decoders_to_try("auto", cuda, no_jpegs) == ("cpu",)


def test_a_setting_saved_before_decoders_were_tuned_still_applies_with_the_cpu_decoder(sample_set, tmp_path):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--device", "cpu", "--run-dir", str(tmp_path / "run")]
    argv += ["--autotune-file", str(settings_file)]
    key = settings.setting_key(str(sample_set), 224, 64, "cpu", 1)
    settings.save_setting(str(settings_file), key, {"workers": 1, "prefetch_factor": 2, "jpeg_draft": False})

    used = planned(argv, sample_set)
    assert (used.workers, used.prefetch_factor, used.jpeg_draft, used.decode, used.autotuned) == (
        1,
        2,
        False,
        "cpu",
        True,
    )


@pytest.mark.parametrize("started", [0.0, 6.0, 9.2])
def test_autotune_shares_what_is_left_of_its_budget_after_the_start(sample_set, tmp_path, monkeypatch, started):
    # Issue 30: --autotune-seconds 10 took 19.5 s. The budget counts from the process's start (`started`: torch's
    # import, indexing), each setting gets at least MIN_SECONDS_EACH, and what cannot fit is left untried.
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--run-dir", str(tmp_path / "run"), "--autotune-file", str(tmp_path / "autotune.json")]
    flags = config.parse_args([*argv, "--autotune-seconds", "10"])
    monkeypatch.setattr(machine, "usable_cpu_count", lambda *args: 2)
    given = []

    def measured(index, image_size, used, device, seconds):
        given.append(seconds)  # what each setting is allowed; the measurement itself is not run
        return float(used.workers)

    monkeypatch.setattr(autotune, "measure_images_per_sec", measured)
    lines = []
    _, train_index, _ = splits.load_splits(str(sample_set), 0.1, 0)
    best = autotune.tune(train_index, flags, torch.device("cpu"), "key", print_line=lines.append, started=started)
    left = 10 * (1 - autotune.BUDGET_RESERVE) - started
    if left < autotune.MIN_SECONDS_EACH:
        assert best is None and given == [] and "nothing saved" in lines[-1]
        return
    assert given and sum(given) <= left + 1e-9 and min(given) >= autotune.MIN_SECONDS_EACH
    candidates = len(autotune.candidate_settings(2, ("cpu",), flags.batch_size, flags.seed))
    assert len(given) == min(candidates, int(left // autotune.MIN_SECONDS_EACH))
    assert any("not tried within --autotune-seconds 10" in line for line in lines) == (len(given) < candidates)


def test_autotune_is_a_command_of_its_own_and_train_has_no_autotune_mode(sample_set, tmp_path, monkeypatch, capsys):
    settings_file = tmp_path / "autotune.json"
    argv = ["--data", str(sample_set), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    argv += ["--autotune-file", str(settings_file), "--autotune-seconds", "2", "--run-dir", str(tmp_path / "run")]
    monkeypatch.setattr(autotune, "process_age_seconds", lambda: 0.0)  # this pytest process is older than 2 s
    monkeypatch.setattr(autotune, "MIN_SECONDS_EACH", 0.2)
    monkeypatch.setattr(machine, "usable_cpu_count", lambda *args: 1)

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
