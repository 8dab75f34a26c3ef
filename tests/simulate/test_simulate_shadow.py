"""Shadow mode: `carbonsched simulate --from-store` replays the store's own history, read-only."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select

from scheduler.carbon import CarbonSignals
from scheduler.cli.main import main
from scheduler.simulate.scenario import demo_dir
from scheduler.store import Store
from scheduler.store.carbon_models import carbon_intensity
from scheduler.store.models import gpus, job_events, jobs, nodes

DEMO = demo_dir()
T0 = datetime(2022, 10, 19, 16, tzinfo=timezone.utc)


def _dump(store: Store) -> dict:
    with store.read() as conn:
        return {t.name: sorted(map(tuple, conn.execute(select(t)).all()), key=repr)
                for t in (jobs, gpus, nodes, job_events, carbon_intensity)}


@pytest.fixture
def history(tmp_path):
    """A store with two nodes, recorded carbon of their zones and a few days of finished jobs."""
    store = Store(f"sqlite:///{tmp_path / 'cs.db'}")
    store.upgrade()
    signals = CarbonSignals(store)
    signals.writes.import_file(DEMO / "GB.csv", zone="GB")
    signals.writes.import_file(DEMO / "DE-LU.csv", zone="DE")
    with store.write() as conn:
        for name, zone in (("gb-1", "GB"), ("de-1", "DE")):
            conn.execute(insert(nodes).values(name=name, zone=zone, backend="emulated", emulated=True,
                                              registered_at=T0 - timedelta(days=30)))
        ids = {}
        for name, model, vendor, mem in (("gb-1", "H100", "nvidia", 80.0), ("de-1", "MI300X", "amd", 192.0)):
            for i in range(4):
                res = conn.execute(insert(gpus).values(node_name=name, index=i, uuid=f"{name}-{i}", model=model,
                                                       vendor=vendor, memory_gib=mem))
                ids.setdefault(name, []).append(res.inserted_primary_key[0])
        measured = {}
        for k in range(12):
            node = "gb-1" if k % 2 else "de-1"
            submitted = T0 + timedelta(hours=3 * k)
            started = submitted + timedelta(minutes=5)
            runtime = timedelta(minutes=40 + 10 * k)
            state = "COMPLETED" if k != 5 else "FAILED"
            res = conn.execute(insert(jobs).values(
                name=f"job{k}", state=state, owner_uid=1000, owner_gid=1000, owner_groups=[], owner_name="u",
                argv=["true"], cwd="/", env={}, gpus=1 + k % 2, gpu_mem_gib=0.0, submitted_at=submitted,
                deadline=submitted + timedelta(hours=20), est_runtime_s=3600.0, started_at=started,
                ended_at=started + runtime, node=node, gpu_ids=ids[node][: 1 + k % 2], energy_j=1.0))
            measured[res.inserted_primary_key[0]] = (runtime.total_seconds(), state, node)
        # one job long before --since: not replayed
        conn.execute(insert(jobs).values(
            name="old", state="COMPLETED", owner_uid=1000, owner_gid=1000, owner_groups=[], owner_name="u",
            argv=["true"], cwd="/", env={}, gpus=1, submitted_at=T0 - timedelta(days=5),
            started_at=T0 - timedelta(days=5), ended_at=T0 - timedelta(days=5, hours=-1), gpu_ids=ids["gb-1"][:1]))
    yield store, measured
    store.dispose()


def test_shadow_mode_replays_completed_jobs_and_leaves_the_store_untouched(history, tmp_path, capsys):
    store, measured = history
    before = _dump(store)
    out = tmp_path / "shadow"
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--from-store", "--db", store.url, "--since", "2022-10-19T12:00Z",
              "--until", "2022-10-22T00:00Z", "--policy", "fifo,greedy", "--json", "--out", str(out)])
    assert e.value.code == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    completed = {i: m for i, m in measured.items() if m[1] == "COMPLETED"}
    assert doc["policies"]["fifo"]["jobs"] == len(completed) == 11
    assert doc["scenario"]["from_store"] is True
    assert set(doc["scenario"]["carbon"]) == {"GB", "DE"}
    # a job replayed on the model it really ran on runs exactly as long as it really did
    model_of = {"gb-1": "H100", "de-1": "MI300X"}
    checked = 0
    for policy in ("fifo", "greedy"):
        with open(out / f"jobs-{policy}.csv") as f:
            for row in csv.DictReader(f):
                job_id = int(row["name"].split(":")[0])
                runtime_s, _, node = completed[job_id]
                if row["model"] == model_of[node]:
                    assert float(row["runtime_s"]) == pytest.approx(runtime_s, rel=1e-9)
                    checked += 1
    assert checked >= 6
    assert _dump(store) == before  # read-only


def test_shadow_mode_with_nothing_to_replay_says_so(history, tmp_path, capsys):
    store, _ = history
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--from-store", "--db", store.url, "--since", "2021-01-01T00:00Z",
              "--until", "2021-02-01T00:00Z", "--policy", "fifo", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "no completed jobs submitted between" in capsys.readouterr().err


def test_carbon_from_the_store_gives_the_same_numbers_as_the_csv_it_was_imported_from(history, tmp_path, capsys):
    store, _ = history
    cluster = tmp_path / "c.toml"
    cluster.write_text('[[node]]\nname = "gb"\nzone = "GB"\ngpus = "8xH100"\n')
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("\n".join((DEMO / "pai_demo.csv").read_text().splitlines()[:31]) + "\n")
    results = []
    for carbon in ("GB=store", f"GB={DEMO / 'GB.csv'}"):
        with pytest.raises(SystemExit) as e:
            main(["simulate", "--cluster", str(cluster), "--jobs", str(jobs), "--carbon", carbon, "--db", store.url,
                  "--start", "2022-10-19T16:00Z", "--policy", "fifo,greedy", "--json", "--no-plots",
                  "--out", str(tmp_path / "o")])
        assert e.value.code == 0
        results.append(json.loads(capsys.readouterr().out)["policies"])
    for policy in ("fifo", "greedy"):
        assert results[0][policy]["kgco2"] == pytest.approx(results[1][policy]["kgco2"], rel=1e-12)
    assert results[0]["greedy"]["kgco2"] < results[0]["fifo"]["kgco2"]


def test_the_header_says_what_the_replay_changed_from_the_history(history, capsys):
    """Jobs run by their prompts at a runtime far from what they measured, and a history
    moved to the carbon data's dates: each is a note under the header, not silence."""
    store, _ = history
    with store.write() as conn:
        ids = conn.execute(select(gpus.c.id).where(gpus.c.node_name == "gb-1")).scalars().all()
        moved = T0 + timedelta(days=800)  # after the recorded carbon: the replay moves it
        for k in range(2):
            conn.execute(insert(jobs).values(
                name=f"chat{k}", state="COMPLETED", owner_uid=1000, owner_gid=1000, owner_groups=[],
                owner_name="u", argv=["true"], cwd="/", env={}, gpus=1, gpu_mem_gib=0.0,
                workload="llm-inference", prompts=100_000, submitted_at=moved + timedelta(minutes=k),
                started_at=moved + timedelta(minutes=k), ended_at=moved + timedelta(minutes=k, seconds=1),
                node="gb-1", gpu_ids=ids[:1], energy_j=1.0))
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--from-store", "--db", store.url, "--since", (moved - timedelta(hours=1)).isoformat(),
              "--until", (moved + timedelta(hours=1)).isoformat(), "--policy", "fifo", "--no-plots"])
    err = capsys.readouterr().err
    assert e.value.code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert notes[0].startswith(f"note: the trace's own dates (from {moved.isoformat()[:16]}Z) lie outside "
                               "the carbon data: replayed from 2022-")
    assert notes[1].startswith("note: 2 job(s) run by their prompts at the model's runtime, far from what "
                               "they measured (median 1s measured, ")
