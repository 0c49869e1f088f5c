"""Dependency audit of the image's Python env with pip-audit: every known vulnerability must be
one that docs/security.md lists, with the reason its pin stays."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.docker import IMAGE, docker

ROOT = Path(__file__).resolve().parents[2]


def pip_audit(requirements, report, env=None):
    """pip-audit of a requirements file, its JSON report written to `report`: the finished process."""
    audit = [sys.executable, "-m", "pip_audit", "--no-deps", "--disable-pip", "--progress-spinner", "off"]
    audit += ["-r", str(requirements), "-f", "json", "-o", str(report)]
    return subprocess.run(audit, capture_output=True, text=True, timeout=600, check=False, env=env)


def without_report(result):
    """(skip, message) for a pip-audit run that wrote no report: a skip only where no database answered (the
    network), a failure for anything else (our call, pip-audit itself)."""
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    if "SSLError" in last or "ConnectionError" in last:
        return True, f"no vulnerability database answered from here: {last}"
    return False, f"pip-audit wrote no report (exit {result.returncode}): {last}"


def test_a_run_without_a_report_skips_only_where_no_database_answers(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("requests==2.0.0\n")
    no_network = os.environ | {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    unreachable = pip_audit(requirements, tmp_path / "unreachable.json", env=no_network | {"NO_PROXY": ""})
    assert not (tmp_path / "unreachable.json").exists()
    assert without_report(unreachable)[0], unreachable.stderr[-2000:]
    broken = pip_audit(tmp_path / "absent.txt", tmp_path / "broken.json")
    assert not (tmp_path / "broken.json").exists()
    assert without_report(broken) == (False, f"pip-audit wrote no report (exit 2): {broken.stderr.splitlines()[-1]}")


def test_env_has_no_vulnerability_that_the_docs_do_not_list(tmp_path):
    freeze = docker("run", "--rm", "--entrypoint", "pip", IMAGE, "freeze", "--all").stdout
    # Local version labels (+cu124) are not on PyPI's vulnerability records; the release is.
    (tmp_path / "requirements.txt").write_text(re.sub(r"\+\S+$", "", freeze, flags=re.M))
    report = tmp_path / "audit.json"
    result = pip_audit(tmp_path / "requirements.txt", report)
    if not report.exists():
        skip, message = without_report(result)
        (pytest.skip if skip else pytest.fail)(message)
    dependencies = json.loads(report.read_text())["dependencies"]
    audited = [d for d in dependencies if "skip_reason" not in d]
    if not audited:
        pytest.skip(f"no vulnerability database answered from here: {dependencies[0]['skip_reason']}")
    known = ROOT.joinpath("docs", "security.md").read_text()
    unlisted = [
        f"{d['name']} {d['version']}: {v['id']}"
        for d in audited
        for v in d["vulns"]
        if not any(alias in known for alias in [v["id"], *v.get("aliases", [])])
    ]
    found = sum(len(d["vulns"]) for d in audited)
    print(f"\npip-audit: {len(audited)} packages audited, {found} known vulnerabilities")
    assert not unlisted, "vulnerable pins missing from docs/security.md's list: " + "; ".join(unlisted)
