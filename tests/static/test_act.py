"""`make ci-act` (.ci/act): act is given the actions the workflows pin, read from their `uses:` lines, and each
workflow as the real file less the named deviations of this machine (buildtools/act_workflow.py), so that the
proof under act runs what GitHub runs and cannot drift from it."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildtools import act_workflow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
PATHS = {"plugins": "/stand-in/plugins", "node": "/stand-in/node", "ca": "/stand-in/ca.crt"}


def uses_lines():
    return {
        tuple(action.split("@"))
        for path in WORKFLOWS
        for action in re.findall(r"^\s*(?:- )?uses: (\S+)", path.read_text(), flags=re.M)
    }


def test_act_is_given_every_action_the_workflows_pin():
    mapped = act_workflow.pinned_actions(path.read_text() for path in WORKFLOWS)
    assert set(mapped) == uses_lines() and len(mapped) >= 5
    script = (ROOT / ".ci/act").read_text()
    assert "buildtools/act_workflow.py actions .github/workflows/*.yml" in script
    assert '--local-repository "$repo@$commit=$dir"' in script
    assert "bash .ci/act ci" in (ROOT / "Makefile").read_text()


def test_an_action_added_or_left_unpinned_is_caught():
    text = (ROOT / ".github/workflows/ci.yml").read_text()
    added = text.replace("    steps:\n", "    steps:\n      - uses: owner/new@" + "a" * 40 + "\n", 1)
    assert ("owner/new", "a" * 40) in act_workflow.pinned_actions([added])
    with pytest.raises(act_workflow.Unusable, match="owner/new@v1 is not OWNER/REPO@COMMIT"):
        act_workflow.pinned_actions([text.replace("    steps:\n", "    steps:\n      - uses: owner/new@v1\n", 1)])


def differences(real, here, where=""):
    """The paths at which two parsed workflows differ."""
    if isinstance(real, dict) and isinstance(here, dict):
        keys = set(real) | set(here)
        return [d for key in sorted(keys, key=str) for d in differences(real.get(key), here.get(key), f"{where}/{key}")]
    return [] if real == here else [where]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_act_runs_each_workflow_as_written_but_for_the_named_deviations(path):
    real = yaml.safe_load(path.read_text())
    here = act_workflow.for_this_machine(real, PATHS)
    assert here["on"] == real[True]
    changed = differences({("on" if key is True else key): value for key, value in real.items()}, here)
    jobs = real["jobs"]
    containers = [name for name, job in jobs.items() if "container" in job]
    builders = [n for n, job in jobs.items() if any("TORCHLAB_BUILDER" in (s.get("env") or {}) for s in job["steps"])]
    named = [name for name, job in jobs.items() if "FLAVOUR" in job.get("env", {})]
    expected = {f"/jobs/{n}/container/{k}" for n in containers for k in ("image", "options", "volumes")}
    expected |= {f"/jobs/{n}/steps" for n in builders} | {f"/jobs/{n}/env/IMAGE" for n in named}
    assert set(changed) == expected
    assert expected  # each workflow has a job container, a builder or an image to rename
    for name in named:
        assert here["jobs"][name]["env"]["IMAGE"] == "torchlab-act-${{ matrix.flavour }}"
    for name in builders:
        for real_step, step in zip(real["jobs"][name]["steps"], here["jobs"][name]["steps"], strict=True):
            if real_step != step:
                assert real_step == {**step, "env": real_step["env"]}
                assert step["env"] == {
                    **{k: v for k, v in real_step["env"].items() if k != "TORCHLAB_BUILDER"},
                    "TORCHLAB_BUILD_FLAGS": "--provenance=false",
                }
    for name in containers:
        volumes = here["jobs"][name]["container"]["volumes"]
        real_volumes = real["jobs"][name]["container"]["volumes"]
        assert volumes[: len(real_volumes)] == [
            v.replace(act_workflow.MOUNTS["plugins"] + ":", PATHS["plugins"] + ":") for v in real_volumes
        ]
        assert volumes[len(real_volumes) :] == [f"{PATHS[k]}:{act_workflow.MOUNTS[k]}:ro" for k in act_workflow.EXTRA]


def test_a_job_container_the_deviations_do_not_describe_stops_the_proof():
    ci = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    drifted = copy.deepcopy(ci)
    drifted["jobs"]["test"]["container"]["image"] = "debian:13"
    with pytest.raises(act_workflow.Unusable, match="job test: container image is 'debian:13', not 'debian:12'"):
        act_workflow.for_this_machine(drifted, PATHS)
    result = subprocess.run(
        [
            sys.executable,
            ROOT / "buildtools/act_workflow.py",
            "rewrite",
            ROOT / ".github/workflows/ci.yml",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stderr) == (2, "act_workflow: give plugins=PATH node=PATH ca=PATH\n")


def test_the_workflow_act_is_given_is_one_act_can_read(tmp_path):
    out = tmp_path / "ci.yml"
    args = [f"{key}={value}" for key, value in PATHS.items()]
    command = [sys.executable, ROOT / "buildtools/act_workflow.py", "rewrite", ROOT / ".github/workflows/ci.yml", out]
    subprocess.run([*command, *args], check=True)
    assert re.search(r"^'on':$", out.read_text(), flags=re.M)  # a string key, as act (YAML 1.2) reads `on`
    assert (
        yaml.safe_load(out.read_text())["jobs"]["test"]["container"]["options"]
        == act_workflow.PRIVILEGED_BUT_SYS_RESOURCE
    )


def test_the_release_here_ends_at_its_push_into_the_local_registry():
    release = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    here = act_workflow.for_this_machine(release, PATHS, registry="localhost:5000")["jobs"]["release"]
    real_steps = release["jobs"]["release"]["steps"]
    kept = [
        s for s in real_steps if s.get("name") not in act_workflow.LEFT_OUT and "login-action" not in s.get("uses", "")
    ]
    push = next(i for i, s in enumerate(kept) if s.get("id") == "push")
    assert here["steps"][:push] == kept[:push] and len(here["steps"]) == push + 1
    assert here["steps"][push]["run"] == kept[push]["run"].replace("registry=ghcr.io/", "registry=localhost:5000/")
    assert here["env"]["TORCHLAB_BUILD_FLAGS"] == "--provenance=false"
    assert [s.get("id") for s in here["steps"]] == [None, "tag", None, "lock", "push"]
    assert act_workflow.for_this_machine(release, PATHS)["jobs"]["release"]["steps"] == real_steps


def test_a_release_step_renamed_stops_the_proof():
    release = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    scan = next(s for s in release["jobs"]["release"]["steps"] if "trivy" in s.get("run", ""))
    scan["name"] = "Scan"
    with pytest.raises(act_workflow.Unusable, match="job release: no step named 'Vulnerability scan"):
        act_workflow.for_this_machine(release, PATHS, registry="localhost:5000")


def test_the_runners_stand_in_gets_its_plugins_and_the_machines_mounts():
    assert act_workflow.container_options(PATHS) == (
        "-v /stand-in/plugins:/usr/libexec/docker/cli-plugins:ro -v /stand-in/node:/usr/local/bin/node:ro "
        "-v /stand-in/ca.crt:/usr/local/share/ca-certificates/torchlab-act-machine.crt:ro"
    )
