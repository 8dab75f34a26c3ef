"""Regenerate policies/data/profiles.toml from the ML.ENERGY data in ../shared/data/energy.

    python policies/data/make_profiles.py [--energy-dir ../shared/data/energy] > policies/data/profiles.toml

A developer tool (reads files, prints TOML); the package only reads the committed output.

Workload classes and their public measurements:

* `llm-chat-8b`:  Llama-3.1-8B-Instruct, lm-arena-chat (ML.ENERGY v3: H100, B200) and the
  v2 chat task (A100-SXM4-40GB).
* `llm-chat-70b`: Llama-3.1-70B-Instruct, same sources (v3: 4xH100, 2xB200; v2: A100).
* `llm-code`:     Qwen3-Coder-30B-A3B-Instruct, sourcegraph-fim (v3: H100, B200).
* `llm-reason`:   Qwen3-8B, gpqa (v3: H100, B200).
* `train`:        compute-bound fine-tuning/training step; no public per-GPU measurement, so
  every model is roofline-scaled from a nominal H100 reference (1 sample/s/GPU at 85% TDP).

Per measured (model, GPU): among the configurations, the one with the lowest J per output
token whose p95 inter-token latency is at most 100 ms (a batch job still wants a usable
stream). One prompt = one request with that configuration's mean output length. Per GPU:
`prompts_per_s = output_tokens_per_s / avg_output_len / num_gpus`, `power_w = avg_power /
num_gpus`; per-prompt latency p50/p95 = median/p95 ITL x avg_output_len (decode dominates).

Roofline rule for models without a measurement (MI300X, MI325X, MI355X, H200, and A100
where no v2 row exists): decode is memory-bandwidth-bound, so from the measured model with
the closest HBM bandwidth: throughput x (HBM TB/s ratio), latency / (HBM TB/s ratio), power
x (TDP ratio). For `train` the throughput ratio is the BF16 dense TFLOP/s ratio instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

CLASSES = {
    "llm-chat-8b": {"v3": ("lm-arena-chat", "meta-llama/Llama-3.1-8B-Instruct"),
                    "v2": ("chat", "meta-llama/Meta-Llama-3.1-8B-Instruct")},
    "llm-chat-70b": {"v3": ("lm-arena-chat", "meta-llama/Llama-3.1-70B-Instruct"),
                     "v2": ("chat", "meta-llama/Meta-Llama-3.1-70B-Instruct")},
    "llm-code": {"v3": ("sourcegraph-fim", "Qwen/Qwen3-Coder-30B-A3B-Instruct")},
    "llm-reason": {"v3": ("gpqa", "Qwen/Qwen3-8B")},
}
MAX_P95_ITL_MS = 100.0
V2_GPU = {"A100-SXM4-40GB": "A100", "H100 80GB HBM3": "H100"}


def _catalog() -> dict:
    return tomllib.loads((Path(__file__).parent / "catalog.toml").read_text("utf-8"))


def measured(energy_dir: Path) -> dict[tuple[str, str], dict]:
    """(class, GPU model) -> profile fields from the public data."""
    out: dict[tuple[str, str], dict] = {}
    for cls, src in CLASSES.items():
        task, model_id = src["v3"]
        data = json.loads((energy_dir / "mlenergy_v3" / "tasks" / f"{task}.json").read_text("utf-8"))
        for gpu in ("H100", "B200"):
            rows = [c for c in data["configurations"] if c["model_id"] == model_id and c["gpu_model"] == gpu
                    and c["p95_itl_ms"] <= MAX_P95_ITL_MS]
            if not rows:
                continue
            c = min(rows, key=lambda c: c["energy_per_token_joules"])
            n, out_len = c["num_gpus"], c["avg_output_len"]
            out[(cls, gpu)] = {
                "prompts_per_s": c["output_throughput_tokens_per_sec"] / out_len / n,
                "power_w": c["avg_power_watts"] / n,
                "latency_p50_ms": c["median_itl_ms"] * out_len,
                "latency_p95_ms": c["p95_itl_ms"] * out_len,
                "source": f"ML.ENERGY v3 {task} {model_id} {n}x{gpu} max_num_seqs={c['max_num_seqs']}",
            }
        if "v2" in src:
            task, model_id = src["v2"]
            for gpu_dir, gpu in V2_GPU.items():
                if (cls, gpu) in out:
                    continue
                d = energy_dir / "mlenergy_v2" / "llm_text_generation" / task / gpu_dir / model_id
                rows = []
                for f in sorted(d.glob("*.json")) if d.is_dir() else []:
                    r = json.loads(f.read_text("utf-8"))
                    if r["Avg TPOT (s)"] * 1000 <= MAX_P95_ITL_MS:
                        rows.append((r["Energy/req (J)"] / r["Avg Output Tokens"], f.name, r))
                if not rows:
                    continue
                jpt, name, r = min(rows)
                n = r["TP"] * r["PP"]
                out_len = r["Avg Output Tokens"]
                tpot_ms = r["Avg TPOT (s)"] * 1000
                out[(cls, gpu)] = {
                    "prompts_per_s": r["Token tput (tok/s)"] / out_len / n,
                    "power_w": jpt * r["Token tput (tok/s)"] / n,
                    "latency_p50_ms": tpot_ms * out_len,
                    "latency_p95_ms": 1.5 * tpot_ms * out_len,  # v2 has a mean only: p95 ~ 1.5 x mean
                    "source": f"ML.ENERGY v2 {task} {model_id} {n}x{gpu} {name}",
                }
    return out


def roofline(cls: str, model: str, ref: str, ref_fields: dict, cat: dict, by: str) -> dict:
    ratio = cat[model][by] / cat[ref][by]
    power = cat[model]["tdp_w"] / cat[ref]["tdp_w"]
    return {
        "prompts_per_s": ref_fields["prompts_per_s"] * ratio,
        "power_w": ref_fields["power_w"] * power,
        "latency_p50_ms": ref_fields["latency_p50_ms"] / ratio,
        "latency_p95_ms": ref_fields["latency_p95_ms"] / ratio,
        "source": f"roofline from {ref} ({by} x{ratio:.2f}, TDP x{power:.2f})",
    }


def build(energy_dir: Path) -> list[dict]:
    cat = _catalog()
    meas = measured(energy_dir)
    rows = []
    for cls in list(CLASSES) + ["train"]:
        have = {gpu: f for (c, gpu), f in meas.items() if c == cls}
        if cls == "train":
            have = {}
            ref = {"prompts_per_s": 1.0, "power_w": 0.85 * cat["H100"]["tdp_w"], "latency_p50_ms": 1000.0,
                   "latency_p95_ms": 1100.0}
        for model in cat:
            if model in have:
                fields = dict(have[model])
            elif cls == "train":
                fields = roofline(cls, model, "H100", ref, cat, "bf16_dense_tflops")
                fields["source"] = "nominal H100 training step, " + fields["source"]
            else:
                near = min(have, key=lambda g: abs(cat[g]["hbm_tb_per_s"] - cat[model]["hbm_tb_per_s"]))
                fields = roofline(cls, model, near, have[near], cat, "hbm_tb_per_s")
            rows.append({"workload": cls, "model": model, **fields})
    return rows


def to_toml(rows: list[dict]) -> str:
    head = [
        "# Workload profiles per (workload class, GPU model), per GPU, data-parallel over k GPUs.",
        "# Generated by policies/data/make_profiles.py from ../shared/data/energy (ML.ENERGY",
        "# leaderboard v2 and v3: Apache-2.0 data, Chung et al., NeurIPS D&B 2025). GPU-only energy.",
        "# prompts_per_s: requests/s per GPU at the lowest-J/token config with p95 ITL <= 100 ms;",
        "# power_w: mean GPU power per GPU; latency_*_ms: per-prompt decode latency (ITL x output length).",
        "# Roofline rule where a model has no measurement: decode is memory-bandwidth-bound, so from",
        "# the measured GPU with the closest HBM bandwidth, throughput x HBM ratio, latency / HBM ratio,",
        "# power x TDP ratio. `train` (compute-bound) scales by BF16 TFLOP/s from a nominal H100 step.",
        "",
    ]
    body = []
    for r in rows:
        body += ["[[profile]]", f'workload = "{r["workload"]}"', f'model = "{r["model"]}"']
        for key in ("prompts_per_s", "power_w", "latency_p50_ms", "latency_p95_ms"):
            body.append(f"{key} = {r[key]:.6g}")
        body += [f'source = "{r["source"]}"', ""]
    return "\n".join(head + body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--energy-dir", type=Path,
                    default=Path(__file__).resolve().parents[3] / "shared" / "data" / "energy")
    args = ap.parse_args(argv)
    sys.stdout.write(to_toml(build(args.energy_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
