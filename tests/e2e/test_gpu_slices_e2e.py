"""End to end (the real daemon, its socket, its local agent and an emulated partitioned fleet):
`submit --mig` and `--gpu-fraction` refused with one line and exit 2 when no GPU offers such
a slice, and a job on a slice seeing only its own device; `nodes` showing the instances."""

from __future__ import annotations

import json

import pytest

from daemon_harness import DB_KINDS, DaemonProcess, database_for, world_dir

pytestmark = pytest.mark.slow

JOB = 'echo "${CUDA_VISIBLE_DEVICES:-} ${ROCR_VISIBLE_DEVICES:-}" > "$1"'
FLEET = "1xH100:mig=3g.40gb+1g.10gb*4,1xMI300X:partition=QPX"


@pytest.fixture(params=DB_KINDS)
def daemon(request):
    root = world_dir("cs-slices-")
    with database_for(request.param, root) as url:
        d = DaemonProcess(root, url, emulate=FLEET)
        (root / "job.sh").write_text(JOB)
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


def test_slices_are_refused_when_none_fits_and_a_job_sees_only_its_own(daemon):
    for args, needle in ((["--mig", "2g.20gb"], "no GPU of the fleet offers a 2g.20gb MIG instance"),
                         (["--gpu-fraction", "0.6"], "no GPU of the fleet offers 0.6 of a GPU"),
                         (["--gpu-fraction", "1.5"], "below 1"),
                         (["--mig", "big"], "not a MIG profile name")):
        r = daemon.cli("submit", *args, "--", "true")
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert daemon.client().jobs(include_done=True) == []

    mig_out, frac_out = daemon.root / "mig.txt", daemon.root / "frac.txt"
    ids = []
    for args, out in ((["--mig", "1g.10gb"], mig_out), (["--gpu-fraction", "0.25"], frac_out)):
        r = daemon.cli("submit", "--json", *args, "--", "sh", str(daemon.root / "job.sh"), str(out))
        assert r.returncode == 0, r.stderr
        ids.append(json.loads(r.stdout)["id"])
    done = daemon.wait_states(ids, timeout_s=90)
    assert [done[i]["state"] for i in ids] == ["COMPLETED", "COMPLETED"], done
    shown = json.loads(daemon.cli("show", str(ids[0]), "--json").stdout)
    assert shown["mig_profile"] == "1g.10gb" and shown["gpu_instance"].startswith("MIG-")
    assert mig_out.read_text().split() == [shown["gpu_instance"]]  # that MIG device, and no AMD one
    # 0.25 fits a QPX partition (a quarter of an MI300X) better than the 3g.40gb instance
    assert frac_out.read_text().split() == ["0", "0"]
    nodes = json.loads(daemon.cli("nodes", "--json").stdout)
    gpus = [g for n in nodes for g in n["gpus"]]
    h100 = next(g for g in gpus if g["vendor"] == "nvidia")
    assert h100["mig_enabled"] and [i["profile"] for i in h100["instances"]] == ["3g.40gb"] + ["1g.10gb"] * 4
    assert shown["gpu_instance"] in {i["uuid"] for i in h100["instances"]}
    assert [g["partition_mode"] for g in gpus if g["vendor"] == "amd"] == ["QPX"] * 4
    text = daemon.cli("nodes").stdout
    assert "MIG 1g.10gb" in text and "H100 (MIG)" in text and "MI300X (QPX 1/4)" in text
