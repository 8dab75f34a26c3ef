"""Regenerate policies/data/mlperf_results.toml: every MLPerf Inference llama2-70b result
the cross-vendor stack factors are fitted on.

    python policies/data/make_mlperf.py REPO_V4.1 REPO_V5.1 > policies/data/mlperf_results.toml

REPO_*: bare clones of https://github.com/mlcommons/inference_results_v4.1 and
https://github.com/mlcommons/inference_results_v5.1 (read with `git show`, no work tree).
A developer tool (reads git objects, prints TOML); the package only reads the committed
output. Kept, per submitted system: llama2-70b-99 (the 99.9 entry is, for every system
here, the same run or within 1 %), Offline and Server, valid results, one node, on a
part of the catalog's SXM/OAM rows (H100-SXM, H200-SXM, B200-SXM, MI300X, MI325X,
MI355X; PCIe/NVL cards, GH200 and GB200 are other parts). Each row: round, division,
submitter, system, part, accelerators, scenario, weight precision (the result's
measurements JSON, `weight_data_types`), tokens/s and samples/s of the whole system
(mlperf_log_summary.txt), the serving framework as the system description gives it, the
engine it is read as (TensorRT-LLM, vLLM, MangoBoost LLMBoost: a vLLM-based platform),
and the file with the commit it was read at. v5.0 rows (its repository was too large to
fetch here) are appended by hand from the mirror named in their source.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

PARTS = (("MI355X", "MI355X"), ("MI325X", "MI325X"), ("MI300X", "MI300X"), ("B200-SXM", "B200"),
         ("H200-SXM", "H200"), ("H100-SXM", "H100"))
RESULT = re.compile(r"(closed|open)/([^/]+)/results/([^/]+)/llama2-70b-99/(Offline|Server)/performance/run_1/"
                    r"mlperf_log_summary.txt$")


EXCLUDED_SYSTEMS = ("MaxQ", "DepthPruned", "Sparse")  # power-capped, pruned or sparsified model variants


def _precision(round_: str, part: str, declared: str) -> str:
    """The weights' precision: the measurements JSON's weight_data_types, except where v4.1's
    JSONs left the template's "fp16" while the submitter's code ran FP8 (NVIDIA:
    closed/NVIDIA/configs/llama2-70b/Offline/__init__.py, `use_fp8 = True` for every H100/
    H200 config; AMD: code/llama2-70b-99.9/test_VllmFp8, quark FP8) or FP4 (B200 preview)."""
    declared = {"mxfp4": "fp4", "nvfp4": "fp4"}.get(declared.lower(), declared.lower())
    if round_ == "v4.1" and declared == "fp16":
        return "fp4" if part == "B200" else "fp8"
    return declared


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=False).stdout


def engine(framework: str) -> str:
    """The serving engine a system description's framework names."""
    if "TensorRT" in framework:
        return "tensorrt-llm"
    if "LLMBoost" in framework:
        return "llmboost"
    if "vllm" in framework.lower():
        return "vllm"
    return "other"


def rows(round_: str, repo: str, github: str) -> list[dict]:
    commit = _git(repo, "rev-parse", "HEAD").strip()
    out = []
    for path in _git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines():
        m = RESULT.match(path)
        if not m:
            continue
        division, submitter, system, scenario = m.groups()
        try:
            desc = json.loads(_git(repo, "show", f"HEAD:{division}/{submitter}/systems/{system}.json"))
        except ValueError:
            continue
        accel = desc.get("accelerator_model_name", "").replace(" ", "-").upper()
        part = next((p for key, p in PARTS if key in accel and "GH200" not in accel and "GB200" not in accel), None)
        nodes = int(desc.get("number_of_nodes", 1) or 1)
        if part is None or nodes != 1 or any(x in system for x in EXCLUDED_SYSTEMS):
            continue
        if division == "open" and part != "MI355X":  # open: changed models; MI355X has no closed result
            continue
        summary = _git(repo, "show", f"HEAD:{path}")
        tokens = re.search(r"tokens per second\s*:\s*([\d.]+)", summary, re.I)
        samples = re.search(r"samples per second\s*:\s*([\d.]+)", summary, re.I)
        if not tokens or "Result is : VALID" not in summary:
            continue
        mdir = f"{division}/{submitter}/measurements/{system}/llama2-70b-99/{scenario}/"
        precision = ""
        for f in _git(repo, "ls-tree", "--name-only", "HEAD", mdir).splitlines():
            if f.endswith(".json"):
                precision = json.loads(_git(repo, "show", f"HEAD:{f}") or "{}").get("weight_data_types", "")
        out.append({"round": round_, "division": division, "submitter": submitter, "system": system,
                    "part": part, "accelerators": int(desc["accelerators_per_node"]), "scenario": scenario,
                    "precision": _precision(round_, part, precision),
                    "weight_data_types": precision, "tokens_per_s": float(tokens.group(1)),
                    "samples_per_s": float(samples.group(1)) if samples else 0.0,
                    "framework": desc.get("framework", ""), "engine": engine(desc.get("framework", "")),
                    "source": f"{github}/blob/{commit}/{path}"})
    return out


def _toml(r: dict) -> str:
    lines = ["[[result]]"]
    for k, v in r.items():
        lines.append(f"{k} = {json.dumps(v)}" if not isinstance(v, float) else f"{k} = {v!r}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    v41, v51 = argv[1], argv[2]
    out = rows("v4.1", v41, "https://github.com/mlcommons/inference_results_v4.1")
    out += rows("v5.1", v51, "https://github.com/mlcommons/inference_results_v5.1")
    print("# Generated by policies/data/make_mlperf.py (see its docstring); v5.0 rows appended by hand.")
    print("# MLPerf Inference Datacenter llama2-70b-99 (Llama-2-70b-chat, OpenOrca), per system:")
    print("# tokens_per_s and samples_per_s of the whole system; per GPU = / accelerators.\n")
    print("\n\n".join(_toml(r) for r in sorted(out, key=lambda r: (r["round"], r["part"], r["submitter"],
                                                                   r["system"], r["scenario"]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
