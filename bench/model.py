"""`python -m bench.model`: how well policies/model/perf_model.py reproduces the public figures.

Prints (a) every ML.ENERGY row of the fit reproduced at its own configuration, with the
error per row (the model alone, and the planner's path with the row's correction drawn
without it), the rows the fit leaves out and why; (a') every MLPerf Inference llama2-70b
Offline result (policies/data/mlperf_results.toml) at its serving stack's fitted speed, in
sample, leave-one-round-out and leave-one-submitter-out, with the speeds per (vendor,
engine, round) and the factors predictions use; (b) leave-one-GPU-out on ML.ENERGY: each
measured GPU predicted from a fit on the others; (c) per preset workload and GPU model, the
most energy-efficient operating point with TPOT p95 <= 100 ms and TTFT p95 <= 2 s at the
smallest TP degree that has one, on the planner's prediction path (stack factor and
measured correction shown); (e)/(f) per-part MLPerf errors and pairwise order per round.

Targets: (a) MLPerf leave-one-round-out and leave-one-submitter-out median error
per part <= 15 %; (b) within each round, the order of every pair of parts right in >= 90 %
of pairs (leave-one-round-out predictions); (c) ML.ENERGY rows within 10 %: >= 85, each on
the planner's path out of sample where the planner has its configuration, else the model.
Exit status: 0 all met, 2 one missed. `--json FILE` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from policies.model import perf_model as pm  # noqa: E402

ROW_TARGET = 0.10
ROWS_WITHIN_TARGET = 85
LOO_MEDIAN_TARGET = 0.20
MLPERF_PART_TARGET = 0.15
ORDER_TARGET = 0.90
TPOT_P95_LIMIT_MS = 100.0
TTFT_P95_LIMIT_MS = 2000.0
PRESET_OF = {(m, t): name for name, (m, t, _) in pm._PRESET_MODELS.items()}
SHORT_GPU = {"A100-SXM4-40GB": "A100-40G"}


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1


def _workload_of(r: dict) -> str:
    return PRESET_OF.get((r["model_id"], r["task"]), f"{r['model_id'].split('/')[-1]} ({r['task']})")


def table_a() -> tuple[list[dict], list[dict], list[dict]]:
    """(fit rows reproduced, rows left out, MLPerf cross-check)."""
    f = pm.fit()
    used = {id(r) for r in pm.fit_rows()}
    rows, left = [], []
    for r in pm.mlenergy_rows():
        if id(r) not in used:
            left.append(r)
            continue
        p = pm.reproduce_row(r, f)
        path = planner_path_loo(r)
        rows.append({"source": r["source"], "workload": _workload_of(r), "dataset": r["dataset"], "gpu": r["gpu"],
                     "gpus": r["num_gpus"], "batch": r["avg_batch_size"],
                     "tokens_per_s": r["output_tokens_per_s"], "tokens_per_s_pred": p["tokens_per_s"],
                     "power_w": r["power_w_all_gpus"], "power_w_pred": p["power_w"],
                     "j_per_token": r["j_per_output_token"], "j_per_token_pred": p["j_per_token"],
                     "err_tokens": _err(p["tokens_per_s"], r["output_tokens_per_s"]),
                     "err_power": _err(p["power_w"], r["power_w_all_gpus"]),
                     "err_j": _err(p["j_per_token"], r["j_per_output_token"]),
                     "power_in_fit": r["dataset"] == "mlenergy-v3",
                     "tokens_per_s_path": path,
                     "err_path": None if path is None else _err(path, r["output_tokens_per_s"])})
    return rows, left, mlperf_check()


def planner_path_loo(r: dict) -> float | None:
    """The planner's prediction of one ML.ENERGY v3 row's configuration (its preset workload,
    its batch limit, GPU count and precision: `perf_model.predict`, the model times the smooth
    correction) with the correction drawn through the other rows of its (workload, GPU, GPUs),
    not this one: out of sample, as the planner meets a batch limit no one measured. The
    planner's group is the row's GPU count, whatever its layout (an expert-parallel row too:
    `perf_model.correction_rows`). None: the planner has no such configuration (v2's older
    serving stack)."""
    name = PRESET_OF.get((r["model_id"], r["task"]))
    if r["dataset"] != "mlenergy-v3" or name is None:
        return None
    point = pm.OperatingPoint(r["max_num_seqs"], r["precision"], r["num_gpus"])
    return pm.predict(pm.preset(name), r["gpu"], point, leave_out=r).output_tokens_per_s


def mlperf_check() -> list[dict]:
    """Each MLPerf Offline result's per-GPU tokens/s against the model at its stack's speed:
    in sample (the speed of its (vendor, engine, round)), leave-one-round-out (the speeds
    fitted without its round: NVIDIA's own stack interpolated between the rounds around it,
    another stack at that times its factor relative to NVIDIA's, as the planner predicts:
    `perf_model.stack_factor_for`) and leave-one-submitter-out (without its submitter's
    results: its stack and round from the other submitters, else as held out); and on the
    planner's path (the part's vendor factor against CUDA/vLLM, `perf_model.stack_of`), for
    the rankings."""
    f = pm.fit()
    results = pm.mlperf_results()
    every = pm.stack_speeds(f)
    by_round = {r: pm.stack_speeds(f, keep=lambda m, r=r: m["round"] != r) for r in {m["round"] for m in results}}
    by_sub = {s_: pm.stack_speeds(f, keep=lambda m, s_=s_: m["submitter"] != s_)
              for s_ in {m["submitter"] for m in results}}
    out = []
    for m in results:
        if m["scenario"] != "Offline":
            continue
        per_gpu = m["tokens_per_s"] / m["accelerators"]
        v, e = pm.mlperf_key(m)
        row = {"round": m["round"], "division": m["division"], "submitter": m["submitter"], "system": m["system"],
               "part": m["part"], "engine": m["engine"], "accelerators": m["accelerators"],
               "precision": m["precision"], "tokens_per_s_per_gpu": per_gpu}
        for key, speeds in (("in", every), ("loro", by_round[m["round"]]), ("loso", by_sub[m["submitter"]])):
            speed = pm.stack_factor_for(v, e, m["round"], speeds)
            pred = pm.mlperf_best_tokens_per_gpu_s(m, f, speed) if speed is not None else float("nan")
            row[f"speed_{key}"] = speed
            row[f"pred_{key}"] = pred
            row[f"err_{key}"] = _err(pred, per_gpu)
        planner_speed = pm.stack_of(m["part"], precision=m["precision"]).factor
        row["pred_planner"] = pm.mlperf_best_tokens_per_gpu_s(m, f, planner_speed)
        out.append(row)
    return out


def per_part_medians(mlperf: list[dict], key: str) -> dict[str, float]:
    """Median |error| per part of the `key` predictions (in, loro, loso)."""
    parts: dict[str, list[float]] = {}
    for r in mlperf:
        if r[f"err_{key}"] == r[f"err_{key}"]:  # not nan
            parts.setdefault(r["part"], []).append(abs(r[f"err_{key}"]))
    return {p: statistics.median(v) for p, v in sorted(parts.items())}


def pairwise_order(mlperf: list[dict], key: str) -> tuple[int, int, list[str]]:
    """Within each round, every pair of parts (each part's median per-GPU tokens/s over its
    results): (pairs ordered as measured by the `key` predictions, pairs, the wrong ones)."""
    right = total = 0
    wrong = []
    for rnd in sorted({r["round"] for r in mlperf}):
        meas: dict[str, list[float]] = {}
        pred: dict[str, list[float]] = {}
        for r in mlperf:
            if r["round"] == rnd and r[f"pred_{key}"] == r[f"pred_{key}"]:
                meas.setdefault(r["part"], []).append(r["tokens_per_s_per_gpu"])
                pred.setdefault(r["part"], []).append(r[f"pred_{key}"])
        names = sorted(meas)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ma, mb = statistics.median(meas[a]), statistics.median(meas[b])
                pa, pb = statistics.median(pred[a]), statistics.median(pred[b])
                total += 1
                if (ma > mb) == (pa > pb):
                    right += 1
                else:
                    wrong.append(f"{rnd} {a} {ma:.0f} vs {b} {mb:.0f} measured, {pa:.0f} vs {pb:.0f} predicted")
    return right, total, wrong


def table_b() -> list[dict]:
    """Leave-one-GPU-out errors per (GPU, workload)."""
    out = []
    for gpu in pm.fit().gpus:
        f = pm.fit(exclude_gpu=gpu)
        by_workload: dict[str, list[tuple[float, float, float]]] = {}
        for r in pm.fit_rows():
            if r["gpu"] != gpu:
                continue
            p = pm.reproduce_row(r, f)
            by_workload.setdefault(_workload_of(r), []).append((
                abs(_err(p["tokens_per_s"], r["output_tokens_per_s"])), abs(_err(p["power_w"], r["power_w_all_gpus"])),
                abs(_err(p["j_per_token"], r["j_per_output_token"]))))
        for wl, errs in sorted(by_workload.items()):
            cols = list(zip(*errs))
            out.append({"gpu": gpu, "workload": wl, "rows": len(errs), "power_in_fit": wl in pm._PRESET_MODELS,
                        **{f"{k}_median": statistics.median(c) for k, c in zip(("tokens", "power", "j"), cols)},
                        **{f"{k}_worst": max(c) for k, c in zip(("tokens", "power", "j"), cols)}})
    return out


def table_c() -> list[dict]:
    """Per preset and GPU model: the lowest-J/prompt point meeting the latency limits, at the
    smallest tensor-parallel degree that has one (more GPUs are then data-parallel replicas:
    the model's TP cost is the all-reduce latency per layer only, so a larger TP would look
    cheaper than it is)."""
    out = []
    for name, w in pm.presets().items():
        for gpu in pm.parts():
            if gpu == "A100-SXM4-40GB":
                continue
            if w.kind == "train":
                points = [pm.predict(w, gpu, pm.OperatingPoint(8, "bf16", 8))]
            else:
                points = [p for p in pm.frontier(w, gpu) if p.point.precision == w.precision
                          and p.tpot_p95_ms <= TPOT_P95_LIMIT_MS and p.ttft_p95_ms <= TTFT_P95_LIMIT_MS]
                points = [p for p in points if p.point.tp == min((q.point.tp for q in points), default=0)]
            if not points:
                out.append({"workload": name, "gpu": gpu, "point": None})
                continue
            best = min(points, key=lambda p: p.j_per_prompt)
            out.append({"workload": name, "gpu": gpu,
                        "point": {"max_batch": best.point.max_batch, "precision": best.point.precision,
                                  "tp": best.point.tp},
                        "prompts_per_s_per_gpu": best.prompts_per_s / best.point.tp,
                        "power_w_per_gpu": best.power_w / best.point.tp, "j_per_prompt": best.j_per_prompt,
                        "ttft_p95_ms": best.ttft_p95_ms, "tpot_p95_ms": best.tpot_p95_ms,
                        "latency_p95_ms": best.latency_p95_ms, "memory_gib_per_gpu": best.memory_needed_gib,
                        "power_uncertainty_rel": best.power_uncertainty_rel, "sources": best.sources,
                        "stack_factor": best.stack.factor if best.stack else None,
                        "stack": best.stack.label() if best.stack else None,
                        "speed_correction": best.speed_correction})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+6.1f}%"


def print_report(a: tuple[list[dict], list[dict], list[dict]], b: list[dict], c: list[dict]) -> tuple[bool, bool]:
    f = pm.fit()
    rows, left, mlperf = a
    print("perf_model fit:")
    print(f"  step time  t = {f.per_layer_us:.1f} us x layers + {f.allreduce_us:.1f} us x layers (TP > 1) + "
          f"{f.t0_ms:.2f} ms + {f.per_seq_us:.1f} us x batch")
    print(f"                 + (m^p + c^p)^(1/p), p = {f.overlap_p:g}, m = bytes / ({f.eta_mem:.3f} x HBM BW), "
          f"c = decode FLOPs / ({f.eta_compute:.3f} x peak)")
    print(f"                 + prefill FLOPs / ({f.eta_compute:.3f} x peak)")
    print(f"  power/GPU  P = {f.p_static_w:.1f} W + {f.e_byte_pj:.1f} pJ/byte + {f.e_flop_pj:.3f} pJ/FLOP "
          f"+ {f.e_seq_mj:.1f} mJ per sequence-step (capped at TDP); relative RMS {100 * f.power_rel_rms:.1f} %; "
          f"held-out GPU {100 * f.power_transfer_rel:.1f} %")
    print("  effective input tokens per task: " + ", ".join(f"{k} {v:.0f}" for k, v in f.input_tokens.items()))
    print(f"  ML.ENERGY v2 stack: + {f.v2_t0_ms:.2f} ms + {f.v2_per_seq_us:.1f} us x batch + "
          f"{f.v2_per_worker_ms:.2f} ms x (TP - 1); ITL p50/p95 = {f.itl_p50_over_step:.3f}/"
          f"{f.itl_p95_over_step:.3f} x step; step-time relative RMS {100 * f.step_rel_rms:.1f} %; "
          f"{f.rows} rows on {', '.join(f.gpus)}")
    print()
    print("(a) every ML.ENERGY row of the fit, reproduced at its own configuration (pred vs measured)")
    print(f"{'workload':<14}{'data':<4}{'GPU':<9}{'n':>2}{'batch':>6}{'tok/s':>8}{'pred':>8}{'err':>8}"
          f"{'path':>8}{'err':>8}{'W':>7}{'pred':>7}{'err':>8}{'J/tok':>7}{'pred':>7}{'err':>8}")
    for r in rows:
        mark = "" if r["power_in_fit"] else "*"
        path = ("-", "") if r["tokens_per_s_path"] is None else (f"{r['tokens_per_s_path']:.0f}", _pct(r["err_path"]))
        print(f"{r['workload']:<14}{r['dataset'][-2:]:<4}{SHORT_GPU.get(r['gpu'], r['gpu']):<9}{r['gpus']:>2}"
              f"{r['batch']:>6.0f}{r['tokens_per_s']:>8.0f}{r['tokens_per_s_pred']:>8.0f}{_pct(r['err_tokens']):>8}"
              f"{path[0]:>8}{path[1]:>8}"
              f"{r['power_w']:>7.0f}{r['power_w_pred']:>7.0f}{_pct(r['err_power']) + mark:>8}"
              f"{r['j_per_token']:>7.3f}{r['j_per_token_pred']:>7.3f}{_pct(r['err_j']) + mark:>8}")
    powered = [r for r in rows if r["power_in_fit"]]
    on_path = [r for r in rows if r["err_path"] is not None]
    within = {"err_tokens": sum(abs(r["err_tokens"]) <= ROW_TARGET for r in rows),
              "path": sum(abs(r["err_path"] if r["err_path"] is not None else r["err_tokens"]) <= ROW_TARGET
                          for r in rows),
              "path_only": sum(abs(r["err_path"]) <= ROW_TARGET for r in on_path),
              "model_on_path": sum(abs(r["err_tokens"]) <= ROW_TARGET for r in on_path),
              **{k: sum(abs(r[k]) <= ROW_TARGET for r in powered) for k in ("err_power", "err_j")}}
    med = {"err_tokens": statistics.median(abs(r["err_tokens"]) for r in rows),
           **{k: statistics.median(abs(r[k]) for r in powered) for k in ("err_power", "err_j")}}
    print("pred: the model alone at the row's achieved batch. path: the planner's prediction at the row's batch")
    print("  limit (model x correction), the correction drawn through the other rows of its (workload, GPU, GPUs):")
    print("  leave-one-row-out; '-': a configuration the planner has not (v2's serving stack)")
    print("* v2 row: its power (J/request x requests/s) is not used by the power fit (see perf_model.fit)")
    print(f"rows within {100 * ROW_TARGET:.0f} % (tokens/s), on the planner's path (leave-one-row-out) where it has "
          f"the configuration, else the model alone: {within['path']}/{len(rows)}; the {len(on_path)} path rows: "
          f"{within['path_only']} on the path, {within['model_on_path']} by the model alone")
    print(f"rows within {100 * ROW_TARGET:.0f} %: tokens/s {within['err_tokens']}/{len(rows)}, "
          f"W {within['err_power']}/{len(powered)}, J/token {within['err_j']}/{len(powered)}; median |error| "
          f"tokens/s {100 * med['err_tokens']:.1f} %, W {100 * med['err_power']:.1f} %, J/token {100 * med['err_j']:.1f} %")
    print(f"left out of the fit ({len(left)} rows; rules in perf_model.fit_rows):")
    for r in left:
        print(f"  {r['source']}: {r['gpu']} {_workload_of(r)} batch {r['avg_batch_size']:.0f}, "
              f"{r['output_tokens_per_s']:.0f} tok/s")
    print()
    print(f"(a') MLPerf Inference llama2-70b, Offline, per GPU: the model's best per-GPU point at the result's "
          f"stack speed; in sample, leave-one-round-out, leave-one-submitter-out (input {pm.mlperf_input_tokens():.0f} "
          f"tokens, fitted)")
    print(f"{'round':<6}{'submitter':<16}{'system':<34}{'GPUs':>4} {'part':<7}{'engine':<13}{'prec':<5}"
          f"{'tok/s/GPU':>10}{'speed':>7}{'in':>8}{'LORO':>8}{'LOSO':>8}{'planner':>8}")
    for m in mlperf:
        print(f"{m['round']:<6}{m['submitter'][:15]:<16}{m['system'][:33]:<34}{m['accelerators']:>4} {m['part']:<7}"
              f"{m['engine']:<13}{m['precision']:<5}{m['tokens_per_s_per_gpu']:>10.0f}{m['speed_in']:>7.2f}"
              f"{_pct(m['err_in']):>8}{_pct(m['err_loro']):>8}{_pct(m['err_loso']):>8}{m['pred_planner']:>8.0f}")
    print("  speed: the stack speed of the result's (vendor, engine, round), fitted on MLPerf (perf_model.stack_speeds)")
    print("  planner: tokens/s/GPU at the part's vendor factor against CUDA/vLLM (what the planner predicts)")
    print("per (vendor, engine, round): stack speed (geometric mean of its results) and, for AMD, over NVIDIA's")
    speeds = pm.stack_speeds()
    for (v, e, r), vals in sorted(speeds.items()):
        geo = pm._geo(vals)
        ref = speeds.get((*pm.REFERENCE_STACK, r))
        rel = f", {geo[0] / pm._geo(ref)[0]:.2f} of CUDA/TensorRT-LLM" if ref and (v, e) != pm.REFERENCE_STACK else ""
        print(f"  {v}/{e} {r}: {geo[0]:.2f} +- {geo[1] * geo[0]:.2f} ({len(vals)} results){rel}")
    for stack in pm.stack_factors().values():
        print(f"  predictions: {stack.label()}")
    print()
    print("(b) leave-one-GPU-out: each measured GPU predicted from a fit on the others (|error|)")
    print(f"{'GPU':<16}{'workload':<30}{'rows':>5}{'tok/s med':>10}{'worst':>8}{'W med':>8}{'worst':>8}"
          f"{'J/tok med':>10}{'worst':>8}")
    for r in b:
        m = "%" if r["power_in_fit"] else "*"
        print(f"{r['gpu']:<16}{r['workload']:<30}{r['rows']:>5}{100 * r['tokens_median']:>9.1f}%"
              f"{100 * r['tokens_worst']:>7.1f}%{100 * r['power_median']:>7.1f}{m}{100 * r['power_worst']:>7.1f}{m}"
              f"{100 * r['j_median']:>9.1f}{m}{100 * r['j_worst']:>7.1f}{m}")
    print("* against v2's implied power, which the power fit does not use")
    print()
    print(f"(c) per preset: the lowest-J/prompt operating point with TPOT p95 <= {TPOT_P95_LIMIT_MS:.0f} ms and "
          f"TTFT p95 <= {TTFT_P95_LIMIT_MS / 1000:.0f} s, smallest TP with one (train/finetune: nominal, 8 GPUs)")
    for name in pm.presets():
        print(f"-- {name}: {pm.preset(name).note}")
        print(f"   {'GPU':<8}{'batch':>6}{'TP':>3}{'prec':>5}{'prompts/s/GPU':>14}{'W/GPU':>7}{'J/prompt':>10}"
              f"{'TTFT p95':>10}{'TPOT p95':>10}{'GiB/GPU':>8}  source (throughput/power)")
        for r in c:
            if r["workload"] != name:
                continue
            if r["point"] is None:
                print(f"   {r['gpu']:<8} no operating point meets the limits")
                continue
            pt, src = r["point"], r["sources"]
            print(f"   {r['gpu']:<8}{pt['max_batch']:>6}{pt['tp']:>3}{pt['precision']:>5}"
                  f"{r['prompts_per_s_per_gpu']:>14.3f}{r['power_w_per_gpu']:>7.0f}{r['j_per_prompt']:>10.1f}"
                  f"{r['ttft_p95_ms']:>8.0f}ms{r['tpot_p95_ms']:>8.1f}ms{r['memory_gib_per_gpu']:>8.1f}  "
                  f"{src['throughput']}/{src['power']} (W +/-{100 * r['power_uncertainty_rel']:.0f} %)"
                  + (f" stack x{r['stack_factor']:.2f}" if r.get("stack_factor") is not None else "")
                  + (f" corr x{r['speed_correction']:.3f}" if r.get("speed_correction", 1.0) != 1.0 else ""))
    loro, loso = per_part_medians(mlperf, "loro"), per_part_medians(mlperf, "loso")
    print()
    print("(e) MLPerf median |error| per part: " + "; ".join(
        f"{p} in {100 * per_part_medians(mlperf, 'in')[p]:.1f} % LORO {100 * loro.get(p, float('nan')):.1f} % "
        f"LOSO {100 * loso.get(p, float('nan')):.1f} %" for p in loro))
    orders = {k: pairwise_order(mlperf, k) for k in ("in", "loro", "planner")}
    for k, (right, total, wrong) in orders.items():
        print(f"(f) pairwise order within rounds, {k}: {right}/{total} pairs right"
              + ("" if not wrong else "; wrong: " + "; ".join(wrong)))
    ok_a = all(x <= MLPERF_PART_TARGET for x in (*loro.values(), *loso.values()))
    right, total, _ = orders["loro"]
    ok_b = total > 0 and right >= ORDER_TARGET * total
    ok_c = within["path"] >= ROWS_WITHIN_TARGET
    loo_medians = [r["tokens_median"] for r in b]
    ok_d = all(x <= LOO_MEDIAN_TARGET for x in loo_medians)
    print()
    print(f"target (a) MLPerf leave-one-round-out and leave-one-submitter-out median |error| per part <= "
          f"{100 * MLPERF_PART_TARGET:.0f} %: {'met' if ok_a else 'MISSED'}")
    print(f"target (b) pairwise order within rounds (leave-one-round-out) >= {100 * ORDER_TARGET:.0f} %: "
          f"{right}/{total}, {'met' if ok_b else 'MISSED'}")
    print(f"target (c) ML.ENERGY rows within {100 * ROW_TARGET:.0f} % (tokens/s) >= {ROWS_WITHIN_TARGET} of {len(rows)}, "
          f"on the planner's path out of sample: {within['path']}, {'met' if ok_c else 'MISSED'} "
          f"(the model alone: {within['err_tokens']})")
    print(f"(previous target) leave-one-GPU-out median <= {100 * LOO_MEDIAN_TARGET:.0f} % for every (GPU, workload): "
          f"{'met' if ok_d else 'MISSED'}")
    return ok_a and ok_b, ok_c



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.model", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the three tables as JSON to this file")
    args = ap.parse_args(argv)
    a, b, c = table_a(), table_b(), table_c()
    ok_a, ok_b = print_report(a, b, c)  # (MLPerf targets, ML.ENERGY row target)
    if args.json:
        args.json.write_text(json.dumps({"a_rows": a[0], "a_left_out": [r["source"] for r in a[1]],
                                         "a_mlperf": a[2], "b_leave_one_gpu_out": b, "c_presets": c},
                                        indent=1, default=float), "utf-8")
    return 0 if ok_a and ok_b else 2


if __name__ == "__main__":
    raise SystemExit(main())
