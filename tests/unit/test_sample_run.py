"""The README's first run, on the sample set `make run` mounts at /data, learns: validation accuracy well above
chance (25 % with four classes) at its last epoch."""

import json
import re
import shlex

from conftest import ROOT, run_train

CHANCE = 0.25


def readme_first_run():
    """The flags of the README's `python train.py --data /data ...` line, --data left out."""
    match = re.search(r"^python train\.py --data /data (.+)$", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert match, "README.md shows no first run on the sample data"
    return shlex.split(match.group(1))


def test_the_readmes_first_run_learns_on_the_sample_data(tmp_path):
    from torchlab.tools import sample_data

    data = tmp_path / "data"
    sample_data.main([str(data)])  # make run's set: the command's defaults
    result = run_train("--data", data, "--run-dir", tmp_path / "run", *readme_first_run(), timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [record for record in records if record.get("kind") == "epoch"][-1]
    assert last["val_accuracy"] >= 3 * CHANCE, last
