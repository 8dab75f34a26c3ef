"""No user reads or acts as another (issue 25), end to end: the real daemon as root, its real
socket, real job processes, and throwaway local users alice and bob.

- The SQLite store (every job's argv, environment, cwd and owner) is readable by root alone,
  its -wal and -shm files too, whatever the umask the daemon was started with.
- A job's working directory is entered as the job's owner, never as root: bob cannot read
  alice's files through a job, nor learn which of her paths exist.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from daemon_harness import DaemonProcess, database_for, readable_code_copy, world_dir
from suite_hygiene import make_user, remove_user

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating users and running jobs as them needs root"),
]


@pytest.fixture
def users():
    made = [make_user(), make_user()]
    yield made
    for u in made:
        remove_user(u)


@pytest.fixture
def daemon():
    """A root daemon on SQLite started with umask 000, the worst an operator can give it."""
    root = world_dir("cs-isolation-")
    with database_for("sqlite", root) as url:
        d = DaemonProcess(root, url, umask=0o000)
        d.start()
        try:
            yield d
        finally:
            d.cleanup()


def as_user(user: str, code: str) -> subprocess.CompletedProcess:
    """Run Python code as `user`, with a copy of the packages every user can read importable
    (the CLI needs only the stdlib; the clone itself may be one other users cannot enter)."""
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
    return subprocess.run([shutil.which("runuser") or "runuser", "-u", user, "--", python, "-c", code], capture_output=True,
                          text=True, timeout=60, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(readable_code_copy())})


def submit_as(d: DaemonProcess, user: str, argv: list[str], cwd: str, env: dict | None = None) -> int:
    """Submit through the socket as `user` with a cwd of our choosing (the CLI would send its
    own, which bob cannot even enter here)."""
    body = {"argv": argv, "cwd": cwd, "env": env or {"PATH": "/usr/bin:/bin"}}
    r = as_user(user, "import json, sys; from scheduler.cli.client import Client; "
                      f"print(json.dumps(Client({str(d.socket)!r}).submit(**json.loads(sys.argv[1]))))"
                      .replace("sys.argv[1]", repr(json.dumps(body))))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["id"]


def test_the_store_and_its_wal_and_shm_are_root_only_whatever_the_umask(daemon, users):
    alice, bob = users
    secret = "s3cr3t-" + uuid.uuid4().hex
    r = daemon.cli("submit", "--json", "--env", f"API_TOKEN={secret}", "--", "sh", "-c", "sleep 1",
                   user=alice)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["id"]
    daemon.wait_states([job], timeout_s=30)

    db = daemon.state_dir / "carbonsched.db"
    files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    for f in files:
        assert f.exists(), f
        assert f.stat().st_mode & 0o777 == 0o600, (f, oct(f.stat().st_mode))
        assert f.stat().st_uid == 0

    # bob tries what the attacker did: open the database read-only with SQLite itself.
    r = as_user(bob, "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], uri=True); "
                     "print(c.execute('select env from jobs').fetchall())"
                     .replace("sys.argv[1]", repr(f"file:{db}?mode=ro")))
    assert r.returncode != 0
    assert "unable to open database" in r.stderr
    assert secret not in r.stdout + r.stderr
    for f in files:
        r = as_user(bob, f"open({str(f)!r}, 'rb').read()")
        assert r.returncode != 0 and "Permission denied" in r.stderr, f

    # Job logs and the run records stay private too, though the daemon's umask is 000.
    out = daemon.state_dir / "logs" / f"{job}.out"
    assert out.stat().st_mode & 0o777 == 0o600
    assert (daemon.state_dir / "run").stat().st_mode & 0o777 == 0o700
    assert (daemon.state_dir / "logs").stat().st_mode & 0o777 == 0o711


def test_a_job_enters_its_working_directory_as_its_owner(daemon, users):
    alice, bob = users
    pw = pwd.getpwnam(alice)
    home = daemon.root / f"home-{alice}"
    (home / "proj").mkdir(parents=True)
    (home / "proj" / "notes.txt").write_text("alice's private notes\n")
    for p in (home, home / "proj", home / "proj" / "notes.txt"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    home.chmod(0o700)

    # alice runs in her own private directory as usual, and her job's umask is the usual 022.
    mine = submit_as(daemon, alice, ["sh", "-c", "pwd; cat notes.txt; umask"], str(home / "proj"))
    # bob points his job at alice's directory, at a path there that exists and one that does not.
    stolen = submit_as(daemon, bob, ["sh", "-c", "cat notes.txt"], str(home / "proj"))
    probe_there = submit_as(daemon, bob, ["true"], str(home / "proj"))
    probe_missing = submit_as(daemon, bob, ["true"], str(home / "no-such-dir"))
    jobs = daemon.wait_states([mine, stolen, probe_there, probe_missing], timeout_s=60)

    assert jobs[mine]["state"] == "COMPLETED", jobs[mine]
    out = daemon.cli("logs", str(mine), user=alice).stdout
    assert out.splitlines() == [str(home / "proj"), "alice's private notes", "0022"]

    assert jobs[stolen]["state"] == "FAILED"
    r = daemon.cli("logs", str(stolen), user=bob)
    assert "private notes" not in r.stdout
    err = daemon.cli("logs", str(stolen), "--stderr", user=bob).stdout
    assert "cannot enter working directory" in err and "Permission denied" in err
    assert "private notes" not in err

    # Both probes end alike: bob learns nothing about which of alice's paths exist.
    a, b = jobs[probe_there], jobs[probe_missing]
    assert a["state"] == b["state"] == "FAILED"
    assert a["exit_code"] == b["exit_code"] == 126
    err_a = daemon.cli("logs", str(probe_there), "--stderr", user=bob).stdout
    err_b = daemon.cli("logs", str(probe_missing), "--stderr", user=bob).stdout
    assert err_a.replace("proj", "X") == err_b.replace("no-such-dir", "X")


def test_a_new_store_on_the_same_state_dir_never_gets_the_old_stores_logs(daemon, users):
    """Job ids restart at 1 with a new database: bob's job 1 must not get alice's old `1.out`."""
    alice, bob = users
    r = daemon.cli("submit", "--json", "--", "sh", "-c", "echo alice-output-secret", user=alice)
    old = json.loads(r.stdout)["id"]
    daemon.wait_states([old], timeout_s=30)
    old_log = daemon.state_dir / "logs" / f"{old}.out"
    assert "alice-output-secret" in old_log.read_text()
    daemon.stop()

    daemon.db_url = f"sqlite:///{daemon.state_dir / 'replaced.db'}"  # a new store, ids from 1 again
    daemon.start()
    r = daemon.cli("submit", "--json", "--", "sh", "-c", "echo bob-output", user=bob)
    new = json.loads(r.stdout)["id"]
    assert new == old
    daemon.wait_states([new], timeout_s=30)
    out = daemon.cli("logs", str(new), user=bob)
    assert out.returncode == 0 and out.stdout == "bob-output\n"

    # alice's old output went aside, still hers and root-only, never chowned to bob.
    aside = [p for p in daemon.state_dir.iterdir() if p.name.startswith("previous-store-")]
    assert len(aside) == 1 and aside[0].stat().st_mode & 0o777 == 0o700
    kept = aside[0] / "logs" / f"{old}.out"
    assert kept.read_text() == "alice-output-secret\n"
    assert kept.stat().st_uid == pwd.getpwnam(alice).pw_uid

    # The same store again (a restart): nothing is moved.
    daemon.stop()
    daemon.start()
    assert daemon.cli("logs", str(new), user=bob).stdout == "bob-output\n"
    assert len([p for p in daemon.state_dir.iterdir() if p.name.startswith("previous-store-")]) == 1


def test_a_log_file_of_another_user_is_replaced_not_handed_over(tmp_path, users):
    from scheduler.node.supervise import open_job_log

    alice, bob = (pwd.getpwnam(u) for u in users)
    path = tmp_path / "7.out"
    path.write_text("alice's output\n")
    os.chown(path, alice.pw_uid, alice.pw_gid)
    fd = open_job_log(str(path), bob.pw_uid, bob.pw_gid)
    os.write(fd, b"bob's output\n")
    os.close(fd)
    assert path.read_text() == "bob's output\n"
    assert (path.stat().st_uid, path.stat().st_mode & 0o777) == (bob.pw_uid, 0o600)
    fd = open_job_log(str(path), bob.pw_uid, bob.pw_gid)  # the same user's (a retry): appended
    os.write(fd, b"again\n")
    os.close(fd)
    assert path.read_text() == "bob's output\nagain\n"
    (tmp_path / "8.out").symlink_to(path)
    with pytest.raises(OSError):
        open_job_log(str(tmp_path / "8.out"), alice.pw_uid, alice.pw_gid)
