"""`carbonsched profiles`: the performance model's figures per GPU model, the seed beside the
learned profile with the runs behind it, and training labelled nominal.

Specification, in short:
- every figure shown is `policies.model.perf_model`'s own for that GPU model, at the point the
  planner picks (`operating_point.job_choice`: the lowest J/prompt that fits and meets the
  workload's default SLOs, or the limits asked for), with its operating point, source kind,
  power uncertainty and the limit that bound it;
- an unknown workload exits 2 with one line that suggests the near names;
- learned figures come from the store (through the daemon's GET /v1/profiles or --db) with
  the seed they correct and their run count; without a daemon or database they are said to
  be unavailable and the command still succeeds;
- `train` and `finetune` have no sourced figure: every place they show says "nominal";
- `--plot` writes a PNG of the J/token vs TPOT p95 frontier.
"""

from __future__ import annotations

import json
import os
import re
import struct
from datetime import timedelta

import pytest

from policies.model import operating_point, perf_model
from policies.model.energy import ProfileBook, seed_profiles
from scheduler.cli.common import EXIT_USAGE
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.api import ApiServer, profile_routes
from scheduler.daemon.service import JobService
from scheduler.profile_view import FLEET_GPUS, frontier_curve
from scheduler.profiles import learn_from_job, learned_profiles
from tests.store.test_profiles_store import T0, add_finished_job, add_gpus
from test_report_cli import run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def planners_point(workload: str, gpu: str, **slos_ms):
    """The prediction at the point the planner picks for a job of `workload` on 8 GPUs of
    `gpu` asking for `slos_ms` (ttft_ms, tpot_ms, latency_ms; the rest: the defaults), or None."""
    c = operating_point.job_choice(workload, gpu, 8, slos_ms.get("ttft_ms"), slos_ms.get("tpot_ms"),
                                   slos_ms.get("latency_ms"))
    return c.prediction if isinstance(c, operating_point.Choice) else None


@pytest.fixture
def no_daemon(tmp_path, monkeypatch):
    """--socket arguments for a socket nobody listens on; no config file."""
    monkeypatch.setenv("CARBONSCHED_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    return ("--socket", str(tmp_path / "absent.sock"))


# -- the model's figures ----------------------------------------------------------------------

@pytest.mark.parametrize("workload", ["llm-chat-70b", "llm-chat-8b", "mlperf-llama2-70b"])
def test_json_gives_the_models_best_point_and_figures_for_each_gpu_model(capsys, no_daemon, workload):
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", workload, "--json")
    assert code == 0, err
    view = json.loads(out)
    w = perf_model.preset(workload)
    assert view["workload"]["name"] == workload and view["workload"]["nominal"] is False
    assert view["workload"]["total_params_b"] == w.total_params_b
    assert [e["gpu"] for e in view["gpus"]] == list(FLEET_GPUS)
    for e in view["gpus"]:
        best = planners_point(workload, e["gpu"])
        if best is None:  # mlperf's FP8 on the A100, which has no FP8
            assert e["fits"] is False and e["point"] is None and e["j_per_prompt"] is None and e["why"]
            continue
        assert e["fits"] is True and e["why"] is None
        assert e["point"] == {"max_batch": best.point.max_batch, "precision": best.point.precision,
                              "tp": best.point.tp}
        for key in ("prompts_per_s", "output_tokens_per_s", "power_w", "j_per_prompt", "j_per_token",
                    "ttft_p95_ms", "tpot_p95_ms", "latency_p95_ms", "memory_needed_gib", "power_uncertainty_rel"):
            assert e[key] == pytest.approx(getattr(best, key), rel=1e-12), (e["gpu"], key)
        assert e["sources"] == best.sources and e["source"] == best.sources["throughput"]
        assert e["seed"] is None and e["learned"] is None and e["runs"] == 0
    assert view["learned_available"] is False


def test_the_amd_parts_power_comes_from_the_fitted_model_with_its_uncertainty(capsys, no_daemon):
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-70b", "--json")
    by_gpu = {e["gpu"]: e for e in json.loads(out)["gpus"]}
    for gpu in ("MI300X", "MI325X", "MI355X"):
        assert by_gpu[gpu]["sources"]["power"] == "power-model"
        assert by_gpu[gpu]["power_uncertainty_rel"] == pytest.approx(perf_model.fit().power_transfer_rel)
        assert by_gpu[gpu]["power_uncertainty_rel"] > 0

    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-70b")
    row = next(line for line in out.splitlines() if line.startswith("MI300X"))
    assert f"power-model +-{perf_model.fit().power_transfer_rel * 100:.0f}%" in row


def test_the_table_shows_each_gpu_models_operating_point_and_source(capsys, no_daemon):
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-70b")
    assert code == 0
    w = perf_model.preset("llm-chat-70b")
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("GPU "))
    for name in ("BATCH/PREC/TP", "PROMPTS/S", "W", "J/PROMPT", "J/TOKEN", "TTFT P95 MS", "TPOT P95 MS", "MEM GIB",
                 "SOURCE", "POWER"):
        assert name in header
    for gpu in FLEET_GPUS:
        best = planners_point(w.name, gpu)
        cells = next(line for line in lines if line.startswith(gpu + " ")).split()
        assert cells[1] == f"{best.point.max_batch}/{best.point.precision}/{best.point.tp}"
        assert cells[4] == f"{best.j_per_prompt:.3g}" and cells[9] == best.sources["throughput"]
    assert "learned figures unavailable" in out and "absent.sock" in out


def test_the_summary_lists_every_preset_with_its_j_per_prompt_per_gpu_model(capsys, no_daemon):
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--json")
    assert code == 0, err
    view = json.loads(out)
    assert [x["workload"]["name"] for x in view["workloads"]] == list(perf_model.presets())
    for item in view["workloads"]:
        w = perf_model.preset(item["workload"]["name"])
        for e in item["gpus"]:
            best = perf_model.best_point(w, e["gpu"]) if w.kind == "train" else planners_point(w.name, e["gpu"])
            assert (e["j_per_prompt"] is None) if best is None else e["j_per_prompt"] == pytest.approx(best.j_per_prompt)
    aliases = {x["workload"]["name"]: x["workload"]["alias_of"] for x in view["workloads"]}
    assert aliases["llm-inference"] == "llm-chat-8b" and aliases["llm-chat-8b"] is None

    code, out, _ = run_cli(capsys, *no_daemon, "profiles")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("llm-chat-70b "))
    best = planners_point("llm-chat-70b", "H100")
    assert f"{best.j_per_prompt:.3g} m" in row  # H100's llm-chat-70b point is an ML.ENERGY measurement


# -- usage errors -----------------------------------------------------------------------------

def test_an_unknown_workload_exits_2_and_suggests_the_near_names(capsys, no_daemon):
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-7b")
    assert code == EXIT_USAGE and out == ""
    assert err.count("\n") == 1 and err.startswith("carbonsched: unknown workload 'llm-chat-7b'")
    assert "did you mean llm-chat-70b" in err and "llm-chat-8b" in err

    code, _, err = run_cli(capsys, *no_daemon, "profiles", "--workload", "qwerty")
    assert code == EXIT_USAGE and "did you mean" not in err and "known: " in err


def test_an_unknown_gpu_model_and_a_plot_without_a_workload_are_usage_errors(capsys, no_daemon, tmp_path):
    code, _, err = run_cli(capsys, *no_daemon, "profiles", "--gpu", "H300")
    assert code == EXIT_USAGE and "unknown GPU model H300" in err
    code, _, err = run_cli(capsys, *no_daemon, "profiles", "--plot", str(tmp_path / "x.png"))
    assert code == EXIT_USAGE and "--workload" in err and not (tmp_path / "x.png").exists()


# -- the plot ---------------------------------------------------------------------------------

def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_writes_a_png_of_the_frontier(capsys, no_daemon, tmp_path):
    plot = tmp_path / "frontier.png"
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-70b", "--plot", str(plot))
    assert code == 0, err
    assert f"plot: {plot}" in out
    assert _png_size(plot) == (900, 550) and plot.stat().st_size > 20_000


def test_the_frontier_keeps_only_points_no_other_point_beats_on_both_axes():
    w = perf_model.preset("llm-chat-70b")
    curve = frontier_curve(w, "H100")
    points = [(p.tpot_p95_ms, p.j_per_token) for p in perf_model.frontier(w, "H100")]
    assert len(curve) >= 5 and set(curve) <= set(points)
    assert all(a[0] <= b[0] and a[1] > b[1] for a, b in zip(curve, curve[1:]))
    assert not any(x <= cx and y < cy for cx, cy in curve for x, y in points)
    assert min(y for _, y in curve) == min(y for _, y in points)


# -- training is nominal ------------------------------------------------------------------------

@pytest.mark.parametrize("workload", ["train", "finetune"])
def test_training_is_labelled_nominal_everywhere_it_shows(capsys, no_daemon, tmp_path, workload):
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", workload, "--json")
    view = json.loads(out)
    assert view["workload"]["nominal"] is True
    for e in view["gpus"]:
        assert e["nominal"] is True and e["source"] == "nominal"
        assert set(e["sources"].values()) == {"nominal"}
        assert e["ttft_p95_ms"] is None and e["tpot_p95_ms"] is None  # no tokens streamed

    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", workload)
    assert "NOMINAL" in out.splitlines()[0] and f"{perf_model.NOMINAL_TRAIN_MFU:g}" in out.splitlines()[0]
    for gpu in FLEET_GPUS:
        row = next(line for line in out.splitlines() if line.startswith(gpu + " ")).split()
        assert row[-3:] == ["nominal", "nominal", "-"]  # and no latency limit bound it

    code, out, _ = run_cli(capsys, *no_daemon, "profiles")
    cells = re.split(r"\s{2,}", next(line for line in out.splitlines() if line.startswith(workload + " ")))
    assert "NOMINAL" in cells[0]
    assert [c.split()[-1] for c in cells[1:1 + len(FLEET_GPUS)]] == ["n"] * len(FLEET_GPUS)

    plot = tmp_path / "train.png"
    code, _, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", workload, "--plot", str(plot))
    assert code == 0 and _png_size(plot) == (900, 550)


# -- seed vs learned ----------------------------------------------------------------------------

WORKLOAD = "llm-chat-70b"


def _learn(store, model: str, factors: list[float]) -> None:
    """Complete and learn one job per factor on 1 GPU of `model`: factor x the seed's throughput."""
    seed = ProfileBook(seed_profiles()).get(WORKLOAD, model)
    ids = add_gpus(store, f"n-{model}", model, 1)
    for f in factors:
        runtime_s = 600.0
        job = add_finished_job(store, gpu_ids=ids, runtime_s=runtime_s, energy_j=0.9 * seed.power_w * runtime_s,
                               prompts=int(f * seed.prompts_per_s * runtime_s), workload=WORKLOAD)
        assert learn_from_job(store, job, clock=lambda: T0 + timedelta(hours=1)) is not None


def _check_learned_view(view: dict, store) -> None:
    with store.read() as conn:
        learned = {p.model: p for p in learned_profiles(conn) if p.workload == WORKLOAD}
    seeds = ProfileBook(seed_profiles())
    by_gpu = {e["gpu"]: e for e in view["gpus"]}
    assert view["learned_available"] is True and view["learned_note"] is None
    h100 = by_gpu["H100"]
    assert h100["runs"] == 3 and h100["runs_kept"] == 3
    assert h100["learned"]["prompts_per_s"] == pytest.approx(learned["H100"].prompts_per_s)
    assert h100["learned"]["power_w"] == pytest.approx(learned["H100"].power_w)
    assert h100["rel_uncertainty"] == pytest.approx(learned["H100"].rel_uncertainty)
    assert h100["seed"]["prompts_per_s"] == pytest.approx(seeds.get(WORKLOAD, "H100").prompts_per_s)
    assert h100["learned"]["prompts_per_s"] != pytest.approx(h100["seed"]["prompts_per_s"])
    assert by_gpu["B200"]["runs"] == 1 and by_gpu["B200"]["rel_uncertainty"] is None
    # A seeded model without runs of its own: the seed corrected by the other models' runs.
    assert by_gpu["MI300X"]["runs"] == 0 and by_gpu["MI300X"]["learned"] is not None
    assert by_gpu["MI300X"]["learned"]["prompts_per_s"] == pytest.approx(learned["MI300X"].prompts_per_s)
    # The model's figures stay the model's beside the learned ones.
    assert h100["j_per_prompt"] == pytest.approx(planners_point(WORKLOAD, "H100").j_per_prompt)


def test_seed_vs_learned_with_runs_from_the_store(store, capsys, no_daemon):
    _learn(store, "H100", [1.3, 1.25, 1.35])
    _learn(store, "B200", [0.8])
    url = store.engine.url.render_as_string(hide_password=False)

    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--db", url, "--workload", WORKLOAD, "--json")
    assert code == 0, err
    _check_learned_view(json.loads(out), store)

    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--db", url, "--workload", WORKLOAD)
    lines = out.splitlines()
    assert any(line.startswith("GPU ") and "RUNS" in line and "SEED>LEARNED" in line for line in lines)
    h100 = next(line for line in lines if line.startswith("H100 ") and " > " in line)
    assert " 3 " in h100 and "+-" in h100

    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--db", url)
    row = next(line for line in out.splitlines() if line.startswith(WORKLOAD + " "))
    assert row.endswith("  B200 1, H100 3")  # models with runs of their own only


def test_seed_vs_learned_through_the_daemon_socket(store, capsys, no_daemon, tmp_path):
    _learn(store, "H100", [1.3, 1.25, 1.35])
    _learn(store, "B200", [0.8])
    service = JobService(store, ServiceConfig(daemon_uid=os.geteuid()), log_dir=tmp_path / "logs")
    sock = tmp_path / "s.sock"
    api = ApiServer(sock, service, extra_routes=profile_routes(store))
    api.start()
    try:
        code, out, err = run_cli(capsys, "--socket", str(sock), "profiles", "--workload", WORKLOAD, "--json")
        assert code == 0, err
        _check_learned_view(json.loads(out), store)
    finally:
        api.stop()


def test_a_daemon_that_cannot_read_its_database_leaves_the_models_figures_standing(capsys, no_daemon, tmp_path):
    from scheduler.store import Store

    broken = Store(f"sqlite:///{tmp_path / 'never-migrated.db'}")  # no workload_profiles table
    service = JobService(broken, ServiceConfig(daemon_uid=os.geteuid()), log_dir=tmp_path / "logs")
    sock = tmp_path / "s.sock"
    api = ApiServer(sock, service, extra_routes=profile_routes(broken))
    api.start()
    try:
        code, out, err = run_cli(capsys, "--socket", str(sock), "profiles", "--workload", WORKLOAD)
        assert code == 0, err
        assert "learned figures unavailable" in out and "database cannot be read now" in out
        assert next(line for line in out.splitlines() if line.startswith("B200 "))
    finally:
        api.stop()
        broken.dispose()


def test_every_user_reads_the_learned_profiles_and_a_workload_filter_applies(store):
    _learn(store, "H100", [1.1])
    route = profile_routes(store)[("GET", "profiles")]
    rows = route(Caller(1000, 1000), {})["profiles"]
    assert {(r["workload"], r["model"]) for r in rows} >= {(WORKLOAD, "H100")}
    assert route(Caller(1000, 1000), {"workload": ["llm-chat-8b"]})["profiles"] == []
    assert rows == route(Caller(0, 0), {"workload": [WORKLOAD]})["profiles"]


def test_a_workload_known_only_from_learned_profiles_shows_its_learned_figures(store, capsys, no_daemon):
    ids = add_gpus(store, "n1", "H100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=100.0, energy_j=50_000.0, prompts=1000,
                           workload="my-rag")
    learn_from_job(store, job, clock=lambda: T0)
    url = store.engine.url.render_as_string(hide_password=False)
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--db", url, "--workload", "my-rag", "--json")
    assert code == 0, err
    h100 = next(e for e in json.loads(out)["gpus"] if e["gpu"] == "H100")
    assert h100["learned"]["prompts_per_s"] == pytest.approx(10.0) and h100["learned"]["power_w"] == pytest.approx(500)
    assert h100["seed"] is None and h100["runs"] == 1 and "fits" not in h100
    code, _, err = run_cli(capsys, *no_daemon, "profiles", "--db", url, "--workload", "my-rga")
    assert code == EXIT_USAGE and "did you mean my-rag" in err


def test_a_learned_training_workload_says_its_seeds_are_nominal(store, capsys, no_daemon):
    seed = ProfileBook(seed_profiles()).get("train", "H100")
    assert seed is not None and seed.source.startswith("nominal")
    ids = add_gpus(store, "n1", "H100", 1)
    job = add_finished_job(store, gpu_ids=ids, runtime_s=100.0, energy_j=60_000.0,
                           prompts=int(seed.prompts_per_s * 100), workload="train")
    assert learn_from_job(store, job, clock=lambda: T0) is not None
    url = store.engine.url.render_as_string(hide_password=False)
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--db", url, "--workload", "train")
    assert code == 0, err
    assert "seed vs learned here (per GPU; the seeds are NOMINAL" in out
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--db", url, "--workload", "train", "--json")
    h100 = next(e for e in json.loads(out)["gpus"] if e["gpu"] == "H100")
    assert h100["runs"] == 1 and h100["nominal"] is True and h100["seed"]["source"].startswith("nominal")


def test_without_a_daemon_or_a_usable_database_learned_figures_are_unavailable_not_an_error(
        capsys, no_daemon, tmp_path):
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", WORKLOAD, "--json")
    view = json.loads(out)
    assert code == 0 and view["learned_available"] is False and "absent.sock" in view["learned_note"]

    (tmp_path / "empty.db").touch()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"  # never migrated
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--db", empty, "--workload", WORKLOAD)
    assert code == 0, err
    assert "learned figures unavailable" in out and "db upgrade" in out
    assert next(line for line in out.splitlines() if line.startswith("H100 "))  # the model's figures still show

    missing = tmp_path / "missing.db"
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--db", f"sqlite:///{missing}")
    assert code == 0, err
    assert f"no database file at {missing}" in out and not missing.exists()  # a read creates nothing


# -- latency limits -----------------------------------------------------------------------------

def test_latency_limits_pick_the_best_point_that_meets_them(capsys, no_daemon):
    w = perf_model.preset(WORKLOAD)
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", WORKLOAD, "--tpot-slo", "40ms",
                             "--ttft-slo", "2s", "--json")
    assert code == 0, err
    view = json.loads(out)
    assert view["slo"] == {"ttft_p95_ms": 2000.0, "tpot_p95_ms": 40.0, "latency_p95_ms": None}
    unconstrained = {g: perf_model.best_point(w, g) for g in FLEET_GPUS}
    for e in view["gpus"]:
        best = perf_model.best_point(w, e["gpu"], ttft_p95_ms=2000.0, tpot_p95_ms=40.0)
        assert e["point"]["max_batch"] == best.point.max_batch and e["point"]["tp"] == best.point.tp
        assert e["tpot_p95_ms"] <= 40.0 and e["j_per_prompt"] == pytest.approx(best.j_per_prompt)
        assert e["j_per_prompt"] >= unconstrained[e["gpu"]].j_per_prompt  # a limit never makes it cheaper
    assert any(e["j_per_prompt"] > unconstrained[e["gpu"]].j_per_prompt for e in view["gpus"])

    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", WORKLOAD, "--tpot-slo", "1ms")
    assert code == 0 and "TPOT p95 <= 1 ms" in out
    row = next(line for line in out.splitlines() if line.startswith("H100 "))
    assert "none: no operating point meets TTFT p95 <= 2000 ms, TPOT p95 <= 1 ms" in row  # TTFT: the default


def test_a_bare_latency_limit_is_ms_and_a_malformed_one_exits_2(capsys, no_daemon):
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", WORKLOAD, "--latency-slo", "90000", "--json")
    assert code == 0 and json.loads(out)["slo"]["latency_p95_ms"] == 90000.0
    for bad in ("4x", "0ms", "-3"):
        code, _, err = run_cli(capsys, *no_daemon, "profiles", "--tpot-slo", bad)
        assert code == EXIT_USAGE and err.startswith("carbonsched: --tpot-slo"), (bad, err)


def test_training_has_no_latency_model_so_a_limit_on_it_is_refused(capsys, no_daemon):
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", "train", "--tpot-slo", "40ms")
    assert code == EXIT_USAGE and out == "" and "no latency model" in err
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--tpot-slo", "40ms", "--json")
    names = [x["workload"]["name"] for x in json.loads(out)["workloads"]]
    assert code == 0 and "train" not in names and "finetune" not in names and WORKLOAD in names


def test_the_plot_draws_a_tpot_limit(capsys, no_daemon, tmp_path):
    plot = tmp_path / "slo.png"
    code, _, err = run_cli(capsys, *no_daemon, "profiles", "--workload", WORKLOAD, "--tpot-slo", "40ms",
                           "--plot", str(plot))
    assert code == 0, err
    assert _png_size(plot) == (900, 550)


def test_the_best_point_is_the_planners_under_the_workloads_default_slos(capsys, no_daemon):
    """Without SLO flags the point shown is not the cheapest at any latency (H100: batch 1024,
    TPOT p95 146 ms) but the one the planner holds a job to: llm-chat-8b's default TPOT p95
    of 100 ms rules out batch 1024, and the planner picks 512."""
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-8b", "--json")
    assert code == 0, err
    view = json.loads(out)
    defaults = operating_point.slos_for("llm-chat-8b", None, None, None)
    assert view["slo"] == {"ttft_p95_ms": None, "tpot_p95_ms": None, "latency_p95_ms": None}  # none asked for
    assert view["slo_applied"] == {"ttft_p95_ms": defaults.ttft_ms, "tpot_p95_ms": defaults.tpot_ms,
                                   "latency_p95_ms": None}
    assert view["slo_defaulted"] == ["ttft", "tpot"]
    h100 = next(e for e in view["gpus"] if e["gpu"] == "H100")
    cheapest = perf_model.best_point(perf_model.preset("llm-chat-8b"), "H100")
    assert cheapest.tpot_p95_ms > defaults.tpot_ms  # the default SLO binds on the H100
    assert h100["point"] == {"max_batch": 512, "precision": "bf16", "tp": 1}
    assert h100["tpot_p95_ms"] <= defaults.tpot_ms and h100["slo_binding"] == ["tpot"]
    for e in view["gpus"]:
        choice = operating_point.job_choice("llm-chat-8b", e["gpu"], 8, None, None, None)
        assert e["point"]["max_batch"] == choice.point.max_batch and e["point"]["tp"] == choice.point.tp
        assert e["slo_binding"] == list(choice.binding)

    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-8b")
    assert "TTFT p95 <= 2000 ms, TPOT p95 <= 100 ms: the workload's default SLOs" in out
    cells = next(line for line in out.splitlines() if line.startswith("H100 ")).split()
    assert cells[1] == "512/bf16/1" and cells[-1] == "TPOT"  # BOUND BY

    code, out, _ = run_cli(capsys, *no_daemon, "profiles")
    row = next(line for line in out.splitlines() if line.startswith("llm-chat-8b "))
    assert f"{planners_point('llm-chat-8b', 'H100').j_per_prompt:.3g} m*" in row and "TPOT 100 ms" in row


def test_a_limit_asked_for_replaces_only_its_own_default(capsys, no_daemon):
    code, out, err = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-8b", "--tpot-slo", "300ms",
                             "--json")
    assert code == 0, err
    view = json.loads(out)
    assert view["slo_applied"]["tpot_p95_ms"] == 300.0 and view["slo_applied"]["ttft_p95_ms"] == 2000.0
    assert view["slo_defaulted"] == ["ttft"]
    h100 = next(e for e in view["gpus"] if e["gpu"] == "H100")
    assert h100["point"]["max_batch"] == 1024 and h100["slo_binding"] == []  # 146 ms meets 300 ms


def test_each_source_kind_is_explained_once_in_words_of_its_own(capsys, no_daemon):
    """llm-reason shows both "fitted+correction" (B200) and "roofline+correction" (A100, H200):
    their explanations must tell them apart, not print one line twice."""
    from scheduler.profile_view import SOURCE_KINDS

    assert len(set(SOURCE_KINDS.values())) == len(SOURCE_KINDS)
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-reason")
    legend = [line.split(": ", 1)[1] for line in out.splitlines()
              if line.startswith("  ") and line.split(":")[0].strip() in SOURCE_KINDS]
    assert {"fitted+correction", "roofline+correction"} <= {line.split(":")[0].strip() for line in out.splitlines()}
    assert len(legend) == len(set(legend))


def test_a_gpu_model_given_twice_is_shown_once(capsys, no_daemon):
    code, out, _ = run_cli(capsys, *no_daemon, "profiles", "--workload", "llm-chat-8b", "--gpu", "H100", "--gpu",
                           "B200", "--gpu", "H100")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines() if line.startswith(("H100 ", "B200 "))] == ["H100", "B200"]
