"""Cross-vendor LLM performance and energy model: one roofline fit over public measurements.

What it answers: for a workload (model size, precision, mean input/output tokens), a GPU
model, a tensor-parallel degree and a batch limit, how many prompts per second, at what
power, how many joules per prompt and per token, what TTFT and TPOT (p50/p95), how much
memory, and whether it fits. Why one model: the planner must compare GPU models that were
never measured (the AMD parts, H200) with ones that were, and "nearest measured GPU x a
ratio" inverts the hardware (issue 18). Here every GPU goes through the same equations,
whose few efficiencies are fitted once on every measured GPU together.

The equations (per decode step of one tensor-parallel group of `tp` GPUs, batch B, L layers):

    weight bytes  W = weights read x bytes/param(precision) / tp, where weights read is
                  min(total, active x B) for a dense model, and for a mixture of experts
                  (n experts, k routed per token) shared + experts x (1 - (1 - k/n)^B): the
                  expected share of experts a batch of B tokens routes to (uniform routing);
                  at B = 1 it is the active count, for large B all of them
    KV bytes      K = B x (input + output/2) x kv_bytes_per_token / tp
    FLOPs         F_dec = 2 x active x B / tp;  F_pre = F_dec x input / output  (amortised prefill)
    step time     t = per_layer x L + allreduce x L x [tp > 1] + t0 + c_seq x B
                      + overlap_p((W + K) / (eta_mem x BW), F_dec / (eta_compute x peak(precision)))
                      + F_pre / (eta_compute x peak(precision)),
                  overlap_p(m, c) = (m^p + c^p)^(1/p)
    tokens/s      = B / t;  prompts/s = tokens/s / output;  TPOT p50/p95 = k50/k95 x t
    power / GPU   P = p_static + e_byte x (W + K) / t + e_flop x w x (F_dec + F_pre) / t
                      + e_seq x B / t, capped at the TDP;
                  w = operand width / 16 bits (FP8 1/2, FP4 1/4): an assumption, not fitted
                  (every fitted row is BF16), the first-order rule that a multiply's energy
                  scales with its width, so a GPU at full FP8 rate draws what it does at BF16
                  (a capped GPU runs at its TDP for longer: t x P / TDP, same energy per step)
    J/token       = P x tp x t / B
    TTFT          = prefill queue at the point's batch (chunked prefill sharing steps with
                    decode: `_ttft_ms`), at least one step for the prefill and one for the token
    stack         the serving stack's speed s (StackFactor, fitted on MLPerf per vendor and
                  engine) divides every software-set term above (t0, per_layer, allreduce,
                  c_seq and the compute roofline; e_seq's energy too), never the HBM term

Why each step-time term (all fitted once, on every GPU's rows together, and the same on
every GPU, so a part better in every data-sheet figure is never predicted worse):

* The roofline: a decode pass reads the weights and the KV cache once and does the decode
  FLOPs. With full overlap it would take as long as the slower of the two (p = inf: memory
  at small batch, compute at large); kernels overlap them only in part, most of all near
  the ridge where both matter, so p is fitted (a grid from 1, no overlap, to inf; the fit
  picks ~1.25). Prefill runs in steps (vLLM v0, ML.ENERGY v2) or chunks (vLLM v1, v3) of
  hundreds to thousands of tokens, which are compute-bound, so it adds its FLOPs' time,
  amortised over the output tokens.
* per_layer x L: a decode step runs a fixed sequence of ~10 kernels per layer; at small
  batch each is too short to reach full bandwidth, and launch gaps add up. This is why a
  70B model (80 layers) takes several ms more per step than its bytes explain, an 8B
  model (32 layers) fewer, on H100 and B200 alike. (It takes up the bandwidth shortfall
  of short kernels: eta_mem, fitted jointly, sits at its bound 1.)
* allreduce x L x [tp > 1]: with tensor parallelism every layer ends in two all-reduces of
  the activations; at decode sizes (kilobytes) their cost is latency, not link bandwidth,
  and vLLM's one-shot all-reduce has about the same latency at TP 2, 4 or 8.
* c_seq x B: per sequence and step, what the bytes and FLOPs above leave out: the serving
  engine's scheduler, sampler and detokenizer, and attention over the paged KV cache,
  whose kernels run far below the bandwidth that streaming weights reaches. Its energy is
  e_seq per sequence and step: attention and sampling kernels run on the GPU and draw
  power (without it, a large batch, which spends most of its step here, came out ~18 %
  low in power on H100).
* ML.ENERGY v2 (an older vLLM, used for speed only, and for the A100 it alone measured)
  adds v2_t0 + v2_per_seq x B + v2_per_worker x (tp - 1): its CPU-side cost per sequence
  (several times v3's: its GPUs drew under half their TDP) and a per-step cost per extra
  tensor-parallel worker (its inputs were broadcast to each worker process every step).
  These are properties of that software, fitted on both v2 GPUs' rows (replacing the one
  step-time factor of before); predictions are for the v3 engine.

Fitted (see `fit()`): per_layer, allreduce, t0, c_seq, eta_mem and eta_compute (a search
over their ratio), the overlap exponent p, the three v2 terms, the effective input tokens
of each ML.ENERGY task (the summaries do not publish prompt lengths; being per-sequence
too, these trade off against c_seq, so read them as fit parameters, not lengths; v2's is
capped by what its measured batches leave room for in the KV cache, see
`_max_input_tokens`, which is what separates v2's prefill from its CPU cost per sequence
when one of its two GPUs is held out), k50/k95 (ITL percentile over mean step time),
p_static, e_byte, e_flop, e_seq of the power model. On top of the fit (issue 27): a stack
speed per MLPerf result (the speed at which the model reproduces it), pooled into a factor
per (vendor, engine) relative to NVIDIA's own stack in the same round (`stack_factors`:
predictions are for a vLLM-like engine, CUDA/vLLM = 1, ROCm/vLLM fitted), and MLPerf's
effective input length (`mlperf_input_tokens`). Memory: weights + KV cache of every
sequence at its mean context (input + output / 2) at that batch must fit in 90 % of the
GPUs' memory (vLLM's default gpu_memory_utilization). Each figure says where it comes from:
"corrected" (the fit times this GPU's measured correction), "fitted" (the fit, on a GPU
that was measured), "roofline" (the fit, on a GPU that was not), "+correction" (times the
correction of a measured part it dominates), "nominal" (training: no public
per-accelerator figure found; a nominal MFU).

What is not in the model, and why (each tried while building this one; the figures are
those of the fit it was tried in, before later terms were added):

* A per-GPU static power (the catalog's idle_w, or a share of the TDP): in-sample power
  within 10 % went from 39 to 42-44 of 68 rows, but with one v3 GPU held out it is
  collinear with p_static, so the held-out power error got worse (H100 llm-chat-8b
  13 % -> 29-36 %); idle_w also has no data-sheet source; and it would make a part with a
  higher TDP and equal bandwidth and compute less efficient, against the invariant. Nor a
  power term per TP group or per layer (fitted to 0).
* Other roofline shapes: memory and all compute time summed (no overlap, prefill
  included): 75 of 95 rows' tokens/s within 10 %, but three held-out (GPU, workload)
  medians above 20 % (A100 v2 8B 26.5 %, B200 8B 22.9 %, B200 llm-code 20.1 %). One max
  over memory and all FLOPs (prefill fused into the roofline): every held-out median
  within 20 %, but J/token within 10 % on only 34 of 68 rows and B200 llm-chat-70b's
  held-out J/token 22 %; energy per prompt is what the planner minimises. A fixed p = inf
  for the decode roofline here: 66 of 95 rows, two v2 held-out medians above 20 %.
* A TP link-bandwidth term: negligible at decode sizes.

One prediction path (issue 27): `predict` is the model times a correction smooth in batch
from the measured rows of the (workload, GPU, GPU count) (`Correction`: a quadratic in log
batch where five or more limits were measured; rows of an expert-parallel layout count for
their GPU count: `correction_rows`), never a raw measured row beside modelled ones. A
measured part takes its own correction, a part not measured the largest of those of the
measured parts it dominates (same vendor; H200 takes H100's); then each is raised to the
predicted speed of every part it dominates, so a part better in every data-sheet figure is
never predicted slower on the planner's path either. bench.model checks the path out of
sample: each measured row predicted with its correction drawn without it. Across
vendors the order is the software's too: a part ahead on paper can be slower at a lagging
stack factor, as MLPerf shows (MI300X vs H100, MI325X vs H200: parity).
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from importlib import resources

import numpy as np

from policies.model.catalog import catalog

BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization: the rest is activations, graphs
NOMINAL_TRAIN_MFU = 0.35  # nominal, not sourced: no MLPerf Training per-accelerator figure found
GIB = 2**30


@dataclass(frozen=True)
class Part:
    """The figures of one GPU model that set LLM speed and power."""

    name: str
    memory_gib: float
    hbm_tb_per_s: float
    peak_tflops: dict[str, float]  # dense, by precision; a missing precision is unsupported
    tdp_w: float

    def supports(self, precision: str) -> bool:
        return self.peak_tflops.get(precision, 0.0) > 0


@dataclass(frozen=True)
class Workload:
    """What sets a job's cost: model size, precision, request lengths. Presets in `presets()`."""

    name: str
    total_params_b: float
    active_params_b: float
    mean_input_tokens: float
    mean_output_tokens: float
    kv_bytes_per_token: float = 0.0  # at 16-bit KV cache; 0: estimated from the size (see below)
    precision: str = "bf16"
    kind: str = "inference"  # or "train" (nominal)
    task: str = ""  # the ML.ENERGY task whose fitted input length it uses, if any
    note: str = ""
    layers: int = 0  # transformer layers; 0: estimated from the size (see n_layers)
    experts: int = 0  # mixture of experts: experts per layer (0: a dense model)
    experts_active: int = 0  # mixture of experts: experts each token is routed to
    kv_input_cap_tokens: float = math.inf  # input tokens the memory rule counts at most (presets: see presets())

    def kv_bytes(self) -> float:
        """KV bytes per token; when unknown, Llama-3.1's 16 KiB per billion params at 8B,
        scaled with sqrt(size) (Llama-3.1 8B: 128 KiB, 70B: 320 KiB per token)."""
        if self.kv_bytes_per_token > 0:
            return self.kv_bytes_per_token
        return 131072.0 * math.sqrt(self.total_params_b / 8.0)

    def n_layers(self) -> float:
        """Layers; when unknown, Llama-3.1's depth scaled with size^0.42 (8B: 32, 70B: 80 layers)."""
        if self.layers > 0:
            return float(self.layers)
        return 32.0 * (self.total_params_b / 8.0) ** 0.42

    def weights_read_b(self, batch: float) -> float:
        """Billions of parameters one decode step of `batch` sequences reads. Dense: all of
        them (fewer only if active < total without a known expert count: active x batch,
        capped at total). Mixture of experts with n experts, k per token: the shared part
        plus the expected share of experts that `batch` uniformly routed tokens touch,
        1 - (1 - k/n)^batch; the expert parameters are (total - active) / (1 - k/n)."""
        if self.experts > 0 and 0 < self.experts_active < self.experts and self.total_params_b > self.active_params_b:
            share = self.experts_active / self.experts
            expert_b = min((self.total_params_b - self.active_params_b) / (1 - share), self.total_params_b)
            return self.total_params_b - expert_b + expert_b * (1 - (1 - share) ** batch)
        return min(self.total_params_b, self.active_params_b * batch)


@dataclass(frozen=True)
class OperatingPoint:
    """What a serving engine is told: batch limit (vLLM max_num_seqs), precision, and `tp`,
    the GPUs of one replica (tensor parallel; a mixture of experts may run them expert
    parallel instead, see `correction_rows`)."""

    max_batch: int
    precision: str = "bf16"
    tp: int = 1


@dataclass(frozen=True)
class Fit:
    """The fitted constants of the model, and how well they reproduce their data."""

    t0_ms: float  # fixed cost per step, any GPU
    per_seq_us: float  # per sequence per step: scheduler, sampler, paged attention (any GPU)
    eta_mem: float
    eta_compute: float
    input_tokens: dict[str, float]  # effective input tokens per ML.ENERGY task
    v2_software_factor: float  # step-time multiplier of ML.ENERGY v2's stack: 1 (v2 now has additive terms)
    itl_p50_over_step: float
    itl_p95_over_step: float
    p_static_w: float
    e_byte_pj: float
    e_flop_pj: float
    step_rel_rms: float
    power_rel_rms: float  # in-sample relative RMS of the power fit
    rows: int
    gpus: tuple[str, ...]
    power_transfer_rel: float = 0.0  # the power fit's error on a GPU it has not seen (see fit())
    per_layer_us: float = 0.0  # per layer per step: the layer's kernel sequence at decode sizes
    allreduce_us: float = 0.0  # per layer per step when tp > 1: two activation all-reduces' latency
    e_seq_mj: float = 0.0  # energy per sequence per step of the per-sequence work (c_seq's)
    v2_t0_ms: float = 0.0  # ML.ENERGY v2's stack: extra cost per step
    v2_per_seq_us: float = 0.0  # ML.ENERGY v2's stack: extra cost per sequence per step
    v2_per_worker_ms: float = 0.0  # ML.ENERGY v2's stack: cost per step per extra TP worker
    overlap_p: float = math.inf  # decode roofline (mem^p + compute^p)^(1/p): 1 no overlap, inf full


@dataclass(frozen=True)
class Prediction:
    """Every figure for one (workload, GPU, GPU count, operating point)."""

    workload: str
    gpu: str
    point: OperatingPoint
    fits: bool
    memory_needed_gib: float  # per GPU: weights/tp + KV at the full context of every sequence
    memory_available_gib: float  # per GPU: MEMORY_UTILIZATION x memory
    prompts_per_s: float
    output_tokens_per_s: float
    power_w: float  # all tp GPUs together
    j_per_prompt: float
    j_per_token: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    latency_p95_ms: float  # per prompt: TTFT + p95 output length x TPOT p50
    power_uncertainty_rel: float  # relative: the fit's RMS on measured GPUs, its held-out error elsewhere
    sources: dict[str, str] = field(default_factory=dict)  # figure group -> source kind
    stack: StackFactor | None = None  # the serving stack's fitted speed factor this prediction ran at
    speed_correction: float = 1.0  # measured / model throughput at this batch (1: no measurement applies)


# ---------------------------------------------------------------------------- data files


@cache
def _toml(name: str) -> dict:
    return tomllib.loads(resources.files("policies").joinpath(f"data/{name}").read_text("utf-8"))


def measurements() -> dict:
    """measurements.toml: data-sheet extras, architectures, length spread, MLPerf, missing."""
    return _toml("measurements.toml")


@cache
def mlperf_results() -> tuple[dict, ...]:
    """Every MLPerf Inference llama2-70b result the stack factors are fitted on
    (mlperf_results.toml: per system, round, submitter, part, precision, engine, source)."""
    return tuple(_toml("mlperf_results.toml")["result"])


def mlperf_gaps() -> list[str]:
    """What the cross-vendor data lacks (mlperf_results.toml's [gaps])."""
    return list(_toml("mlperf_results.toml")["gaps"]["figures"])


def mlenergy_rows() -> list[dict]:
    """The ML.ENERGY rows the model is fitted on (mlenergy_rows.toml)."""
    return _toml("mlenergy_rows.toml")["row"]


@cache
def parts() -> dict[str, Part]:
    """Every GPU model of the catalog, plus the A100-SXM4-40GB that ML.ENERGY v2 measured."""
    extra = {d["part"]: d for d in measurements()["datasheet"]}
    out = {}
    for name, g in catalog().items():
        peak = {"bf16": g.bf16_dense_tflops, "fp8": g.fp8_dense_tflops,
                "fp4": float(extra.get(name, {}).get("fp4_dense_tflops", 0.0))}
        out[name] = Part(name, g.memory_gib, g.hbm_tb_per_s, {k: v for k, v in peak.items() if v > 0}, g.tdp_w)
    a = extra["A100-SXM4-40GB"]
    out["A100-SXM4-40GB"] = Part("A100-SXM4-40GB", a["memory_gib"], a["hbm_tb_per_s"],
                                 {"bf16": a["bf16_dense_tflops"]}, a["tdp_w"])
    return out


def _architecture(model_id: str) -> dict:
    return next(a for a in measurements()["architecture"] if a["model_id"] == model_id)


_PRESET_MODELS = {  # preset -> (model id, ML.ENERGY task, note)
    "llm-chat-8b": ("meta-llama/Llama-3.1-8B-Instruct", "lm-arena-chat", "ML.ENERGY v3 lm-arena-chat"),
    "llm-chat-70b": ("meta-llama/Llama-3.1-70B-Instruct", "lm-arena-chat", "ML.ENERGY v3 lm-arena-chat"),
    "llm-code": ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "sourcegraph-fim", "ML.ENERGY v3 sourcegraph-fim"),
    "llm-reason": ("Qwen/Qwen3-8B", "gpqa", "ML.ENERGY v3 gpqa"),
}
_ALIASES = {  # CLI help / demo names
    "llm-inference": ("llm-chat-8b", "CLI name: a chat model's batch inference, as llm-chat-8b"),
    "eval": ("llm-reason", "CLI name: an evaluation run; GPQA is an evaluation set, as llm-reason"),
}


def _shape(a: dict) -> dict[str, int]:
    """An architecture entry's layers and experts, as Workload keyword arguments."""
    return {"layers": int(a["layers"]), "experts": int(a.get("experts", 0)),
            "experts_active": int(a.get("experts_active", 0))}


def _mean_output(model_id: str, task: str) -> float:
    outs = [r["mean_output_tokens"] for r in mlenergy_rows()
            if r["model_id"] == model_id and r["task"] == task]
    return float(np.mean(outs))


@cache
def preset_names() -> list[str]:
    """The names `presets()` has, without fitting the model (cheap: for input checks)."""
    return sorted({*_PRESET_MODELS, *_ALIASES, "mlperf-llama2-70b", "train", "finetune"})


_PRIMED: dict[str, object] = {}


def prime(*, presets: dict[str, Workload], fit: Fit,
          stack_speeds: tuple[tuple[int, float], ...] | None = None) -> None:
    """Use the named workloads, the fit and the MLPerf results' stack speeds under that fit
    (`primed_tables`) that an earlier process derived from the same code and data
    (`scheduler.policy_tables` keeps them on disk): seconds of fitting saved. Takes effect
    only before the first call of `presets()` and `fit()` in this process."""
    _PRIMED["presets"] = presets
    _PRIMED["fit"] = fit
    if stack_speeds is not None:
        _SPEED_MEMO[id(fit)] = (fit, stack_speeds)


def primed_tables() -> dict[str, object]:
    """What `prime` takes, computed here: the named workloads, the fit, and the stack speeds of
    the MLPerf results under it (the stack factors of every prediction derive from them)."""
    return {"presets": presets(), "fit": fit(), "stack_speeds": _speeds(fit())}


@cache
def presets() -> dict[str, Workload]:
    """Named workloads: the profile classes, the CLI's names, and the MLPerf llama2-70b.

    Cached (as it was until d78d007 put `preset_names` between it and its decorator): the
    planner asks `operating_point.workload_model` for every distinct (workload, model, k,
    SLOs) question, and rebuilding the dict took 0.42 ms a call, 0.53 s of greedy's 1.5 s at
    5,000 jobs (cProfile, bench/planner 5000x1024). The result is read-only by convention
    (frozen Workloads; callers only look up and iterate)."""
    if "presets" in _PRIMED:
        return _PRIMED["presets"]
    f = fit()
    out: dict[str, Workload] = {}
    for name, (model_id, task, note) in _PRESET_MODELS.items():
        a = _architecture(model_id)
        cap = _max_input_tokens([r for r in fit_rows() if r["dataset"] == "mlenergy-v3"
                                 and r["model_id"] == model_id and r["task"] == task])
        out[name] = Workload(name, a["total_params_b"], a["active_params_b"], f.input_tokens[task],
                             _mean_output(model_id, task), a["kv_bytes_per_token_bf16"], "bf16",
                             task=task, note=f"{model_id}; {note}; output length measured, input fitted",
                             kv_input_cap_tokens=max(cap, 0.0), **_shape(a))
    for alias, (target, note) in _ALIASES.items():
        out[alias] = replace(out[target], name=alias, note=note)
    out["mlperf-llama2-70b"] = mlperf_workload()
    for name in ("train", "finetune"):
        a = _architecture("meta-llama/Llama-3.1-8B-Instruct")
        out[name] = Workload(name, a["total_params_b"], a["active_params_b"], 1024, 1,
                             a["kv_bytes_per_token_bf16"], "bf16", kind="train", **_shape(a),
                             note="nominal: an 8B model, 1024-token samples, MFU "
                                  f"{NOMINAL_TRAIN_MFU} (no MLPerf Training figure found)")
    return out


@cache
def mlperf_workload() -> Workload:
    """MLPerf's llama2-70b at its fitted effective input length (`mlperf_input_tokens`)."""
    return replace(_mlperf_workload(0.0), mean_input_tokens=mlperf_input_tokens(),
                   note="MLPerf llama2-70b (OpenOrca); FP8 weights and KV cache; output = tokens/samples of the "
                        f"results; input {mlperf_input_tokens():.0f} tokens, fitted (see mlperf_input_tokens)")


def _mlperf_workload(input_tokens: float) -> Workload:
    """MLPerf's llama2-70b: Llama-2-70b-chat, FP8 weights and FP8 KV cache (both vendors'
    submissions: NVIDIA's TensorRT-LLM build passes `--fp8_kv_cache`, closed/NVIDIA/code/
    llama2-70b/tensorrt/infer.py; AMD's Quark scheme is w_fp8_a_fp8_o_fp8 with FP8 KV cache
    scales, closed/AMD/code/llama2-70b-99.9/README.md, both in inference_results_v4.1); mean
    output = tokens / samples of the results; mean input not found, so the Azure conv
    trace's mean prompt stands in."""
    a = _architecture("meta-llama/Llama-2-70b-chat-hf")
    rows = [m for m in mlperf_results() if m["samples_per_s"] > 0]
    return Workload(
        "mlperf-llama2-70b", a["total_params_b"], a["active_params_b"], input_tokens,
        float(np.mean([m["tokens_per_s"] / m["samples_per_s"] for m in rows])), a["kv_bytes_per_token_bf16"] / 2,
        "fp8", note="MLPerf llama2-70b (OpenOrca); FP8 weights and KV cache; output = tokens/samples of the "
                    "results; input length not found: the Azure conv trace's mean prompt stands in", **_shape(a))


# ---------------------------------------------------------------------------- serving stacks

ENGINE_NAMES = {"vllm": "vLLM", "tensorrt-llm": "TensorRT-LLM", "llmboost": "LLMBoost (vLLM)"}
VENDOR_RUNTIME = {"nvidia": "CUDA", "amd": "ROCm"}
REFERENCE_STACK = ("nvidia", "tensorrt-llm")  # NVIDIA's own MLPerf stack: every round has it
PREDICTED_ENGINE = "vllm"  # what predictions are for: the fitted rows' engine, on every vendor


def vendor(part: str) -> str:
    """"amd" or "nvidia" for a part of `parts()`."""
    return catalog()[part].vendor if part in catalog() else "nvidia"


@dataclass(frozen=True)
class StackFactor:
    """A serving stack's speed: the factor its software terms run at against the fitted
    rows' CUDA/vLLM (1). It divides every software-set term of the step time (the fixed,
    per-layer, all-reduce and per-sequence costs, and the compute roofline), never the HBM
    streaming term, which the hardware sets; so a part whose software lags loses least
    where the work is bound by memory bandwidth, and that comes out of the roofline rather
    than a rule. Fitted on MLPerf results (`stack_factors`)."""

    vendor: str
    engine: str
    factor: float
    spread: float  # +- (one geometric standard deviation of the results, as a factor difference)
    results: int  # MLPerf results it is fitted on (0: the reference, by definition)
    rounds: tuple[str, ...] = ()
    basis: str = ""

    @property
    def precision(self) -> str:
        """The weight precision its results ran at ("" for every precision: NVIDIA's stacks)."""
        return self.engine.partition("@")[2]

    @property
    def name(self) -> str:
        engine = self.engine.partition("@")[0]
        return f"{VENDOR_RUNTIME.get(self.vendor, self.vendor)}/{ENGINE_NAMES.get(engine, engine)}"

    def label(self) -> str:
        """E.g. "ROCm/vLLM stack factor 0.62 +- 0.08, from 6 MLPerf FP8 results (v5.1; ...)"."""
        if self.results == 0:
            return f"{self.name} stack factor {self.factor:.2f} ({self.basis})"
        at = f" {self.precision.upper()}" if self.precision else ""
        return (f"{self.name} stack factor {self.factor:.2f} +- {self.spread:.2f}, from {self.results} MLPerf{at} "
                f"result{'s' if self.results != 1 else ''} ({', '.join(self.rounds)}; {self.basis})")


REFERENCE_FACTOR = StackFactor("nvidia", "vllm", 1.0, 0.0, 0, basis="the ML.ENERGY rows the model is fitted on")


def mlperf_best_tokens_per_gpu_s(m: dict, f: Fit, speed: float = 1.0, w: Workload | None = None) -> float:
    """The model's best per-GPU output tokens/s for one MLPerf result's part, precision and
    scenario, with the serving stack at `speed` (see StackFactor): over TP degrees up to
    its accelerator count and batch limits that fit in memory; Server also keeps TPOT p95
    <= 200 ms and TTFT p95 <= 2 s (the scenario's limits)."""
    w = w or mlperf_workload()
    best = 0.0
    for point, part, s in _mlperf_points(m["part"], m["precision"], m["accelerators"], w):
        t, _ = _capped(s, _step_time_s(s, f, speed), part, f, speed)
        if m["scenario"] == "Server":
            ttft50, ttft95 = _ttft_ms(w, part, point, t, f, speed)
            if f.itl_p95_over_step * t * 1e3 > 200 or ttft95 > 2000:
                continue
        best = max(best, point.max_batch / t / point.tp)
    return best


@lru_cache(maxsize=256)
def _mlperf_points(part_name: str, precision: str, accelerators: int, w: Workload) -> tuple[tuple, ...]:
    """(point, part, step) of every TP degree up to `accelerators` and batch limit that fits
    in memory: what `mlperf_best_tokens_per_gpu_s` searches, built once (the step's bytes and
    FLOPs do not depend on the stack speed, which the bisection varies)."""
    part = parts()[part_name]
    if not part.supports(precision):
        return ()
    out = []
    for tp in (1, 2, 4, 8):
        if tp > accelerators:
            continue
        for b in (16, 32, 64, 128, 256, 384, 512, 768, 1024):
            point = OperatingPoint(b, precision, tp)
            if memory_needed_gib(w, point) <= MEMORY_UTILIZATION * part.memory_gib:
                out.append((point, part, _step(w, part, b, precision, tp, w.mean_input_tokens)))
    return tuple(out)


def mlperf_speed(m: dict, f: Fit, w: Workload | None = None) -> float:
    """The stack speed at which the model reproduces one MLPerf result's per-GPU tokens/s
    (bisection to 0.1 %: the best point's throughput rises with the speed); nan when no
    speed in [0.02, 50] does."""
    target = m["tokens_per_s"] / m["accelerators"]
    lo, hi = math.log(0.02), math.log(50.0)
    if not (mlperf_best_tokens_per_gpu_s(m, f, math.exp(lo), w) <= target
            <= mlperf_best_tokens_per_gpu_s(m, f, math.exp(hi), w)):
        return math.nan
    for _ in range(22):
        mid = (lo + hi) / 2
        if mlperf_best_tokens_per_gpu_s(m, f, math.exp(mid), w) < target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


_MLPERF_INPUT_GRID = (32.0, 48.0, 64.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0)


@cache
def mlperf_input_tokens() -> float:
    """MLPerf llama2-70b's effective mean input tokens, fitted: the result logs do not give
    the OpenOrca prompts' length, and the Azure conv trace's mean (1,155) is impossible
    there (at the measured tokens/s, an H100 would run above its FP8 peak). The value is
    the grid point at which one stack speed per (vendor, engine, round) explains every
    part's result best (least RMS log deviation of the parts' speeds from their stack's
    round mean), on the median result of each (part, stack, round); like the ML.ENERGY
    tasks' inputs, a fit parameter (it also absorbs what MLPerf's stacks do to prefill)."""
    f = fit()
    groups: dict[tuple, list[dict]] = {}
    for m in mlperf_results():
        if m["scenario"] == "Offline" and m["division"] == "closed":
            groups.setdefault((m["part"], *mlperf_key(m), m["round"]), []).append(m)
    reps = [sorted(g, key=lambda m: m["tokens_per_s"] / m["accelerators"])[len(g) // 2] for g in groups.values()]
    best, best_rms = _MLPERF_INPUT_GRID[0], math.inf
    for tokens in _MLPERF_INPUT_GRID:
        w = _mlperf_workload(tokens)
        by_stack: dict[tuple, list[float]] = {}
        for m in reps:
            v = mlperf_speed(m, f, w)
            if not math.isfinite(v):
                by_stack = {}
                break
            by_stack.setdefault((*mlperf_key(m), m["round"]), []).append(math.log(v))
        devs = [x - float(np.mean(v)) for v in by_stack.values() for x in v]
        rms = math.sqrt(float(np.mean(np.square(devs)))) if devs else math.inf
        if rms < best_rms:
            best, best_rms = tokens, rms
    return best


def mlperf_key(m: dict) -> tuple[str, str]:
    """(vendor, stack) of one MLPerf result: NVIDIA's own stack over every precision (the
    reference), any other engine per weight precision ("vllm@fp8"). Per precision, because
    AMD's results come in two regimes that one factor cannot fit: FP8 on MI300X/MI325X at
    0.49-0.71 of NVIDIA's speed (0.61-0.71 in v4.1-v5.1, LLMBoost 0.55-0.64), FP4 on MI355X
    at 0.88-0.94 (v6.0, v6.1; `bench.model` prints them): how far a vendor's software is
    from its roofline depends on the kernels of the precision, not on the vendor alone."""
    v, e = vendor(m["part"]), m["engine"]
    return (v, e) if (v, e) == REFERENCE_STACK else (v, f"{e}@{m['precision']}")


_SPEED_MEMO: dict[int, tuple[Fit, tuple[tuple[int, float], ...]]] = {}


def _speeds(f: Fit) -> tuple[tuple[int, float], ...]:
    """(index into mlperf_results(), stack speed) of every closed-division Offline result the
    model can run (open-division results, which may change the model, are predicted, never
    fitted on); memoised per fit object (a Fit holds a dict, so it cannot be a cache key)."""
    hit = _SPEED_MEMO.get(id(f))
    if hit is not None and hit[0] is f:
        return hit[1]
    out = []
    for i, m in enumerate(mlperf_results()):
        if m["scenario"] != "Offline" or m["division"] != "closed":  # open: the model may be changed
            continue
        v = mlperf_speed(m, f)
        if math.isfinite(v):
            out.append((i, v))
    _SPEED_MEMO[id(f)] = (f, tuple(out))
    return tuple(out)


def _geo(values: list[float]) -> tuple[float, float]:
    """Geometric mean and geometric standard deviation - 1 (0 for one value)."""
    logs = np.log(values)
    return float(np.exp(logs.mean())), float(np.exp(logs.std(ddof=1)) - 1) if len(values) > 1 else 0.0


def stack_speeds(f: Fit | None = None, keep=None) -> dict[tuple[str, str, str], list[float]]:
    """Per (vendor, engine, round), the stack speeds of its Offline MLPerf results (those for
    which `keep(result)` is true: leave-one-out)."""
    f = f or fit()
    out: dict[tuple[str, str, str], list[float]] = {}
    results = mlperf_results()
    for i, v in _speeds(f):
        m = results[i]
        if keep is None or keep(m):
            out.setdefault((*mlperf_key(m), m["round"]), []).append(v)
    return out


def _round_key(round_: str) -> tuple[int, ...]:
    """An MLPerf round's name ("v5.1") as a sortable version."""
    return tuple(int(x) for x in round_.lstrip("v").split(".") if x.isdigit())


def _all_rounds() -> list[str]:
    """Every round of the MLPerf data, in order."""
    return sorted({m["round"] for m in mlperf_results()}, key=_round_key)


def _reference_speed_for(round_: str, speeds: dict) -> float | None:
    """NVIDIA's own stack's speed in `round_`: that round's geometric mean, else (a round it
    has no result in: held out) interpolated in log speed between the nearest earlier and
    later rounds by their place in the rounds' order (software improves from round to round),
    else the nearest one's; None when it has no result at all."""
    known = {r: _geo(v)[0] for (ve, en, r), v in speeds.items() if (ve, en) == REFERENCE_STACK}
    if not known:
        return None
    if round_ in known:
        return known[round_]
    before = sorted((r for r in known if _round_key(r) < _round_key(round_)), key=_round_key)
    after = sorted((r for r in known if _round_key(r) > _round_key(round_)), key=_round_key)
    if not before or not after:
        return known[before[-1] if before else after[0]]
    a, b = before[-1], after[0]
    order = sorted(set(_all_rounds()) | {a, b, round_}, key=_round_key)
    share = (order.index(round_) - order.index(a)) / (order.index(b) - order.index(a))
    return math.exp(math.log(known[a]) + share * (math.log(known[b]) - math.log(known[a])))


def stack_factor_for(vendor_: str, engine: str, round_: str | None, speeds: dict) -> float | None:
    """The speed of (vendor, engine) in `round_` from per-round speeds: that round's geometric
    mean; else (a round it has no result in: held out) NVIDIA's own stack's speed in that
    round (`_reference_speed_for`, interpolated where the round is held out too) times the
    stack's factor relative to it (`relative_stack_factor`, the planner's factor), as the
    planner predicts a part of another vendor; else its nearest earlier round's, else its
    nearest later one's; None when it has no result at all."""
    rounds = sorted((r for (v, e, r) in speeds if (v, e) == (vendor_, engine)), key=_round_key)
    if not rounds:
        return None
    if round_ in rounds:
        return _geo(speeds[(vendor_, engine, round_)])[0]
    if round_ is not None:
        reference = _reference_speed_for(round_, speeds)
        if (vendor_, engine) == REFERENCE_STACK:
            return reference
        relative = relative_stack_factor(vendor_, engine, speeds)
        if reference is not None and relative.results:
            return reference * relative.factor
    earlier = [r for r in rounds if round_ is not None and _round_key(r) < _round_key(round_)]
    pick = earlier[-1] if earlier else rounds[0]
    return _geo(speeds[(vendor_, engine, pick)])[0]


def relative_stack_factor(vendor_: str, engine: str, speeds: dict) -> StackFactor:
    """The factor predictions use for (vendor, engine): the geometric mean, over its MLPerf
    results in every round that also has NVIDIA's own stack (TensorRT-LLM), of its speed over
    that round's NVIDIA speed. Per round: software improves from round to round on both
    sides (H100 +28 % from v4.1 to v5.0), and a ratio within a round cancels that; pooled
    over rounds, because the ratio shows no trend (ROCm/vLLM's FP8 results at 0.61, 0.71,
    0.68 of NVIDIA's in v4.1, v5.0, v5.1, 0.49 from v6.0's one: `bench.model` prints it per
    round). Relative, because every MLPerf submission is tuned: what transfers to the
    planner's vLLM-like engine is how far one vendor's tuned stack is from the other's on the
    same roofline, not how far either is from the stock vLLM of the fitted rows. NVIDIA/vLLM:
    1 (the fitted rows)."""
    if (vendor_, engine) == ("nvidia", PREDICTED_ENGINE) or vendor_ == "nvidia":
        return REFERENCE_FACTOR if engine == PREDICTED_ENGINE else StackFactor(
            vendor_, engine, 1.0, 0.0, 0, basis="NVIDIA's own MLPerf stack: the reference of the relative factors")
    both = sorted(r for (v, e, r) in speeds if (v, e) == (vendor_, engine) and (*REFERENCE_STACK, r) in speeds)
    if not both:
        return StackFactor(vendor_, engine, 1.0, 0.0, 0, basis="no MLPerf result: CUDA/vLLM's speed assumed")
    ratios = [v / _geo(speeds[(*REFERENCE_STACK, r)])[0] for r in both for v in speeds[(vendor_, engine, r)]]
    factor, spread = _geo(ratios)
    refs = sum(len(speeds[(*REFERENCE_STACK, r)]) for r in both)
    return StackFactor(vendor_, engine, factor, factor * spread, len(ratios), tuple(both),
                       basis=f"each against CUDA/TensorRT-LLM in its round, {refs} results")


@cache
def stack_factors() -> dict[tuple[str, str], StackFactor]:
    """The stack factor of every (vendor, stack) with MLPerf results (`mlperf_key`), and the
    reference."""
    speeds = stack_speeds()
    keys = {(v, e) for (v, e, _) in speeds} | {("nvidia", PREDICTED_ENGINE)}
    return {k: relative_stack_factor(*k, speeds) for k in sorted(keys)}


def _precisions_nearest(precision: str) -> list[str]:
    """The precisions by how near their bytes per weight are to `precision`'s (itself first;
    the wider one first on a tie): bf16 -> bf16, fp8, fp4."""
    width = math.log2(BYTES_PER_PARAM[precision])
    return sorted(BYTES_PER_PARAM, key=lambda p: (abs(math.log2(BYTES_PER_PARAM[p]) - width), -BYTES_PER_PARAM[p]))


@cache
def stack_of(part: str, engine: str = PREDICTED_ENGINE, precision: str = "bf16") -> StackFactor:
    """The stack factor predictions for `part` at `precision` run at: NVIDIA's is the
    reference; another vendor's is its (engine, precision) factor, from the nearest
    precision its MLPerf results ran at where none ran at this one (bf16: FP8's)."""
    v = vendor(part)
    if v == "nvidia":
        return relative_stack_factor(v, engine, stack_speeds())
    factors = stack_factors()
    for p in _precisions_nearest(precision):
        f = factors.get((v, f"{engine}@{p}"))
        if f is not None and f.results:
            return f
    return relative_stack_factor(v, engine, stack_speeds())


def preset(name: str) -> Workload:
    """A named workload; ValueError lists the names."""
    try:
        return presets()[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(presets()))}") from None


# ---------------------------------------------------------------------------- the equations


@dataclass(frozen=True)
class _Step:
    weight_bytes: float
    kv_bytes: float
    flops: float
    mem_s: float  # bytes / bandwidth at eta 1
    compute_s: float  # flops / peak at eta 1
    flop_energy_scale: float = 1.0  # energy per FLOP relative to BF16 (operand width / 16 bits)
    batch: float = 1.0
    layers: float = 0.0
    tp: int = 1
    decode_compute_s: float = 0.0  # compute_s without the prefill share (the decode FLOPs')


def _step(w: Workload, p: Part, batch: float, precision: str, tp: int, input_tokens: float) -> _Step:
    bpp = BYTES_PER_PARAM[precision]
    out = max(w.mean_output_tokens, 1.0)
    wb = w.weights_read_b(batch) * 1e9 * bpp / tp
    kv = batch * (input_tokens + out / 2) * w.kv_bytes() / tp
    fl = 2 * w.active_params_b * 1e9 * batch * (1 + input_tokens / out) / tp
    return _Step(wb, kv, fl, (wb + kv) / (p.hbm_tb_per_s * 1e12), fl / (p.peak_tflops[precision] * 1e12),
                 bpp / BYTES_PER_PARAM["bf16"], batch, w.n_layers(), tp,
                 2 * w.active_params_b * 1e9 * batch / tp / (p.peak_tflops[precision] * 1e12))


def _overhead_s(s: _Step, f: Fit) -> float:
    """The GPU-independent part of a step: per layer, all-reduces under TP, fixed, per sequence."""
    us = (f.per_layer_us + f.allreduce_us * (s.tp > 1)) * s.layers + f.per_seq_us * s.batch
    return f.t0_ms / 1e3 + us / 1e6


def _step_time_s(s: _Step, f: Fit, speed: float = 1.0) -> float:
    """Overheads + the decode roofline (a decode pass reads the weights and KV once and does
    the decode FLOPs: it lasts as long as the slower of the two) + the prefill, amortised
    over the output tokens, at the compute roofline (prefill runs in steps or chunks of
    hundreds to thousands of tokens, which are compute-bound). `speed`: the serving stack's
    factor (StackFactor): it divides what software sets (overheads, compute efficiency),
    not the HBM streaming time."""
    return (_overhead_s(s, f) / speed
            + float(_overlap(s.mem_s / f.eta_mem, s.decode_compute_s / (f.eta_compute * speed), f.overlap_p))
            + (s.compute_s - s.decode_compute_s) / (f.eta_compute * speed))


def _overlap(mem_s: np.ndarray | float, compute_s: np.ndarray | float, p: float) -> np.ndarray:
    """The decode roofline with partial overlap: (mem^p + compute^p)^(1/p); p = 1 adds the
    two (no overlap), p = inf is max (full overlap); between, the slower one dominates more
    the further apart they are. Increasing in both, so more bandwidth or compute never hurts."""
    if math.isinf(p):
        return np.maximum(mem_s, compute_s)
    return (np.asarray(mem_s) ** p + np.asarray(compute_s) ** p) ** (1 / p)


def _v2_extra_s(s: _Step, f: Fit) -> float:
    """ML.ENERGY v2's older serving stack: its extra cost per step (only to reproduce v2 rows)."""
    return (f.v2_t0_ms + f.v2_per_worker_ms * (s.tp - 1)) / 1e3 + f.v2_per_seq_us * s.batch / 1e6


def _power_w(s: _Step, t: float, f: Fit, speed: float = 1.0) -> float:
    """Power per GPU: static + the step's bytes and FLOPs + its per-sequence work, whose
    energy a faster serving stack (speed > 1) spends less of, as it spends less time."""
    dynamic_pj = f.e_byte_pj * (s.weight_bytes + s.kv_bytes) + f.e_flop_pj * s.flop_energy_scale * s.flops
    return f.p_static_w + dynamic_pj * 1e-12 / t + f.e_seq_mj * 1e-3 * s.batch / speed / t


def _capped(s: _Step, t: float, p: Part, f: Fit, speed: float = 1.0) -> tuple[float, float]:
    """(step time, power per GPU), with the power cap: a GPU whose predicted power exceeds its
    TDP runs at the TDP and takes proportionally longer, spending the same energy per step
    (a conservative reading of clock throttling, which in practice also saves some energy).
    The step's energy is that of the same bytes and FLOPs whatever the stack's speed: a
    slower stack spreads it over a longer step (lower power, same joules)."""
    power = _power_w(s, t, f, speed)
    if power <= p.tdp_w:
        return t, power
    return t * power / p.tdp_w, p.tdp_w


def stretch(power_w: float, limit_w: float | None) -> float:
    """How much longer work takes under a power limit: power / limit when the uncapped power
    is above it (the GPU runs at the limit for longer, the same energy: `_capped`'s rule),
    else 1. Used by the energy model for board power limits below the TDP."""
    return power_w / limit_w if limit_w and power_w > limit_w else 1.0


# TTFT: chunked prefill sharing steps with decode (vLLM v1's scheduler). Each step has a
# token budget (max_num_batched_tokens); every running sequence takes one decode token of
# it and new prompts' prefill chunks fill the rest. 8192 is the budget of InferenceMAX's
# vLLM configurations (`--max-num-batched-tokens 8192`, the InferenceMAX README's launch
# commands, e.g. https://github.com/jyothisambolu/InferenceMAX), a configuration, not a fit.
PREFILL_TOKEN_BUDGET = 8192
WAIT_P95_OVER_MEAN = 3.0  # an exponential wait's p95 over its mean is ln 20 = 3.0
RHO_MAX = 0.99  # prefill demand at or above the budget: the batch starves; TTFT at 99 % utilisation


def _ttft_ms(w: Workload, p: Part, point: OperatingPoint, t: float, f: Fit, speed: float = 1.0) -> tuple[float, float]:
    """(TTFT p50, p95) in ms at a point whose step takes `t` s, as a queue of prefills.

    At batch B in steady state, B / output sequences finish per step and as many prompts
    start, so prefill demand is B x input / output tokens per step against a chunk capacity
    of budget - B tokens per step: utilisation rho. A prompt's own prefill takes input /
    (budget - B) steps; it first waits for the prefills ahead of it (M/D/1 mean wait:
    rho / (2 (1 - rho)) service times; p95 WAIT_P95_OVER_MEAN x that), then its first
    token needs one more step. rho >= 1: the point cannot keep its batch fed; its TTFT is
    taken at rho = RHO_MAX (~50 service times of waiting: no realistic SLO is met). A prompt shorter than one chunk, and a small batch, still
    pay at least one step for the prefill and one for the token. At batch 1 the prefill
    of the prompt alone sets it (the compute roofline of input x 2 x active FLOPs)."""
    spread = measurements()["length_spread"]
    capacity = max(PREFILL_TOKEN_BUDGET - point.max_batch, PREFILL_TOKEN_BUDGET / 8)
    out = max(w.mean_output_tokens, 1.0)
    rho = min(point.max_batch * w.mean_input_tokens / out / capacity, RHO_MAX)
    prefill_s = 2 * w.active_params_b * 1e9 / point.tp / (f.eta_compute * speed * p.peak_tflops[point.precision] * 1e12)
    wait = rho / (2 * (1 - rho))
    out_ms = []
    for inp, wait_k in ((w.mean_input_tokens, wait), (w.mean_input_tokens * spread["input_p95_over_mean"],
                                                       wait * WAIT_P95_OVER_MEAN)):
        steps = max(1.0, inp / capacity) * (1 + wait_k)
        out_ms.append((max(steps * t, prefill_s * inp) + t) * 1e3)
    return out_ms[0], out_ms[1]


def memory_needed_gib(w: Workload, point: OperatingPoint) -> float:
    """Per GPU: weights / tp + KV cache of `max_batch` sequences at their mean context,
    input + output / 2: vLLM's paged KV cache holds only the blocks a sequence has written,
    and in steady state a running sequence is on average half-way through its output (the
    same context the step model reads, and the one `_max_input_tokens` bounds the fit with;
    counting every sequence's whole output refused configurations ML.ENERGY ran). A preset's
    input is a fitted effective length (it trades off with the per-sequence cost), so its
    KV demand is counted at most at `kv_input_cap_tokens`: the longest mean input with which
    every batch ML.ENERGY measured for it fits (`_max_input_tokens` over its v3 rows; with
    vLLM v1's prefix caching, sequences share the blocks of common prefixes)."""
    weights = w.total_params_b * 1e9 * BYTES_PER_PARAM[point.precision]
    kv = point.max_batch * (min(w.mean_input_tokens, w.kv_input_cap_tokens) + w.mean_output_tokens / 2) * w.kv_bytes()
    return (weights + kv) / point.tp / GIB


def _model_id(w: Workload) -> str:
    """The ML.ENERGY model id behind a preset (or its alias); "" for other workloads."""
    name = _ALIASES.get(w.name, (w.name,))[0]
    return _PRESET_MODELS.get(name, ("",))[0]


def dominates(a: Part, b: Part) -> bool:
    """Whether part `a` is no worse than `b` in every data-sheet figure that sets speed
    (memory, bandwidth, peak of every precision b has, TDP), under the same vendor's
    software: the order the model (and every correction) must keep."""
    return (vendor(a.name) == vendor(b.name) and a.memory_gib >= b.memory_gib and a.hbm_tb_per_s >= b.hbm_tb_per_s
            and a.tdp_w >= b.tdp_w and all(a.peak_tflops.get(k, 0.0) >= v for k, v in b.peak_tflops.items()))


#: a correction bends (a quadratic in log2 batch) only where a (workload, GPU, TP) has at least
#: this many measured batch limits; fewer get a line (two or three points would be passed
#: through exactly, which is the measured rows again, not a smooth correction)
CURVE_MIN_BATCHES = 5


@dataclass(frozen=True)
class Correction:
    """Measured / model throughput and power of one (workload, GPU, TP, precision) as smooth
    curves in log2(batch limit) through its ML.ENERGY v3 rows (least squares: a quadratic
    from `CURVE_MIN_BATCHES` measured limits, else a line, one limit a constant), held flat
    outside the measured batches: smooth in batch, never a measured row beside a modelled
    one. Why a quadratic: the serving stack's departure from the roofline is not a tilt
    alone; it is largest at both ends (launch overheads at small batches, the scheduler and
    KV-cache paging at the largest), which a line cannot follow."""

    gpu: str
    rows: int
    lo: float  # log2 of the smallest and largest measured batch limit
    hi: float
    speed: tuple[float, ...]  # polynomial (highest power first) of log(measured / model tokens/s)
    power: tuple[float, ...]
    layout: str = ""  # how the measured engine laid the GPUs out, where not tensor parallel ("EP 2")

    def label(self) -> str:
        """Where the correction comes from, e.g. "H100 rows (n=11, EP 2)"."""
        return f"{self.gpu} rows (n={self.rows}{', ' + self.layout if self.layout else ''})"

    def at(self, batch: float) -> tuple[float, float]:
        """(speed, power) correction factors at a batch limit."""
        x = min(max(math.log2(batch), self.lo), self.hi)
        return math.exp(float(np.polyval(self.speed, x))), math.exp(float(np.polyval(self.power, x)))


def _curve(xs: list[float], ys: list[float]) -> tuple[float, ...]:
    distinct = len(set(xs))
    if distinct < 2:
        return (float(np.mean(ys)),)
    degree = 2 if distinct >= CURVE_MIN_BATCHES else 1
    return tuple(float(c) for c in np.polyfit(xs, ys, degree))


def _model_point(w: Workload, p: Part, point: OperatingPoint, f: Fit, speed: float) -> tuple[float, float]:
    """(step time s, power per GPU W) of the model alone at a point."""
    s = _step(w, p, point.max_batch, point.precision, point.tp, w.mean_input_tokens)
    return _capped(s, _step_time_s(s, f, speed), p, f, speed)


@cache
def correction_of(w: Workload, gpu: str, tp: int, precision: str) -> Correction | None:
    """The correction of `w` on `gpu` at TP `tp` from its measured rows (None: none measured)."""
    return correction_from(w, gpu, tp, precision)


def correction_rows(w: Workload, gpu: str, tp: int, precision: str) -> list[dict]:
    """The ML.ENERGY v3 rows a correction of (`w`, `gpu`, `tp` GPUs, precision) is drawn
    through: every row of one replica on that many GPUs, however the engine laid them out.
    The model's group of `tp` GPUs splits weights and KV cache `tp` ways, as tensor and
    expert parallelism both do; where the engine chose expert parallelism for a mixture of
    experts (ML.ENERGY v3 serves Qwen3-Coder-30B-A3B on two H100s at EP 2, TP 1), the
    correction carries what that layout costs or saves against the model's all-reduces."""
    model_id = _model_id(w)
    if not model_id or w.kind != "inference" or gpu not in parts():
        return []
    return [r for r in fit_rows() if r["dataset"] == "mlenergy-v3" and r["model_id"] == model_id
            and r["gpu"] == gpu and r["task"] == w.task and r["num_gpus"] == tp
            and r["precision"] == precision]


def correction_from(w: Workload, gpu: str, tp: int, precision: str, leave_out: dict | None = None
                    ) -> Correction | None:
    """The correction of `w` on `gpu` at TP `tp` from its measured rows, without the row
    `leave_out` (bench.model's leave-one-row-out check of the planner's path). None: no row."""
    rows = [r for r in correction_rows(w, gpu, tp, precision) if r is not leave_out]
    if not rows:
        return None
    f, part = fit(), parts()[gpu]
    speed = stack_of(gpu, precision=precision).factor
    xs, ys, zs = [], [], []
    for r in rows:
        t, power = _model_point(w, part, OperatingPoint(r["max_num_seqs"], precision, tp), f, speed)
        xs.append(math.log2(r["max_num_seqs"]))
        ys.append(math.log(r["output_tokens_per_s"] / (r["max_num_seqs"] / t)))
        zs.append(math.log(r["power_w_all_gpus"] / tp / power))
    ep = max(r.get("expert_parallel", 1) for r in rows)
    return Correction(gpu, len(rows), min(xs), max(xs), _curve(xs, ys), _curve(xs, zs),
                      f"EP {ep}" if ep > 1 else "")


def _corrections(w: Workload, p: Part, point: OperatingPoint, leave_out: dict | None = None
                 ) -> tuple[float, float, str]:
    """(speed, power, what) corrections for `w` on part `p` at `point`.

    Speed: a measured part's own correction; a part not measured borrows the largest of the
    measured corrections (same vendor, TP and precision) of the parts it dominates, or the
    smallest of its vendor's where it dominates none (1 for a vendor with none measured).
    Then it is raised, where needed, to the predicted speed of every catalog part it
    dominates, so a part never comes out slower than one it dominates (H200 takes H100's
    correction; B200 follows its own rows wherever they put it above H100 and H200). The
    floor is on the predictions, not on the factors: a factor borrowed from H100 would put
    B200 30 % above its own measurements at small batches. Power: `p`'s own (1 where
    unmeasured). `leave_out`: a measured row its GPU's correction is drawn without
    (bench.model's leave-one-row-out check)."""
    if not _v3_gpus():
        return 1.0, 1.0, ""
    speed, label = _speed_correction(w, p, point, leave_out)
    own = _correction_for(w, p.name, point, leave_out) if parts().get(p.name) == p else None
    return speed, own.at(point.max_batch)[1] if own is not None else 1.0, label


def _correction_for(w: Workload, gpu: str, point: OperatingPoint, leave_out: dict | None) -> Correction | None:
    if leave_out is not None and leave_out["gpu"] == gpu:
        return correction_from(w, gpu, point.tp, point.precision, leave_out)
    return correction_of(w, gpu, point.tp, point.precision)


def _borrowed_correction(w: Workload, p: Part, point: OperatingPoint, leave_out: dict | None
                         ) -> tuple[float, str]:
    """`p`'s own speed correction at `point`, or the one it borrows (see `_corrections`)."""
    b = point.max_batch
    if parts().get(p.name) == p:
        own = _correction_for(w, p.name, point, leave_out)
        if own is not None:
            return own.at(b)[0], own.label()
    own_of = {}
    for gpu in _v3_gpus():
        c = _correction_for(w, gpu, point, leave_out)
        if c is not None and vendor(gpu) == vendor(p.name):
            own_of[gpu] = (c.at(b)[0], c.label(), gpu)
    if not own_of:
        return 1.0, ""
    # what a part lends: its own correction, or that of a measured part it dominates if larger
    # (B200 lends no less than H100's: its own rows carry Blackwell's young software, which
    # says nothing of an older part's)
    measured = [max(m for g, m in own_of.items() if g == gpu or dominates(parts()[gpu], parts()[g]))
                for gpu in own_of]
    below = [m for m in measured if dominates(p, parts()[m[2]])]
    if below:
        return max(below)[:2]
    speed, label, _ = min(measured)
    return speed, f"the smallest same-vendor correction, {label}"


def _strictly_dominated(p: Part) -> tuple[Part, ...]:
    """The catalog parts `p` dominates, less those with the same figures under another name
    (they borrow the same correction; both ways would never end)."""
    return tuple(q for q in parts().values() if q.name != p.name and dominates(p, q) and not dominates(q, p))


@cache
def _dominated(name: str) -> tuple[Part, ...]:
    return _strictly_dominated(parts()[name])


def _speed_correction(w: Workload, p: Part, point: OperatingPoint, leave_out: dict | None
                      ) -> tuple[float, str]:
    """The speed correction of `_corrections`: borrowed or own, floored at the predicted speed
    of every catalog part `p` dominates (recursively, on this same path). Cached for catalog
    parts (the planner asks per prediction)."""
    if leave_out is None and parts().get(p.name) == p:
        return _catalog_speed_correction(w, p.name, point)
    return _floored_speed_correction(w, p, point, leave_out)


@lru_cache(maxsize=100_000)  # bounded: parametric workloads are open-ended
def _catalog_speed_correction(w: Workload, name: str, point: OperatingPoint) -> tuple[float, str]:
    return _floored_speed_correction(w, parts()[name], point, None)


def _floored_speed_correction(w: Workload, p: Part, point: OperatingPoint, leave_out: dict | None
                              ) -> tuple[float, str]:
    speed, label = _borrowed_correction(w, p, point, leave_out)
    f = fit()
    t_p, raised_to = None, None
    for q in (_dominated(p.name) if parts().get(p.name) == p else _strictly_dominated(p)):
        if not q.supports(point.precision):
            continue
        q_speed, _ = _speed_correction(w, q, point, leave_out)
        if q_speed == 1.0 and speed == 1.0:
            continue  # neither corrected: the model alone keeps the order
        if t_p is None:
            t_p = _model_point(w, p, point, f, stack_of(p.name, precision=point.precision).factor)[0]
        t_q = _model_point(w, q, point, f, stack_of(q.name, precision=point.precision).factor)[0]
        # the factor that makes p as fast as q's prediction (a hair over: never slower by a rounding)
        floor = t_p / t_q * q_speed * (1 + 1e-12)
        if floor > speed:
            speed, raised_to = floor, q.name
    if raised_to is not None:
        label = (f"{label}, " if label else "") + f"raised to {raised_to}'s predicted speed"
    return speed, label


@cache
def _v3_gpus() -> tuple[str, ...]:
    """The GPU models with ML.ENERGY v3 rows in the fit (the ones with corrections)."""
    return tuple(sorted({r["gpu"] for r in fit_rows() if r["dataset"] == "mlenergy-v3"}))


def predict(w: Workload, gpu: str | Part, point: OperatingPoint, *, use_measurements: bool = True,
            f: Fit | None = None, leave_out: dict | None = None) -> Prediction:
    """All figures for `w` on `point.tp` GPUs of model `gpu` (a tensor-parallel group): the one
    prediction path of the planner, `profiles`, `bench.model` and the simulator.

    The model (at the part's vendor's serving-stack factor, `stack_of`) times a correction
    smooth in batch from the measured rows of this workload (`_corrections`), never a raw
    measured figure. `gpu` is a name from `parts()` or a Part (a hypothetical part, for
    tests and what-ifs). A precision the part lacks raises ValueError. A point that does not
    fit in memory is still predicted (fits=False) so callers can show why it was refused.
    use_measurements=False (or a fit `f` other than the default): the model alone.
    `leave_out`: one measured row (from `fit_rows`) its GPU's correction is drawn without,
    to check the path out of sample (bench.model)."""
    default = f is None or f is fit()
    f = f or fit()
    p = gpu if isinstance(gpu, Part) else parts()[gpu]
    gpu = p.name
    if not p.supports(point.precision):
        raise ValueError(f"{gpu} has no {point.precision} tensor cores; it supports {', '.join(p.peak_tflops)}")
    if point.max_batch < 1 or point.tp < 1:
        raise ValueError("max_batch and tp must be at least 1")
    need = memory_needed_gib(w, point)
    avail = MEMORY_UTILIZATION * p.memory_gib
    spread = measurements()["length_spread"]
    measured_gpu = gpu in f.gpus
    kind = "fitted" if measured_gpu else "roofline"
    if w.kind == "train":
        return _predict_train(w, p, point, need, avail, f)
    stack = stack_of(gpu, precision=point.precision)
    t, power = _model_point(w, p, point, f, stack.factor)
    speed_c, power_c, what = _corrections(w, p, point, leave_out) if use_measurements and default else (1.0, 1.0, "")
    t = t / speed_c
    power = min(power * power_c, p.tdp_w)
    tokens_s = point.max_batch / t
    tpot50, tpot95 = f.itl_p50_over_step * t * 1e3, f.itl_p95_over_step * t * 1e3
    sources = {"throughput": kind, "latency": kind, "power": kind if measured_gpu else "power-model",
               "ttft": "queue model", "memory": "roofline", "stack": stack.label()}
    if what:
        sources["correction"] = f"x{speed_c:.3f} speed, x{power_c:.3f} power, from {what}"
        if what.startswith(gpu + " "):
            sources.update(throughput="corrected", latency="corrected", power="corrected")
        else:
            sources.update(throughput=kind + "+correction", latency=kind + "+correction")
    ttft50, ttft95 = _ttft_ms(w, p, point, t, f, stack.factor)
    power_all = power * point.tp
    j_token = power_all / tokens_s
    return Prediction(
        w.name, gpu, point, need <= avail, need, avail, tokens_s / w.mean_output_tokens, tokens_s, power_all,
        j_token * w.mean_output_tokens, j_token, ttft50, ttft95, tpot50, tpot95,
        ttft50 + spread["output_p95_over_mean"] * w.mean_output_tokens * tpot50,
        f.power_rel_rms if measured_gpu else f.power_transfer_rel, sources, stack, speed_c)


def _predict_train(w: Workload, p: Part, point: OperatingPoint, need: float, avail: float, f: Fit) -> Prediction:
    """Nominal training: 6 x params FLOPs per token at NOMINAL_TRAIN_MFU; power from the
    fitted power model at that FLOP rate, with the same TDP throttle as inference (no KV
    cache; weights, gradients and Adam state: 16 bytes/param)."""
    need = w.total_params_b * 1e9 * 16 / point.tp / GIB
    flops_s = NOMINAL_TRAIN_MFU * p.peak_tflops[point.precision] * 1e12 * point.tp
    power_gpu = f.p_static_w + f.e_flop_pj * BYTES_PER_PARAM[point.precision] / 2 * 1e-12 * flops_s / point.tp
    throttle = max(1.0, power_gpu / p.tdp_w)  # over the TDP: runs at the TDP, as much longer
    tokens_s = flops_s / (6 * w.total_params_b * 1e9) / throttle
    power = power_gpu / throttle * point.tp
    sample_tokens = w.mean_input_tokens + w.mean_output_tokens
    step_ms = sample_tokens * point.max_batch / tokens_s * 1e3
    j_token = power / tokens_s
    return Prediction(w.name, p.name, point, need <= avail, need, avail, tokens_s / sample_tokens, tokens_s,
                      power, j_token * sample_tokens, j_token, step_ms, step_ms, step_ms, step_ms, step_ms,
                      f.power_transfer_rel, {k: "nominal" for k in ("throughput", "latency", "power", "ttft", "memory")})


def frontier(w: Workload, gpu: str, *, max_tp: int = 8, precisions: tuple[str, ...] | None = None,
             batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)) -> list[Prediction]:
    """Every operating point of `w` on `gpu` that fits in memory: each precision in
    `precisions` the part supports (default: only the workload's own; quantising is the job
    owner's call, not the planner's), TP 1..max_tp (powers of two), each batch limit."""
    p = parts()[gpu]
    wanted = precisions if precisions is not None else (w.precision,)
    out = []
    for prec, tp, b in itertools.product([x for x in wanted if p.supports(x)], (1, 2, 4, 8), batches):
        if tp <= max_tp:
            pred = predict(replace(w, precision=prec), gpu, OperatingPoint(b, prec, tp))
            if pred.fits:
                out.append(pred)
    return out


def best_point(w: Workload, gpu: str, *, ttft_p95_ms: float | None = None, tpot_p95_ms: float | None = None,
               latency_p95_ms: float | None = None, max_tp: int = 8,
               precisions: tuple[str, ...] | None = None) -> Prediction | None:
    """The most energy-efficient operating point (lowest J per prompt) of `w` on `gpu` that
    fits in memory and meets every latency limit given (None: no limit); None when no point
    does. This is the planner's question per candidate GPU model (issue 18, item 6)."""
    ok = [p for p in frontier(w, gpu, max_tp=max_tp, precisions=precisions)
          if (ttft_p95_ms is None or p.ttft_p95_ms <= ttft_p95_ms)
          and (tpot_p95_ms is None or p.tpot_p95_ms <= tpot_p95_ms)
          and (latency_p95_ms is None or p.latency_p95_ms <= latency_p95_ms)]
    return min(ok, key=lambda p: (p.j_per_prompt, p.point.tp, p.point.max_batch), default=None)


# ---------------------------------------------------------------------------- the fit


def _step_target_s(r: dict) -> float:
    return r["avg_batch_size"] / r["output_tokens_per_s"]


@cache
def fit_rows() -> tuple[dict, ...]:
    """The ML.ENERGY rows the fit uses. Left out, by rule (and listed by bench.model), runs
    where the serving stack, not the part, set the figure:

    * a row whose throughput is more than 10 % below the same configuration's at a smaller
      batch (not a stable operating point);
    * a B200 row slower than the H100 row of the same model, task, GPU count and batch
      limit (B200 has 2.4x the bandwidth and 2.3x the compute), and every B200 row of a
      (model, task) where most batch limits measured on both are such rows."""
    rows = [r for r in mlenergy_rows() if r["precision"] == "bf16"]
    slower = {id(r) for r in rows if r["gpu"] == "B200" and _h100_faster(r, rows) is True}
    groups: dict[tuple, list[bool]] = {}
    for r in rows:
        if r["gpu"] == "B200" and _h100_faster(r, rows) is not None:
            groups.setdefault((r["model_id"], r["task"]), []).append(id(r) in slower)
    bad_groups = {k for k, v in groups.items() if sum(v) > len(v) / 2}
    keep = []
    for r in rows:
        smaller = [o for o in rows if _same_config(o, r) and o["avg_batch_size"] < r["avg_batch_size"]]
        if any(o["output_tokens_per_s"] > 1.1 * r["output_tokens_per_s"] for o in smaller):
            continue
        if id(r) in slower or (r["gpu"] == "B200" and (r["model_id"], r["task"]) in bad_groups):
            continue
        keep.append(r)
    return tuple(keep)


def _h100_faster(r: dict, rows: list[dict]) -> bool | None:
    """Whether an H100 row with r's model, task, GPU count and batch limit beat r (None: no such row)."""
    h = [o for o in rows if o["gpu"] == "H100" and o["dataset"] == r["dataset"] and o["task"] == r["task"]
         and o["model_id"] == r["model_id"] and o["num_gpus"] == r["num_gpus"]
         and o["max_num_seqs"] == r["max_num_seqs"]]
    if not h:
        return None
    return any(o["output_tokens_per_s"] > r["output_tokens_per_s"] for o in h)


def _same_config(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("dataset", "task", "model_id", "gpu", "num_gpus", "tensor_parallel"))


def _row_workload(r: dict, input_tokens: float) -> Workload:
    a = _architecture(r["model_id"])
    return Workload(r["model_id"], a["total_params_b"], a["active_params_b"], input_tokens,
                    r["mean_output_tokens"], a["kv_bytes_per_token_bf16"], r["precision"], **_shape(a))


def _row_step(r: dict, input_tokens: float) -> _Step:
    return _step(_row_workload(r, input_tokens), parts()[r["gpu"]], r["avg_batch_size"], r["precision"],
                 r["num_gpus"], input_tokens)


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares, min |a x - b| with x >= 0: Lawson and Hanson's active set
    method on the normal equations (the fit solves ~2,000 of these, each with a handful
    of columns and ~100 rows), with columns scaled to unit norm for conditioning."""
    n = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    gram = (a / norms).T @ (a / norms)
    rhs = (a / norms).T @ b
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    for _ in range(3 * n + 10):
        grad = rhs - gram @ x
        if passive.all() or (grad[~passive] <= 1e-12).all():
            break
        passive[int(np.argmax(np.where(passive, -np.inf, grad)))] = True
        while True:
            z = np.zeros(n)
            idx = np.flatnonzero(passive)
            z[idx] = np.linalg.solve(gram[np.ix_(idx, idx)], rhs[idx])
            if (z[idx] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x / norms


def _bounded_lsq(x: np.ndarray, y: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Least squares with lower bounds: non-negative least squares on (coef - lower)."""
    return lower + _nnls(x, y - x @ lower)


_INPUT_GRID = tuple(float(v) for v in np.unique(np.round(np.geomspace(16, 8192, 40))))
_STEP_TERMS = ("t0", "per_layer", "allreduce", "per_seq", "v2_t0", "v2_per_seq", "v2_per_worker", "inv_eta_mem")
_RATIO_GRID = tuple(float(v) for v in np.arange(1.0, 3.001, 0.05))  # eta_mem / eta_compute
_OVERLAP_GRID = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0, math.inf)  # the roofline's overlap exponent p


@dataclass(frozen=True)
class _StepDesign:
    """The step-time regression of a set of rows, with the two input-dependent columns kept
    apart: memory and compute seconds are linear in a task's input tokens, so each trial
    input in the search costs one multiply, not a rebuild."""

    fixed: np.ndarray  # rows x 7: t0 .. v2_per_worker, over the measured step time
    mem0: np.ndarray  # bytes / bandwidth at input 0, over the measured step time
    mem1: np.ndarray  # ... per input token
    comp0: np.ndarray
    comp1: np.ndarray
    task: tuple[str, ...]

    def matrix(self, inputs: dict[str, float], ratio: float, p: float) -> np.ndarray:
        """Columns: the fixed terms, then the decode roofline overlap(memory s, ratio x decode
        compute s, p) + ratio x prefill compute s, at eta_mem 1 (its coefficient is 1 / eta_mem;
        eta_compute = eta_mem / ratio). comp0 is the decode compute (input 0), comp1 x input
        the prefill's."""
        tokens = np.array([inputs[t] for t in self.task])
        roof = _overlap(self.mem0 + self.mem1 * tokens, ratio * self.comp0, p) + ratio * self.comp1 * tokens
        return np.column_stack([self.fixed, roof])


def _step_design(rows: list[dict]) -> _StepDesign:
    fixed, m0, m1, c0, c1 = [], [], [], [], []
    for r in rows:
        s0, s1 = _row_step(r, 0.0), _row_step(r, 1.0)
        v2 = r["dataset"] == "mlenergy-v2"
        t = _step_target_s(r)
        fixed.append(np.array([1.0, s0.layers, s0.layers * (s0.tp > 1), s0.batch, v2, v2 * s0.batch,
                               v2 * (s0.tp - 1)]) / t)
        m0.append(s0.mem_s / t)
        m1.append((s1.mem_s - s0.mem_s) / t)
        c0.append(s0.compute_s / t)
        c1.append((s1.compute_s - s0.compute_s) / t)
    return _StepDesign(np.array(fixed), np.array(m0), np.array(m1), np.array(c0), np.array(c1),
                       tuple(r["task"] for r in rows))


_STEP_LOWER = np.array([0.0] * 7 + [1.0])  # every cost >= 0; eta_mem at most 100 %


def _max_input_tokens(rows: list[dict]) -> float:
    """The longest mean input with which every row's measured batch fits in its GPUs' KV
    cache: (MEMORY_UTILIZATION x memory x GPUs - weights) / KV bytes per token / batch -
    output / 2 (a sequence is on average half-way through its output); inf for no rows.
    The effective input of ML.ENERGY v2's task is searched only up to this over its v2
    rows: that engine (vLLM v0, no prefix caching by default) could not have run the batch
    otherwise. Not for v3: vLLM v1 caches shared prefixes (system prompts, a repository's
    context), so sequences share KV blocks and skip their prefill, and its effective input
    is the uncached part."""
    out = math.inf
    for r in rows:
        a = _architecture(r["model_id"])
        kv_bytes = (MEMORY_UTILIZATION * parts()[r["gpu"]].memory_gib * GIB * r["num_gpus"]
                    - a["total_params_b"] * 1e9 * BYTES_PER_PARAM[r["precision"]])
        out = min(out, kv_bytes / a["kv_bytes_per_token_bf16"] / r["avg_batch_size"] - r["mean_output_tokens"] / 2)
    return out


def _fit_step(design: _StepDesign, inputs: dict[str, float], ratio: float, p: float) -> tuple[np.ndarray, float]:
    """The step-time coefficients (seconds, in _STEP_TERMS order) minimising the relative
    error of every row's step time, given each task's input tokens, the efficiency ratio
    and the overlap exponent; and that RMS error."""
    x = design.matrix(inputs, ratio, p)
    y = np.ones(len(x))
    coef = _bounded_lsq(x, y, _STEP_LOWER)
    return coef, float(np.sqrt(np.mean((x @ coef - y) ** 2)))


@cache
def fit(exclude_gpu: str | None = None) -> Fit:
    """Fit the model on every usable ML.ENERGY row (or all but one GPU's, for leave-one-out).

    Step time: non-negative least squares in relative error for the step terms of the
    module docstring (efficiencies at most 1), inside a coordinate search over each task's
    effective input tokens. Power: non-negative least squares in relative error for
    (p_static, e_byte, e_flop, e_seq) on the v3 rows, given their measured step times. v2
    publishes energy per request, not power; the power it implies (J/request x requests/s)
    counts the gaps of its older harness and disagrees with v3's measured power on the same
    H100 and model by up to 2x, so it is used for speed only. With `exclude_gpu`, that
    GPU's rows enter nothing: not the step, power or ITL fits (the MLPerf stack factors
    are fitted on top of a fit, `stack_speeds`)."""
    if exclude_gpu is None and "fit" in _PRIMED:
        return _PRIMED["fit"]
    rows = [r for r in fit_rows() if r["gpu"] != exclude_gpu]
    tasks = sorted({r["task"] for r in rows})
    ceiling = {t: _max_input_tokens([r for r in rows if r["task"] == t and r["dataset"] == "mlenergy-v2"])
               for t in tasks}
    grid = {t: [v for v in _INPUT_GRID if v <= ceiling[t]] or [_INPUT_GRID[0]] for t in tasks}
    inputs = {t: min(256.0, grid[t][-1]) for t in tasks}
    ratio, p = 1.0, math.inf
    design = _step_design(rows)
    best = _fit_step(design, inputs, ratio, p)
    for _ in range(4):  # coordinate search; stops when a round changes nothing
        before = (dict(inputs), ratio, p)
        for t in tasks:
            for v in grid[t]:
                trial = _fit_step(design, {**inputs, t: v}, ratio, p)
                if trial[1] < best[1]:
                    best, inputs = trial, {**inputs, t: v}
        for v in _RATIO_GRID:
            trial = _fit_step(design, inputs, v, p)
            if trial[1] < best[1]:
                best, ratio = trial, v
        for v in _OVERLAP_GRID:
            trial = _fit_step(design, inputs, ratio, v)
            if trial[1] < best[1]:
                best, p = trial, v
        if (inputs, ratio, p) == before:
            break
    coef, step_rms = best
    c = dict(zip(_STEP_TERMS, (float(v) for v in coef)))
    eta_mem = 1 / c["inv_eta_mem"]
    f = Fit(c["t0"] * 1e3, c["per_seq"] * 1e6, eta_mem, eta_mem / ratio, inputs, 1.0,
            0.0, 0.0, 0.0, 0.0, 0.0, step_rms, 0.0, len(rows), tuple(sorted({r["gpu"] for r in rows})),
            per_layer_us=c["per_layer"] * 1e6, allreduce_us=c["allreduce"] * 1e6, v2_t0_ms=c["v2_t0"] * 1e3,
            v2_per_seq_us=c["v2_per_seq"] * 1e6, v2_per_worker_ms=c["v2_per_worker"] * 1e3, overlap_p=p)
    # power: P = p_static + e_byte * bytes/t + e_flop * flops/t + e_seq * batch/t, relative error
    x, y = [], []
    for r in (r for r in rows if r["dataset"] == "mlenergy-v3"):
        s = _row_step(r, inputs[r["task"]])
        t = _step_target_s(r)
        pw = r["power_w_all_gpus"] / r["num_gpus"]
        x.append([1 / pw, (s.weight_bytes + s.kv_bytes) / t * 1e-12 / pw, s.flops / t * 1e-12 / pw,
                  s.batch / t * 1e-3 / pw])
        y.append(1.0)
    xa, ya = np.array(x), np.array(y)
    pc = _nnls(xa, ya)
    power_rms = float(np.sqrt(np.mean((xa @ pc - ya) ** 2)))
    ratios50, ratios95 = [], []
    for r in rows:
        if "itl_p50_ms" in r:
            t = _step_target_s(r) * 1e3
            ratios50.append(r["itl_p50_ms"] / t)
            ratios95.append(r["itl_p95_ms"] / t)
    f = replace(f, itl_p50_over_step=float(np.median(ratios50)), itl_p95_over_step=float(np.median(ratios95)),
                p_static_w=float(pc[0]), e_byte_pj=float(pc[1]), e_flop_pj=float(pc[2]), e_seq_mj=float(pc[3]),
                power_rel_rms=power_rms)
    if exclude_gpu is not None:
        return f
    # Uncertainty of power on a part the fit has not seen (the AMD parts, H200): for each
    # GPU with measured power, the median |error| of a fit without it on its rows; the worst.
    transfer = []
    for gpu in sorted({r["gpu"] for r in rows if r["dataset"] == "mlenergy-v3"}):
        held = fit(exclude_gpu=gpu)
        transfer.append(float(np.median([abs(reproduce_row(r, held)["power_w"] / r["power_w_all_gpus"] - 1)
                                         for r in rows if r["gpu"] == gpu and r["dataset"] == "mlenergy-v3"])))
    return replace(f, power_transfer_rel=max(transfer))


def reproduce_row(r: dict, f: Fit | None = None) -> dict[str, float]:
    """The model's figures for one ML.ENERGY row's own configuration (its achieved batch,
    its dataset's serving stack), for validation: tokens/s, W (all GPUs), J/token."""
    f = f or fit()
    s = _row_step(r, f.input_tokens.get(r["task"], f.input_tokens.get("lm-arena-chat", 256.0)))
    t = _step_time_s(s, f) + (_v2_extra_s(s, f) if r["dataset"] == "mlenergy-v2" else 0.0)
    t, power = _capped(s, t, parts()[r["gpu"]], f)
    tokens_s = r["avg_batch_size"] / t
    return {"tokens_per_s": tokens_s, "power_w": power * r["num_gpus"],
            "j_per_token": power * r["num_gpus"] / tokens_s, "itl_p50_ms": f.itl_p50_over_step * t * 1e3}
