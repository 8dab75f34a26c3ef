"""Regenerate policies/data/mlperf_results.toml: every MLPerf Inference llama2-70b result
the cross-vendor stack factors are fitted on, and its [gaps] table.

    python policies/data/make_mlperf.py REPO_V4.1 REPO_V5.1 REPO_V6.0 > policies/data/mlperf_results.toml

REPO_*: bare clones (read with `git show`, no work tree) of
https://github.com/mlcommons/inference_results_v4.1 and .../inference_results_v5.1 (at
HEAD), and of the fork https://github.com/gbeezybez/inference_results_v6.0 at its last
MLCommons commit 4d3916ac9cf474b679cdfcf492d43a0559418ad1 (the official v6.0 repository
was not in the stored snapshots; the fork's later commits only add an unrelated open
submission). A developer tool (reads git objects, prints TOML); the package only reads the
committed output. Kept, per submitted system: llama2-70b-99 (the 99.9 entry is, for every
system here, the same run or within 1 %; where only the 99.9 entry could be read, the row
says so in `note`), Offline and Server, valid results, one node, on a part of the
catalog's SXM/OAM rows (H100-SXM, H200-SXM, B200-SXM, MI300X, MI325X, MI355X; PCIe/NVL
cards, GH200, GB200/GB300, B300 and MI350X/MI350P are other parts), closed division (open
only for MI355X, which had no closed result in v5.1), no MaxQ / power-capped
(Power_Cap_*), depth-pruned or sparse variants. Each row: round, division, submitter,
system, part, accelerators, scenario, weight precision (the result's measurements JSON,
`weight_data_types`, corrected where the submission's code says otherwise: `_precision`,
PRECISION_FIXES), tokens/s and samples/s of the whole system (mlperf_log_summary.txt),
the serving framework as the system description gives it, the engine it is read as
(TensorRT-LLM, vLLM, MangoBoost LLMBoost: a vLLM-based platform; from the description's
framework and other_software_stack, or ENGINE_FIXES where they name none), and the file
with the commit it was read at.

Rounds whose repository could not be fetched whole are transcribed by hand below, each row
with the file and commit its figures were read from (HAND_ROWS): v4.0
(mlcommons/inference_results_v4.0 at 3c4a1cf196b70175cfe7c59e067cd1d923aa4f3f, 1.4 GB,
read file by file from the stored index, which keeps only the llama2-70b-99.9 copy of each
result), v5.0 (the mirror ntuhpc/mlperf_inference_results_v5.0) and v6.1
(mlcommons/inference_results_v6.1 at e777c7be4514bc1e28f657ad7c30167167fb7c41: only its
summary.json was stored; it gives tokens/s but not samples/s, so samples_per_s = 0 there).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

PARTS = (("MI355X", "MI355X"), ("MI325X", "MI325X"), ("MI300X", "MI300X"), ("B200", "B200"),
         ("H200", "H200"), ("H100", "H100"))
OTHER_PARTS = ("GH200", "GB200", "GB300", "B300", "MI350", "PCIE", "NVL")  # not the catalog's SXM/OAM parts
RESULT = re.compile(r"(closed|open)/([^/]+)/results/([^/]+)/llama2-70b-99/(Offline|Server)/performance/run_1/"
                    r"mlperf_log_summary.txt$")

EXCLUDED_SYSTEMS = ("MaxQ", "Power_Cap", "DepthPruned", "Sparse")  # power-capped, pruned or sparsified variants

V60_COMMIT = "4d3916ac9cf474b679cdfcf492d43a0559418ad1"  # gbeezybez/inference_results_v6.0: last MLCommons commit
V60 = "https://github.com/gbeezybez/inference_results_v6.0/blob/" + V60_COMMIT

# (round, submitter, system) -> (engine, evidence): system descriptions whose framework and
# other_software_stack name no serving engine.
_AMD_HARNESS = ("vllm", "vLLM: the system runs AMD's MLPerf harness, whose setup/llama2-70b-99/build_docker.sh builds "
                         "the image from a vllm_gfx9*.config (vLLM with the llama2-70b_vllm*.patch)")
ENGINE_FIXES = {
    ("v6.0", "GigaComputing", "8xMI355X_2xEPYC-9575F"): (_AMD_HARNESS[0], _AMD_HARNESS[1] + ": "
        f"{V60}/closed/GigaComputing/setup/llama2-70b-99/build_docker.sh"),
    ("v6.0", "ORACLE", "8xMI355X_2xEPYC_9575F"): (_AMD_HARNESS[0], "framework 'N/A'; " + _AMD_HARNESS[1] + ": "
        f"{V60}/closed/ORACLE/setup/llama2-70b-99/build_docker.sh"),
    ("v6.0", "Supermicro", "8xMI355X_2xEPYC-9575F"): (_AMD_HARNESS[0], "framework 'TODO'; " + _AMD_HARNESS[1] + ": "
        f"{V60}/closed/Supermicro/setup/llama2-70b-99/vllm_gfx9xx.config"),
}

# (round, submitter, system) -> (precision, evidence): weights whose measurements JSON is wrong.
PRECISION_FIXES = {
    ("v6.0", "Dell_MangoBoost", "8xMI355X_2xEPYC_9965"): ("fp4", "measurements JSON says fp8, but the result's README "
        "(1.1) runs MI355X on AMD's FP4 model ('The FP8 model will be used by MI300X and MI325X. Then, please download "
        "the FP4 model according ... to AMD's guideline') and its tokens/s is the other FP4 MI355X systems': "
        f"{V60}/closed/Dell_MangoBoost/results/8xMI355X_2xEPYC_9965/llama2-70b-99/Offline/README.md"),
}


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


def engine(framework: str, other: str = "") -> str:
    """The serving engine a system description's framework (else its other software) names."""
    for text in (framework, other):
        if "TensorRT" in text:
            return "tensorrt-llm"
        if "LLMBoost" in text:
            return "llmboost"
        if "vllm" in text.lower():
            return "vllm"
    return "other"


def part_of(accelerator: str) -> str | None:
    """The catalog part an accelerator_model_name is, or None (another part)."""
    accel = accelerator.replace(" ", "-").upper()
    if any(x in accel for x in OTHER_PARTS):
        return None
    return next((p for key, p in PARTS if key in accel), None)


def rows(round_: str, repo: str, github: str, ref: str = "HEAD") -> list[dict]:
    commit = _git(repo, "rev-parse", ref).strip()
    out = []
    for path in _git(repo, "ls-tree", "-r", "--name-only", commit).splitlines():
        m = RESULT.match(path)
        if not m:
            continue
        division, submitter, system, scenario = m.groups()
        try:
            desc = json.loads(_git(repo, "show", f"{commit}:{division}/{submitter}/systems/{system}.json"))
        except ValueError:
            continue
        part = part_of(desc.get("accelerator_model_name", ""))
        nodes = int(desc.get("number_of_nodes", 1) or 1)
        if part is None or nodes != 1 or any(x in system for x in EXCLUDED_SYSTEMS):
            continue
        if division == "open" and part != "MI355X":  # open: changed models; MI355X has no closed result in v5.1
            continue
        summary = _git(repo, "show", f"{commit}:{path}")
        tokens = re.search(r"tokens per second\s*:\s*([\d.]+)", summary, re.I)
        samples = re.search(r"samples per second\s*:\s*([\d.]+)", summary, re.I)
        if not tokens or "Result is : VALID" not in summary:
            continue
        precision = ""  # v4.1/v5.1: measurements/<system>/...; v6.0: results/<system>/.../<scenario>/measurements.json
        for mdir in (f"{division}/{submitter}/measurements/{system}/llama2-70b-99/{scenario}/",
                     f"{division}/{submitter}/results/{system}/llama2-70b-99/{scenario}/"):
            for f in _git(repo, "ls-tree", "--name-only", commit, mdir).splitlines():
                if f.endswith(".json"):
                    precision = json.loads(_git(repo, "show", f"{commit}:{f}") or "{}").get("weight_data_types", "")
            if precision:
                break
        framework = desc.get("framework", "")
        row = {"round": round_, "division": division, "submitter": submitter, "system": system,
               "part": part, "accelerators": int(desc["accelerators_per_node"]), "scenario": scenario,
               "precision": _precision(round_, part, precision),
               "weight_data_types": precision, "tokens_per_s": float(tokens.group(1)),
               "samples_per_s": float(samples.group(1)) if samples else 0.0,
               "framework": framework, "engine": engine(framework, desc.get("other_software_stack", ""))}
        notes = []
        key = (round_, submitter, system)
        if key in ENGINE_FIXES:
            row["engine"], why = ENGINE_FIXES[key]
            notes.append("engine: " + why)
        if key in PRECISION_FIXES:
            row["precision"], why = PRECISION_FIXES[key]
            notes.append("precision: " + why)
        if notes:
            row["note"] = "; ".join(notes)
        row["source"] = f"{github}/blob/{commit}/{path}"
        out.append(row)
    return out


# ------------------------------------------------------------------ rows transcribed by hand
# Each figure was read from the file its source names, at that commit.

_V40 = "https://github.com/mlcommons/inference_results_v4.0/blob/3c4a1cf196b70175cfe7c59e067cd1d923aa4f3f"
_V40_FRAMEWORK = "TensorRT-LLM (NVIDIA's v4.0 harness, system *_TRT)"
_V40_NOTE = ("llama2-70b-99.9 entry (the stored index keeps one copy of identical files); precision FP8 as NVIDIA's "
             "v4.0/v4.1 code for H100/H200 (weight_data_types not read)")
# submitter, system, part, accelerators, Offline (tokens/s, samples/s), Server (tokens/s, samples/s)
V40 = (
    ("NVIDIA", "H200-SXM-141GBx8_TRT", "H200", 8, (27738.3, 94.6223), (26485.43, 90.35)),
    ("NVIDIA", "H200-SXM-141GB-CTSx8_TRT", "H200", 8, (31712.0, 108.185), (29526.33, 100.73)),
    ("NVIDIA", "H200-SXM-141GB-CTSx1_TRT", "H200", 1, (4020.31, 13.7261), (3731.83, 12.73)),
    ("NVIDIA", "DGX-H100_H100-SXM-80GBx8_TRT", "H100", 8, (21805.8, 74.699), (20556.40, 70.42)),
    ("NVIDIA", "DGX-H100_H100-SXM-80GBx2_TRT", "H100", 2, (5539.47, 18.9752), (5271.98, 18.06)),
    ("Dell", "XE9680_H100_SXM_80GBx8_TRT", "H100", 8, (21884.2, 74.9747), (20958.48, 71.80)),
    ("Dell", "XE8640_H100_SXM_80GBx4_TRT", "H100", 4, (9896.75, 33.8626), (9063.78, 31.05)),
    ("Dell", "XE9640_H100_SXM_80GBX4_TRT", "H100", 4, (9248.35, 31.6981), (8812.69, 30.19)),
    ("Fujitsu", "GX2560M7_H100_SXM_80GBx4_TRT", "H100", 4, (8435.97, 28.9009), (8097.95, 27.74)),
    ("GigaComputing", "GIGABYTE-G593-SD1_DGX-H100_H100-SXM-80GBx8_TRT", "H100", 8, (22289.7, 76.3162),
     (21146.75, 72.44)),
    ("Google", "H100-SXM-80GBx8_TRT", "H100", 8, (20992.0, 71.9176), (20287.78, 69.50)),
    ("HPE", "HPE_Cray_XD670_H100_SXM_80GBx8_TRT_TRT", "H100", 8, (20973.2, 71.8287), (18908.88, 64.77)),
    ("Oracle", "OCI-H100_H100-SXM-80GBx8_TRT", "H100", 8, (21032.4, 72.055), (20370.48, 69.78)),
    ("Supermicro", "SYS_821GE_TNHR_H100_SXM_80GBx8_TRT", "H100", 8, (22202.2, 76.0618), (21504.11, 73.67)),
)

_V50 = "https://github.com/ntuhpc/mlperf_inference_results_v5.0/blob/cf354115915ea369f05db424b051da8c5bf957dc"

_V61 = "https://github.com/mlcommons/inference_results_v6.1/blob/e777c7be4514bc1e28f657ad7c30167167fb7c41"
_V61_NOTE = ("llama2-70b-99.9 entry of summary.json (the round's systems submitted 99.9 only); tokens/s is its "
             "'Result', samples/s not given")
# submitter, system (Platform), part, framework, engine note, Offline tokens/s, Server tokens/s, summary.json entries
V61 = (
    ("AMD", "8xMI355X_2xEPYC_9575F", "MI355X", "PyTorch 2.10.0+git8514f05, ROCm 7.2.2",
     "engine vLLM: summary.json's framework names none; AMD's harness is vLLM (src/harness_llm/backends/vllm in "
     "this repository; the v6.0 description of the same system lists vllm-11b6af52: "
     f"{V60}/closed/AMD/systems/8xMI355X_2xEPYC_9575F.json)", 106517.0, 103275.0, "9, 10"),
    ("CoreWeave", "B200-SXM-180GBx8_TRT", "B200",
     "TensorRT-LLM feat/1.2-mlpinf, NVIDIA Dynamo mlperf-v6.0-dynamo-v0.8.0", "", 102703.0, 102398.0, "87, 88"),
    ("Dell", "XE9785L_8xMI355X", "MI355X", "vLLM 0.22.0, PyTorch 2.10.0, ROCm 7.2.2", "", 103792.0, 103932.0,
     "144, 145"),
    ("HPE", "HPE_XD685_MI355X_288GBx8_vLLM", "MI355X", "vLLM 0.22.0, PyTorch 2.10.0, ROCm 7.2.2", "", 102991.0,
     101979.0, "221, 222"),
    ("MiTAC", "8xMI355X_2xEPYC-9755", "MI355X", "vLLM 0.22.0, PyTorch 2.10.0+git8514f05, ROCm 7.2.53211", "",
     104904.0, 104541.0, "278, 279"),
    ("Oracle", "8xMI355X_2xEPYC-9575F", "MI355X", "vLLM 0.22.0, PyTorch 2.10.0, ROCm 7.2.2", "", 101553.0,
     100392.0, "360, 361"),
    ("Supermicro", "8xMI355X_2xEPYC-9575F", "MI355X", "vLLM 0.22.0, PyTorch 2.10.0, ROCm 7.2.4", "", 102243.0,
     103032.0, "440, 441"),
)


def _row(round_, division, submitter, system, part, accelerators, scenario, precision, declared, tokens, samples,
         framework, engine_, note, source) -> dict:
    r = {"round": round_, "division": division, "submitter": submitter, "system": system, "part": part,
         "accelerators": accelerators, "scenario": scenario, "precision": precision, "weight_data_types": declared,
         "tokens_per_s": float(tokens), "samples_per_s": float(samples), "framework": framework, "engine": engine_}
    if note:
        r["note"] = note
    r["source"] = source
    return r


def hand_rows() -> list[dict]:
    """v4.0, v5.0 and v6.1 rows, transcribed from the files their sources name."""
    out = []
    for sub, system, part, n, off, srv in V40:
        for scenario, (tok, smp) in (("Offline", off), ("Server", srv)):
            out.append(_row("v4.0", "closed", sub, system, part, n, scenario, "fp8", "", tok, smp, _V40_FRAMEWORK,
                            "tensorrt-llm", _V40_NOTE,
                            f"{_V40}/closed/{sub}/results/{system}/llama2-70b-99.9/{scenario}/performance/run_1/"
                            "mlperf_log_summary.txt"))
    v50 = f"{_V50}/closed/%s/results/%s/%s/%s/performance/run_1/mlperf_log_summary.txt"
    out += [
        _row("v5.0", "closed", "NVIDIA", "DGX-H100_H100-SXM-80GBx8_TRT", "H100", 8, "Offline", "fp8", "fp8", 31306.8,
             107.256, "TensorRT-LLM (NVIDIA v5.0 submission)", "tensorrt-llm", "",
             v50 % ("NVIDIA", "DGX-H100_H100-SXM-80GBx8_TRT", "llama2-70b-99", "Offline")),
        _row("v5.0", "closed", "NVIDIA", "H200-SXM-141GBx8_TRT", "H200", 8, "Offline", "fp8", "fp8", 34988.2, 120.008,
             "TensorRT-LLM (NVIDIA v5.0 submission)", "tensorrt-llm", "",
             v50 % ("NVIDIA", "H200-SXM-141GBx8_TRT", "llama2-70b-99", "Offline")),
        _row("v5.0", "closed", "NVIDIA", "B200-SXM-180GBx8_TRT", "B200", 8, "Offline", "fp4", "fp4", 98858.0, 363.895,
             "TensorRT-LLM (NVIDIA v5.0 submission)", "tensorrt-llm",
             "llama2-70b-99.9 entry: the -99 Offline summary is not in the mirror's index",
             v50 % ("NVIDIA", "B200-SXM-180GBx8_TRT", "llama2-70b-99.9", "Offline")),
        _row("v5.0", "closed", "AMD", "8xMI325X_2xEPYC_9575F", "MI325X", 8, "Offline", "fp8", "fp8", 33928.1, 114.262,
             "vLLM (AMD v5.0 submission)", "vllm", "llama2-70b-99.9 entry",
             v50 % ("AMD", "8xMI325X_2xEPYC_9575F", "llama2-70b-99.9", "Offline")),
        _row("v5.0", "closed", "AMD", "8xMI325X_2xEPYC_9575F", "MI325X", 8, "Server", "fp8", "fp8", 30724.51, 103.83,
             "vLLM (AMD v5.0 submission)", "vllm", "llama2-70b-99.9 entry",
             v50 % ("AMD", "8xMI325X_2xEPYC_9575F", "llama2-70b-99.9", "Server")),
    ]
    for sub, system, part, framework, why, off, srv, entries in V61:
        note = f"{_V61_NOTE} (entries {entries})" + (f"; {why}" if why else "")
        for scenario, tok in (("Offline", off), ("Server", srv)):
            out.append(_row("v6.1", "closed", sub, system, part, 8, scenario, "fp4", "fp4", tok, 0.0, framework,
                            engine(framework) if not why else "vllm", note, f"{_V61}/summary.json"))
    return out


GAPS = (
    "A100: no llama2-70b result on an A100-SXM in v4.0/v4.1/v5.0/v5.1/v6.0/v6.1 closed (A100 is in the ML.ENERGY v2 "
    "fit only)",
    "MI355X: no closed-division llama2-70b result in v5.1; that round's one row is AMD's open-division MXFP4 "
    "submission (open: the model may be changed, so it is kept but read with care); closed MI355X results are in "
    "v6.0 and v6.1",
    "v4.0: no AMD part was submitted for llama2-70b; read file by file from the stored index, which holds only the "
    "llama2-70b-99.9 copy of each result (the -99 entries are the same runs); NVIDIA H200-SXM-141GBx1 and Dell "
    "XE9680_IntelXeon8480 llama2-70b summaries not in the index; weight_data_types not read (FP8 as the v4.x code)",
    "v5.0: only the four systems above could be read (the official repository's snapshot was too large to fetch; "
    "the mirror's index holds NVIDIA's and AMD's own systems); v5.0 H100/H200/B200 Server summaries not in the "
    "mirror's index",
    "v6.0: the official repository was not in the stored snapshots; read from the fork gbeezybez/"
    "inference_results_v6.0 at its last MLCommons commit 4d3916a; no H100/H200 llama2-70b result; Dell_MangoBoost's "
    "Power_Cap_1000W system (power-capped) and 3-node heterogeneous system left out",
    "v6.1: only summary.json was stored (tokens/s, no samples/s, no system JSONs or logs); every system submitted "
    "llama2-70b-99.9 only; no H100/H200 and no NVIDIA-own B200 result (NVIDIA submitted B300/GB200/GB300), so "
    "CoreWeave's B200 is the round's only TensorRT-LLM reference; MI350X/MI350P, B300, GB300 and multi-node systems "
    "are other parts",
    "H100 in v5.1: no single-node SXM llama2-70b-99 result (Cisco's are 2- and 4-node)",
    "InferenceMAX (SemiAnalysis): its repository holds the benchmark configurations (vLLM/SGLang launch commands "
    "per GPU); the result tables are published as CI artifacts and on its dashboard, not found as files in the "
    "stored repositories",
    "MLPerf llama2-70b mean input length: not in the result logs (the OpenOrca subset's prompts; the Azure conv "
    "trace's mean stands in)",
    "Interactive scenario (TTFT 450 ms / TPOT 40 ms) results are in v5.0 and later but not used (the model's "
    "TTFT/TPOT limits are the Server scenario's)",
)


def _toml(r: dict) -> str:
    lines = ["[[result]]"]
    for k, v in r.items():
        lines.append(f"{k} = {json.dumps(v)}" if not isinstance(v, float) else f"{k} = {v!r}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    v41, v51, v60 = argv[1], argv[2], argv[3]
    out = rows("v4.1", v41, "https://github.com/mlcommons/inference_results_v4.1")
    out += rows("v5.1", v51, "https://github.com/mlcommons/inference_results_v5.1")
    out += rows("v6.0", v60, "https://github.com/gbeezybez/inference_results_v6.0", V60_COMMIT)
    out += hand_rows()
    print("# Generated by policies/data/make_mlperf.py (see its docstring): v4.1, v5.1 and v6.0 read from the")
    print("# repositories' git objects; v4.0, v5.0 and v6.1 transcribed in make_mlperf.py from the files their")
    print("# sources name. MLPerf Inference Datacenter llama2-70b-99 (Llama-2-70b-chat, OpenOrca), per system:")
    print("# tokens_per_s and samples_per_s of the whole system; per GPU = / accelerators.\n")
    print("\n\n".join(_toml(r) for r in sorted(out, key=lambda r: (r["round"], r["part"], r["submitter"],
                                                                   r["system"], r["scenario"]))))
    print("\n[gaps]\nfigures = [")
    for g in GAPS:
        print(f"  {json.dumps(g)},")
    print("]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
