"""Jobs report the prompts and tokens they served in `$CARBONSCHED_METRICS_FILE`.

The format: `KEY=VALUE` lines, the last value of each key wins, anything else ignored with a
note in the job's history. The agent reads the file as root when the job ends, so it reads
only the job's own regular file: never a symlink, FIFO or another user's file, and at most
its last MiB.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from policies import get_policy
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.planner import Planner
from scheduler.daemon.service import JobService
from scheduler.node import job_metrics
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.store.models import job_events, jobs

import fleet

ROOT = Caller(uid=0, gid=0)
AS_ROOT = os.geteuid() == 0


# -- the format --------------------------------------------------------------------------

def test_the_last_value_of_each_key_wins_and_comments_and_blank_lines_are_skipped():
    text = "# running totals\nprompts=10\n\noutput_tokens = 5000\nprompts=25\ninput_tokens=1\n"
    assert job_metrics.parse(text) == ({"prompts": 25, "output_tokens": 5000, "input_tokens": 1}, 0, None)


@pytest.mark.parametrize("line", ["tokens=5", "prompts=-1", "prompts=1.5", "prompts=1e6", "prompts",
                                  "prompts=10 apples", f"prompts={10**15 + 1}", "PROMPTS=3", "\x00\xff"])
def test_anything_else_is_ignored_and_counted(line):
    found, ignored, first = job_metrics.parse(f"prompts=7\n{line}\n")
    assert found == {"prompts": 7} and ignored == 1 and first == line.strip()[:60]


def test_reported_figures_become_store_columns_only_when_present():
    work = job_metrics.ReportedWork(prompts=3, output_tokens=900)
    assert work.values() == {"reported_prompts": 3, "reported_output_tokens": 900}


# -- reading it safely -------------------------------------------------------------------

def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_missing_or_empty_file_reports_nothing_and_notes_nothing(tmp_path):
    assert job_metrics.read(tmp_path / "none", os.geteuid()) == job_metrics.ReportedWork()
    assert job_metrics.read(write(tmp_path / "m", ""), os.geteuid()) == job_metrics.ReportedWork()


def test_garbage_lines_are_noted_but_the_good_ones_still_count(tmp_path):
    work = job_metrics.read(write(tmp_path / "m", "prompts=4\nhello\nworld\n"), os.geteuid())
    assert work.prompts == 4
    assert work.note == "metrics file: 2 lines ignored (first: 'hello')"


def test_a_symlink_is_never_followed(tmp_path):
    secret = write(tmp_path / "secret", "prompts=999\n")
    link = tmp_path / "m"
    link.symlink_to(secret)
    work = job_metrics.read(link, os.geteuid())
    assert work.prompts is None and work.note == "metrics file not read: it is a symbolic link"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "m"
    os.mkfifo(fifo)
    started = time.monotonic()
    work = job_metrics.read(fifo, os.geteuid())
    assert time.monotonic() - started < 1.0
    assert work.prompts is None and work.note == "metrics file not read: not a regular file"


@pytest.mark.skipif(not AS_ROOT, reason="only root can give a file to another user")
def test_a_file_owned_by_another_user_is_refused(tmp_path):
    path = write(tmp_path / "m", "prompts=5\n")
    os.chown(path, 12345, 12345)
    work = job_metrics.read(path, owner_uid=4242)
    assert work.prompts is None and work.note == "metrics file not read: owned by uid 12345, not the job's user"
    assert job_metrics.read(path, owner_uid=12345).prompts == 5


def test_a_huge_file_is_read_from_its_end_only(tmp_path):
    head = "prompts=1\n" + "x" * (3 * job_metrics.MAX_READ_BYTES) + "\n"
    work = job_metrics.read(write(tmp_path / "m", head + "prompts=2\noutput_tokens=8\n"), os.geteuid())
    assert (work.prompts, work.output_tokens) == (2, 8)
    assert work.note.startswith("metrics file: only its last 1024 KiB read")


def test_the_file_is_created_empty_for_the_jobs_user_and_an_existing_one_is_kept(tmp_path):
    path = tmp_path / "7.metrics"
    uid, gid = (65534, 65534) if AS_ROOT else (os.geteuid(), os.getegid())
    job_metrics.create(path, uid, gid)
    st = path.stat()
    assert (st.st_size, stat.S_IMODE(st.st_mode), st.st_uid) == (0, 0o600, uid)
    path.write_text("prompts=3\n")
    job_metrics.create(path, uid, gid)
    assert path.read_text() == "prompts=3\n"


# -- end to end: the agent runs the job and stores what it reported ----------------------

@pytest.fixture
def state_dir():
    """A world-traversable state directory, so that a job run as another user reaches its
    metrics file (as on a real node, where the state directory is /var/lib/carbonsched)."""
    path = Path(tempfile.mkdtemp(prefix="cs-metrics-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(store, state_dir):
    agent = fleet.emulated_agent(store, "1xH100", state_dir=state_dir, seed=3, grace_s=1.0, heartbeat_s=0.2)
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=state_dir / "logs")
    yield agent, service, Planner(store, get_policy("fifo"))
    agent.stop()


def run(node, store, caller: Caller, script: str, **body) -> tuple:
    agent, service, planner = node
    job_id = service.submit(caller, {"argv": ["/bin/sh", "-c", script], "gpus": 1, "est_runtime_s": 5,
                                     **body})["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        planner.tick()
        agent.tick()
        with store.read() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
        if row.state in ("COMPLETED", "FAILED"):
            with store.read() as conn:
                last = conn.execute(select(job_events.c.reason).where(job_events.c.job_id == job_id)
                                    .order_by(job_events.c.id.desc()).limit(1)).scalar_one()
            return row, last
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} still {row.state}")


def test_what_a_job_writes_is_stored_beside_what_was_declared(node, store):
    row, last = run(node, store, ROOT, 'echo prompts=10 >> "$CARBONSCHED_METRICS_FILE"; '
                                       'echo "input_tokens=4000" >> "$CARBONSCHED_METRICS_FILE"; '
                                       'echo prompts=12 >> "$CARBONSCHED_METRICS_FILE"; '
                                       'echo output_tokens=3000 >> "$CARBONSCHED_METRICS_FILE"',
                    prompts=100, tokens=20000)
    assert row.state == "COMPLETED" and last == "exit code 0"
    assert (row.reported_prompts, row.reported_input_tokens, row.reported_output_tokens) == (12, 4000, 3000)
    assert (row.prompts, row.tokens) == (100, 20000)  # the declared planning hints stay
    shown = node[1].get_job(ROOT, row.id)
    assert (shown["reported_prompts"], shown["reported_input_tokens"], shown["reported_output_tokens"],
            shown["prompts"], shown["tokens"], shown["prompts_source"]) == (12, 4000, 3000, 100, 20000, "reported")


def test_a_job_that_writes_garbage_still_ends_as_it_ran_with_a_note(node, store):
    row, last = run(node, store, ROOT, 'printf "prompts=3\\nhello\\n" >> "$CARBONSCHED_METRICS_FILE"; exit 4')
    assert row.state == "FAILED" and row.reported_prompts == 3
    assert last == "exit code 4; metrics file: 1 line ignored (first: 'hello')"


def test_a_job_that_reports_nothing_has_no_reported_figures(node, store):
    row, last = run(node, store, ROOT, "true")
    assert (row.reported_prompts, row.reported_input_tokens, row.reported_output_tokens) == (None, None, None)
    assert last == "exit code 0"


@pytest.mark.skipif(not AS_ROOT, reason="runs a job as another user")
def test_a_job_of_another_user_writes_its_own_file_and_cannot_swap_in_another(node, store, state_dir):
    nobody = pwd.getpwnam("nobody")
    secret = state_dir / "secret"
    secret.write_text("prompts=999\n")
    secret.chmod(0o600)
    caller = Caller(uid=nobody.pw_uid, gid=nobody.pw_gid)
    row, _ = run(node, store, caller, 'echo prompts=6 >> "$CARBONSCHED_METRICS_FILE"')
    assert row.state == "COMPLETED" and row.reported_prompts == 6
    row, _ = run(node, store, caller, f'ln -sf {secret} "$CARBONSCHED_METRICS_FILE"; '
                                      f'rm -f "$CARBONSCHED_METRICS_FILE"; cat {secret}; true')
    assert row.state == "COMPLETED" and row.reported_prompts is None


def test_the_metrics_variable_is_carbonscheds_own(node):
    _, service, _ = node
    with pytest.raises(RequestError, match="CARBONSCHED_METRICS_FILE is set by carbonsched"):
        service.submit(ROOT, {"argv": ["true"], "env": {"CARBONSCHED_METRICS_FILE": "/etc/shadow"}})


@pytest.mark.parametrize("tokens", [0, -5, 10**16, "many"])
def test_declared_tokens_are_checked_at_submit(node, tokens):
    _, service, _ = node
    with pytest.raises(RequestError, match="tokens"):
        service.submit(ROOT, {"argv": ["true"], "tokens": tokens})


def test_an_agent_restarted_while_the_job_runs_reads_the_file_when_it_adopts_the_end(node, store, state_dir):
    agent, service, planner = node
    job_id = service.submit(ROOT, {"argv": ["/bin/sh", "-c", 'echo prompts=9 >> "$CARBONSCHED_METRICS_FILE"; '
                                                           'sleep 1.5; echo output_tokens=70 >> '
                                                           '"$CARBONSCHED_METRICS_FILE"'],
                                   "gpus": 1, "est_runtime_s": 5})["id"]
    for _ in range(100):
        planner.tick()
        agent.tick()
        with store.read() as conn:
            if conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one() == "RUNNING":
                break
        time.sleep(0.05)
    agent.stop()  # the agent goes away; the job's supervisor keeps running
    again = Agent(store, agent.backend, AgentConfig(node="n1", zone="DE", state_dir=state_dir, grace_s=1.0,
                                                    heartbeat_s=0.2))
    again.register()
    again.startup_reconcile()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            again.tick()
            with store.read() as conn:
                row = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
            if row.state == "COMPLETED":
                break
            time.sleep(0.05)
    finally:
        again.stop()
    assert row.state == "COMPLETED" and (row.reported_prompts, row.reported_output_tokens) == (9, 70)


# -- the example jobs ----------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def test_the_tiny_example_job_reports_running_totals_that_the_agent_stores(node, store):
    row, last = run(node, store, ROOT, f"{shutil.which('python3') or 'python3'} {EXAMPLES / 'tiny_batch.py'} "
                                       "--prompts 500 --seconds 0.2 --batches 3")
    assert row.state == "COMPLETED" and last == "exit code 0"
    assert row.reported_prompts == 500
    assert row.reported_input_tokens == row.reported_output_tokens and 500 * 4 <= row.reported_input_tokens <= 500 * 20


def test_the_vllm_example_counts_the_tokenizers_tokens(tmp_path, monkeypatch):
    """vLLM itself needs a GPU: a stand-in `vllm` module at the import seam answers like
    `LLM.generate` (RequestOutput.prompt_token_ids, .outputs[0].token_ids / .text)."""
    import importlib.util
    import sys
    import types

    calls = []

    class FakeLLM:
        def __init__(self, **kw):
            calls.append(kw)

        def generate(self, prompts, params):
            return [types.SimpleNamespace(prompt=p, prompt_token_ids=list(range(len(p))),
                                          outputs=[types.SimpleNamespace(token_ids=[1] * params.max_tokens,
                                                                         text=p.upper())])
                    for p in prompts]

    fake = types.ModuleType("vllm")
    fake.LLM = FakeLLM
    fake.SamplingParams = lambda max_tokens, temperature: types.SimpleNamespace(max_tokens=max_tokens)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(f'{{"prompt": "{"x" * n}"}}\n' for n in (3, 5, 7)))
    metrics = tmp_path / "metrics"
    monkeypatch.setenv("CARBONSCHED_METRICS_FILE", str(metrics))
    monkeypatch.setenv("CARBONSCHED_MAX_BATCH", "64")
    spec = importlib.util.spec_from_file_location("vllm_batch", EXAMPLES / "vllm_batch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--model", "m", "--in", str(prompts), "--out", str(tmp_path / "out.jsonl"),
                        "--max-tokens", "4", "--chunk", "2"]) == 0
    assert calls == [{"model": "m", "tensor_parallel_size": 1, "max_num_seqs": 64, "dtype": "bfloat16",
                      "quantization": None}]
    found, ignored, _ = job_metrics.parse(metrics.read_text())
    assert found == {"prompts": 3, "input_tokens": 15, "output_tokens": 12} and ignored == 0
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 3
