"""The operating point the planner picks for a job on a GPU model, from the performance model.

For each (workload, GPU model, GPU count k, latency SLOs) the planner asks one question: of
every operating point (batch limit, precision, tensor-parallel degree) of `policies.model.perf_model`
that fits in memory and meets every SLO, which needs the fewest joules per prompt? The job's
k GPUs then run k / tp data-parallel replicas of that point (tp divides k). None fits in
memory: the model is excluded for "memory"; some fit but none meets the SLOs: for "slo".

Workloads (the job's `workload` field):

* a preset of `perf_model.presets()`: `llm-chat-8b`, `llm-chat-70b`, `llm-code`,
  `llm-reason`, `mlperf-llama2-70b`, and the CLI's names `llm-inference` and `eval`;
  `train` and `finetune` are nominal training presets without a latency model;
* a parametric LLM, `llm:` followed by comma-separated items (see `parse_spec`):
  `llm:70b`, `llm:70b,fp8`, `llm:params=47,active=13,in=2048,out=512,precision=fp8`.

Training presets (`train`, `finetune`) are nominal: one point per GPU, data-parallel, no
latency model and no memory exclusion (see `nominal`).

Latency SLOs (all p95, all optional): TTFT, TPOT, and per-prompt latency (TTFT plus the
output length's p95 x TPOT p50: the real output-length spread). A job's own SLO overrides
its preset's default (`DEFAULT_SLOS`), each figure separately. A job with an SLO whose
workload has no latency model is refused here ("slo"): it is never planned unconstrained;
the API rejects such a job at submit (`latency_model_names` lists the workloads that have one).

Learned corrections (`policies.model.learning`: a profile of this cluster's runs against the seed
profile of the same workload and GPU model) scale the model's throughput and power by their
ratios; latencies scale by the inverse throughput ratio, so a workload that runs slower here
than predicted also meets its SLOs only at smaller batches.

Pure and cached: one frontier per (workload, model, k), one choice per (workload, model, k,
SLOs, throughput ratio), so a planner tick of thousands of jobs asks the model a few dozen times.
The caches are bounded (least recently used out): their keys include what users submit
(parametric specs, SLOs) and what the cluster learns (ratios that change with every run), so
an unbounded memo would grow for as long as the daemon runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from policies.types import sig
from policies.model.perf_model import (BYTES_PER_PARAM, OperatingPoint, Prediction, Workload, frontier, measurements,
                                 parts, predict, presets)

LLM_PREFIX = "llm:"
_SPECS_CACHED = 1024  # parametric specs parsed
_FRONTIERS_CACHED = 4096  # (workload, model[, k]) frontiers: each a few hundred predictions
_CHOICES_CACHED = 65536  # (workload, model, k, SLOs, learned ratios) choices


@dataclass(frozen=True)
class Slos:
    """Latency limits in ms, p95 each; None: no limit."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    latency_ms: float | None = None

    def given(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None or self.latency_ms is not None


# Per-preset defaults, applied where the job sets no limit of its own. Inference presets: the
# MLPerf Inference Datacenter "Server" limits of the closest benchmark (llama3.1-8b: TTFT 2 s,
# TPOT 100 ms; llama2-70b: TTFT 2 s, TPOT 200 ms), so a batch job still streams usably and the
# planner never picks a batch limit whose tokens trickle. Training presets: none.
_SERVER_8B = Slos(ttft_ms=2000.0, tpot_ms=100.0)
_SERVER_70B = Slos(ttft_ms=2000.0, tpot_ms=200.0)
DEFAULT_SLOS: dict[str, Slos] = {
    "llm-chat-8b": _SERVER_8B, "llm-code": _SERVER_8B, "llm-reason": _SERVER_8B,
    "llm-inference": _SERVER_8B, "eval": _SERVER_8B,
    "llm-chat-70b": _SERVER_70B, "mlperf-llama2-70b": _SERVER_70B,
}
PARAMETRIC_DEFAULT_SLOS = _SERVER_70B  # `llm:` workloads


class WorkloadSpecError(ValueError):
    """A `llm:` workload spec that does not parse."""


_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)b$")
_KEYS = {"params": "total_params_b", "active": "active_params_b", "in": "mean_input_tokens",
         "out": "mean_output_tokens", "precision": "precision"}
SPEC_HELP = ("llm:SIZEb[,PRECISION] or llm:params=B,active=B,in=TOKENS,out=TOKENS,precision=bf16|fp8|fp4 "
             "(sizes in billions of parameters; active defaults to params, in/out to the Azure LLM "
             "conv trace's means, precision to bf16), e.g. llm:70b or llm:70b,fp8")


@lru_cache(maxsize=_SPECS_CACHED)
def parse_spec(spec: str) -> Workload:
    """A parametric workload from its spec (see `SPEC_HELP`); WorkloadSpecError says what is wrong.

    Items after `llm:`, comma-separated: `SIZEb` (total parameters, billions), a bare
    precision, or key=value with keys params, active, in, out, precision. KV cache per token
    is estimated from the size (`Workload.kv_bytes`)."""
    if not spec.startswith(LLM_PREFIX):
        raise WorkloadSpecError(f"{spec!r} is not a parametric workload (they start with {LLM_PREFIX!r})")
    spread = measurements()["length_spread"]
    fields: dict[str, float | str] = {"mean_input_tokens": float(spread["input_mean_tokens"]),
                                      "mean_output_tokens": float(spread["output_mean_tokens"]),
                                      "precision": "bf16"}
    items = [x.strip() for x in spec[len(LLM_PREFIX):].split(",")]
    if not items or items == [""]:
        raise WorkloadSpecError(f"empty workload spec {spec!r}; use {SPEC_HELP}")
    for item in items:
        size = _SIZE_RE.match(item)
        if size:
            fields["total_params_b"] = float(size.group(1))
        elif item in BYTES_PER_PARAM:
            fields["precision"] = item
        elif "=" in item:
            key, _, value = item.partition("=")
            if key not in _KEYS:
                raise WorkloadSpecError(f"unknown key {key!r} in workload spec {spec!r}; keys: "
                                        f"{', '.join(_KEYS)}")
            if key == "precision":
                if value not in BYTES_PER_PARAM:
                    raise WorkloadSpecError(f"unknown precision {value!r} in {spec!r}; one of "
                                            f"{', '.join(BYTES_PER_PARAM)}")
                fields["precision"] = value
                continue
            try:
                number = float(value.removesuffix("b") if key in ("params", "active") else value)
            except ValueError:
                raise WorkloadSpecError(f"{key}={value!r} in {spec!r} is not a number") from None
            if not (math.isfinite(number) and number > 0):
                raise WorkloadSpecError(f"{key} must be positive in {spec!r}")
            fields[_KEYS[key]] = number
        else:
            raise WorkloadSpecError(f"cannot read {item!r} in workload spec {spec!r}; use {SPEC_HELP}")
    if "total_params_b" not in fields:
        raise WorkloadSpecError(f"workload spec {spec!r} gives no model size; use {SPEC_HELP}")
    total = float(fields["total_params_b"])
    active = float(fields.get("active_params_b", total))
    if active > total:
        raise WorkloadSpecError(f"active parameters ({active:g}B) exceed the total ({total:g}B) in {spec!r}")
    if total > 10_000:
        raise WorkloadSpecError(f"{total:g}B parameters in {spec!r}: more than any GPU node holds")
    return Workload(spec, total, active, float(fields["mean_input_tokens"]), float(fields["mean_output_tokens"]),
                    precision=str(fields["precision"]), note="parametric (" + spec + ")")


def workload_model(name: str | None) -> Workload | None:
    """The performance model's workload for a job's `workload` field: a preset, a parametric
    spec, or None (no workload, or a class the model does not know). A malformed `llm:` spec
    raises WorkloadSpecError."""
    if name is None:
        return None
    if name.startswith(LLM_PREFIX):
        return parse_spec(name)
    return presets().get(name)


def has_latency_model(name: str | None) -> bool:
    """Whether SLOs can be checked for this workload: an inference preset (each has its
    default SLOs in `DEFAULT_SLOS`) or a `llm:` spec that parses. Cheap: no model fit."""
    if name is None:
        return False
    if name.startswith(LLM_PREFIX):
        try:
            parse_spec(name)
        except WorkloadSpecError:
            return False
        return True
    return name in DEFAULT_SLOS


def latency_model_names() -> list[str]:
    """The workloads with a latency model, for error messages: the inference presets and the
    parametric form."""
    return sorted(DEFAULT_SLOS) + [LLM_PREFIX + "SIZEb (e.g. llm:70b)"]


def slos_for(workload: str | None, ttft_ms: float | None, tpot_ms: float | None,
             latency_ms: float | None) -> Slos:
    """The job's SLOs: its own, else its preset's default, figure by figure."""
    if workload is not None and workload.startswith(LLM_PREFIX):
        default = PARAMETRIC_DEFAULT_SLOS
    else:
        default = DEFAULT_SLOS.get(workload or "", Slos())
    return Slos(ttft_ms if ttft_ms is not None else default.ttft_ms,
                tpot_ms if tpot_ms is not None else default.tpot_ms,
                latency_ms if latency_ms is not None else default.latency_ms)


@dataclass(frozen=True)
class Choice:
    """The operating point of a job on k GPUs of one model, and what it achieves there.

    `prompts_per_s` and `power_w` are for all k GPUs (k / tp replicas), after any learned
    correction; the latencies too. `binding` names the SLOs that ruled out a cheaper point
    (empty: the cheapest point that fits met them all)."""

    workload: str
    model: str
    gpus: int
    point: OperatingPoint
    replicas: int
    prediction: Prediction
    prompts_per_s: float
    power_w: float
    ttft_p95_ms: float
    tpot_p95_ms: float
    latency_p95_ms: float
    slos: Slos
    binding: tuple[str, ...]
    defaulted: tuple[str, ...] = ()  # SLOs that are the preset's default, not the job's
    inference: bool = True  # False: a nominal training point (its latencies mean nothing)

    @property
    def j_per_prompt(self) -> float:
        return self.power_w / self.prompts_per_s

    @cached_property
    def note(self) -> str:
        """`describe()`, made once: every estimate of the job on this model carries it."""
        return self.describe()

    def describe(self) -> str:
        """E.g. "H200 at batch 64 BF16 TP1: TPOT p95 38 ms <= 40 ms (binding)"."""
        if not self.inference:
            return f"{self.model}: nominal training figures, {sig(self.j_per_prompt)} J/sample"
        p = self.point
        head = f"{self.model} at batch {p.max_batch} {p.precision.upper()} TP{p.tp}"
        if self.replicas > 1:
            head += f" x{self.replicas}"
        parts_ = []
        for name, label, value, limit in (("ttft", "TTFT", self.ttft_p95_ms, self.slos.ttft_ms),
                                          ("tpot", "TPOT", self.tpot_p95_ms, self.slos.tpot_ms),
                                          ("latency", "latency", self.latency_p95_ms, self.slos.latency_ms)):
            if limit is None:
                continue
            text = f"{label} p95 {_ms(value)} <= {_ms(limit)}"
            notes = [n for n, on in (("default", name in self.defaulted), ("binding", name in self.binding)) if on]
            if notes:
                text += f" ({', '.join(notes)})"
            parts_.append(text)
        tail = ", ".join(parts_) if parts_ else "no latency limit"
        last = "" if self.binding else ", its most efficient point"
        return f"{head}: {tail}, {sig(self.j_per_prompt)} J/prompt{last}"


@dataclass(frozen=True)
class Refusal:
    """No operating point of the model takes the job: `reason` is "memory" or "slo"."""

    reason: str
    detail: str


def _ms(value: float) -> str:
    return f"{sig(value / 1000)} s" if value >= 1000 else f"{sig(value)} ms"


def tp_degrees(k: int) -> tuple[int, ...]:
    """Tensor-parallel degrees a job on k GPUs may use: powers of two up to 8 that divide k."""
    return tuple(t for t in (1, 2, 4, 8) if t <= k and k % t == 0)


@lru_cache(maxsize=_FRONTIERS_CACHED)
def _all_points(workload: str, model: str) -> tuple[Prediction, ...]:
    """Every point of `workload` on `model` that fits in memory, TP 1-8, cheapest
    (J/prompt) first: predicted once per (workload, model), shared by every GPU count."""
    points = frontier(workload_model(workload), model, max_tp=8)
    return tuple(sorted(points, key=lambda p: (p.j_per_prompt, p.point.tp, p.point.max_batch)))


@lru_cache(maxsize=_FRONTIERS_CACHED)
def _frontier(workload: str, model: str, k: int) -> tuple[Prediction, ...]:
    """Every point of `workload` on `model` that fits in memory with a TP degree dividing k,
    cheapest (J/prompt) first."""
    tps = tp_degrees(k)
    return tuple(p for p in _all_points(workload, model) if p.point.tp in tps)


def _meets(p: Prediction, slos: Slos, speed: float) -> tuple[str, ...]:
    """The SLOs `p` misses at throughput ratio `speed` (latencies / speed)."""
    missed = []
    if slos.ttft_ms is not None and p.ttft_p95_ms / speed > slos.ttft_ms:
        missed.append("ttft")
    if slos.tpot_ms is not None and p.tpot_p95_ms / speed > slos.tpot_ms:
        missed.append("tpot")
    if slos.latency_ms is not None and p.latency_p95_ms / speed > slos.latency_ms:
        missed.append("latency")
    return tuple(missed)


@lru_cache(maxsize=_CHOICES_CACHED)
def choose(workload: str, model: str, k: int, slos: Slos, speed: float = 1.0,
           power_ratio: float = 1.0, defaulted: tuple[str, ...] = ()) -> Choice | Refusal | None:
    """The most energy-efficient point of `workload` on k GPUs of `model` under `slos`.

    `speed` and `power_ratio` are learned corrections (measured / seed throughput and power).
    None: the model cannot tell (unknown workload, unknown GPU model, or a training preset,
    which has throughput but no latency model: see `nominal`)."""
    w = workload_model(workload)
    if w is None or model not in parts() or w.kind != "inference":
        return None
    k = max(1, k)
    if not parts()[model].supports(w.precision):
        return Refusal("memory", f"{model} has no {w.precision} support")
    points = _frontier(workload, model, k)
    if not points:
        tps = tp_degrees(k)
        return Refusal("memory", f"{w.total_params_b:g}B {w.precision.upper()} does not fit on {model} "
                                 f"at TP {'/'.join(map(str, tps))} (k={k})")
    for p in points:
        if not _meets(p, slos, speed):
            return _choice(w, model, k, p, slos, speed, power_ratio, _meets(points[0], slos, speed), defaulted)
    best = points[0]
    fastest = min(points, key=lambda p: p.tpot_p95_ms)
    return Refusal("slo", f"no point of {model} meets the SLOs (fastest: TTFT p95 {_ms(fastest.ttft_p95_ms / speed)}, "
                          f"TPOT p95 {_ms(fastest.tpot_p95_ms / speed)}, latency p95 "
                          f"{_ms(min(p.latency_p95_ms for p in points) / speed)}; cheapest misses "
                          f"{', '.join(_meets(best, slos, speed))})")


def _choice(w: Workload, model: str, k: int, p: Prediction, slos: Slos, speed: float, power_ratio: float,
            binding: tuple[str, ...], defaulted: tuple[str, ...]) -> Choice:
    replicas = k // p.point.tp
    return Choice(w.name, model, k, p.point, replicas, p, p.prompts_per_s * replicas * speed,
                  p.power_w * replicas * power_ratio, p.ttft_p95_ms / speed, p.tpot_p95_ms / speed,
                  p.latency_p95_ms / speed, slos, binding, defaulted)


@lru_cache(maxsize=_FRONTIERS_CACHED)
def nominal(workload: str, model: str, k: int) -> Choice | None:
    """A training preset (no latency model): its nominal throughput and power per GPU,
    data-parallel over the k GPUs. Not excluded by memory: the performance model's training
    memory (16 bytes/param, no sharding) is as nominal as its speed, and real fine-tunes
    shard or offload; the job's `--gpu-mem` is the memory check. SLOs are not checked."""
    w = workload_model(workload)
    if w is None or model not in parts() or w.kind == "inference" or not parts()[model].supports(w.precision):
        return None
    k = max(1, k)
    p = predict(w, model, OperatingPoint(1, w.precision, 1))
    return Choice(w.name, model, k, p.point, k, p, p.prompts_per_s * k, p.power_w * k, p.ttft_p95_ms,
                  p.tpot_p95_ms, p.latency_p95_ms, Slos(), (), (), inference=False)


@lru_cache(maxsize=_CHOICES_CACHED)
def job_choice(workload: str | None, model: str, k: int, ttft_ms: float | None, tpot_ms: float | None,
               latency_ms: float | None, speed: float = 1.0,
               power_ratio: float = 1.0) -> Choice | Refusal | None:
    """`choose` for a job's own fields: its SLOs over its preset's defaults. An SLO on a
    training preset (no latency model) is a Refusal ("slo"), never an unconstrained plan;
    None: the model does not know the workload or GPU (the caller's profile or generic rule
    applies, which refuses an SLO it cannot check: `policies.model.energy.fits`)."""
    try:
        w = workload_model(workload)
    except WorkloadSpecError as e:
        return Refusal("slo", str(e)) if (ttft_ms or tpot_ms or latency_ms) else None
    if w is None:
        return None
    if w.kind != "inference":
        if Slos(ttft_ms, tpot_ms, latency_ms).given():
            return Refusal("slo", f"workload {workload!r} has no latency model")
        return nominal(workload, model, k)
    slos = slos_for(workload, ttft_ms, tpot_ms, latency_ms)
    defaulted = tuple(n for n, mine, eff in (("ttft", ttft_ms, slos.ttft_ms), ("tpot", tpot_ms, slos.tpot_ms),
                                              ("latency", latency_ms, slos.latency_ms))
                      if mine is None and eff is not None)
    return choose(workload, model, max(1, k), slos, round(speed, 9), round(power_ratio, 9), defaulted)


def seed_choice(workload: str, model: str) -> Choice | None:
    """The point a workload's seed profile on `model` describes: its preset's default SLOs, on
    the fewest GPUs (1, 2, 4, 8) that hold it."""
    for k in (1, 2, 4, 8):
        c = job_choice(workload, model, k, None, None, None)
        if isinstance(c, Choice):
            return c
    return None
