"""What `carbonsched profiles` shows, as plain JSON-ready data: per GPU model the performance
model's best operating point for a workload, the one the planner picks
(`policies.model.operating_point.job_choice`: under the workload's default SLOs unless other
limits are asked for), beside the seed and learned profiles of this cluster's store
(`scheduler.profiles.learned_view`).

Kept apart from the CLI's printing so that the figures it shows are the model's own (a test
compares them with the planner's choice) and the JSON keys are defined in one place.
Keys are stable: add new ones freely, never rename.

Training (`kind = "train"`, the `train` and `finetune` presets) has no sourced figure: its
throughput and power are nominal (a nominal MFU, `perf_model.NOMINAL_TRAIN_MFU`), every
entry says so (`nominal: true`, source "nominal"), and it has no TTFT or TPOT (null).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, replace

from policies.model import operating_point, perf_model
from policies.model.perf_model import Prediction, Workload

FLEET_GPUS = ("MI300X", "MI325X", "MI355X", "A100", "H100", "H200", "B200")
"""The GPU models shown by default: the fleet carbonsched is built for (see DESIGN.md)."""

NOMINAL = "nominal"
SOURCE_KINDS = {
    "measured": "this operating point is in the public measurements (ML.ENERGY)",
    "corrected": "the roofline fit x this GPU model's measured correction (ML.ENERGY rows, smooth in batch)",
    "fitted": "the roofline fit, on a GPU model the fit was measured on",
    "roofline": "the roofline fit, on a GPU model never measured",
    "roofline+correction": "the roofline fit on a GPU model never measured, x the measured correction of a GPU "
                           "model it dominates",
    "fitted+correction": "the roofline fit on a GPU model the fit was measured on, x the measured correction of "
                         "a GPU model it dominates",
    "power-model": "power from the model fitted on the measured GPUs; +-: its error on a GPU it had not seen",
    NOMINAL: f"no sourced figure: training at a nominal MFU of {perf_model.NOMINAL_TRAIN_MFU:g}",
}


@dataclass(frozen=True)
class Slo:
    """Latency limits an operating point must meet (p95, ms; None: no limit), as
    `perf_model.best_point` takes them."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    latency_p95_ms: float | None = None

    def any(self) -> bool:
        return any(v is not None for v in asdict(self).values())

    def text(self) -> str:
        names = {"ttft_p95_ms": "TTFT p95", "tpot_p95_ms": "TPOT p95", "latency_p95_ms": "latency p95"}
        return ", ".join(f"{names[k]} <= {v:g} ms" for k, v in asdict(self).items() if v is not None)


PLANNER_GPUS = 8
"""The GPU count the best point is asked for (`operating_point.job_choice`): a job on 8 GPUs
may run any TP degree the model predicts (1, 2, 4, 8); figures are per TP group."""

def planner_slo(w: Workload, slo: Slo) -> tuple[Slo, tuple[str, ...]]:
    """The latency limits the planner holds a job of `w` to when it asks for `slo`: each limit
    given, else the workload's default SLO (`operating_point.slos_for`), figure by figure;
    and which of them are defaults ("ttft", "tpot", "latency"). Training has none."""
    if is_nominal(w):
        return slo, ()
    s = operating_point.slos_for(w.name, slo.ttft_p95_ms, slo.tpot_p95_ms, slo.latency_p95_ms)
    applied = Slo(s.ttft_ms, s.tpot_ms, s.latency_ms)
    defaulted = tuple(name for name, asked, got in (("ttft", slo.ttft_p95_ms, s.ttft_ms),
                                                    ("tpot", slo.tpot_p95_ms, s.tpot_ms),
                                                    ("latency", slo.latency_p95_ms, s.latency_ms))
                      if asked is None and got is not None)
    return applied, defaulted


def slo_info(w: Workload | None, slo: Slo) -> dict:
    """The limits applied to `w` (`planner_slo`) for the JSON and the text: `slo_applied`
    (Slo's fields), `slo_applied_text` (None: no limit), `slo_defaulted` (names)."""
    if w is None:
        return {"slo_applied": asdict(slo), "slo_applied_text": slo.text() or None, "slo_defaulted": []}
    applied, defaulted = planner_slo(w, slo)
    return {"slo_applied": asdict(applied), "slo_applied_text": applied.text() or None,
            "slo_defaulted": list(defaulted)}


class NoLatencyModel(ValueError):
    """A latency limit asked of a workload whose latency the model does not predict (training)."""


class UnknownWorkload(ValueError):
    """A workload name that is neither a preset of the model nor learned here."""

    def __init__(self, name: str, known: list[str], detail: str | None = None) -> None:
        self.name = name
        self.known = sorted(known)
        self.suggestions = difflib.get_close_matches(name, self.known, n=3, cutoff=0.5)
        *first, last = self.suggestions or [""]
        hint = f"; did you mean {', '.join(first) + ' or ' if first else ''}{last}?" if self.suggestions else ""
        if detail:
            hint = f": {detail}"
        super().__init__(f"unknown workload {name!r}{hint} (known: {', '.join(self.known)}, or llm:SIZE)")


def alias_of(w: Workload) -> str | None:
    """The preset that `w` is another name for (`llm-inference` is `llm-chat-8b`), or None.
    Of two equal presets the one listed first in `perf_model.presets()` is the original."""
    for name, other in perf_model.presets().items():
        if name == w.name:
            return None
        if replace(other, name=w.name, note=w.note) == w:
            return name
    return None


def is_nominal(w: Workload) -> bool:
    """Whether the model's figures for `w` are nominal rather than sourced (training)."""
    return w.kind == "train"


def workload_info(w: Workload) -> dict:
    """What the workload is: size, precision, request lengths, where its description comes from."""
    return {"name": w.name, "kind": w.kind, "nominal": is_nominal(w), "alias_of": alias_of(w),
            "total_params_b": w.total_params_b, "active_params_b": w.active_params_b,
            "precision": w.precision, "mean_input_tokens": w.mean_input_tokens,
            "mean_output_tokens": w.mean_output_tokens, "note": w.note}


def stack_text(gpu: str, precision: str = "bf16") -> str:
    """The serving-stack factor a GPU model's predictions at `precision` run at, e.g.
    "ROCm/vLLM stack factor 0.65 +- 0.08, from 15 MLPerf FP8 results (...)"."""
    return perf_model.stack_of(gpu, precision=precision).label() if gpu in perf_model.parts() else ""


def source_kind(p: Prediction) -> str:
    """One word for where a prediction's throughput comes from: measured, fitted, roofline, nominal."""
    return p.sources.get("throughput", NOMINAL)


def model_figures(w: Workload, gpu: str, slo: Slo = Slo()) -> dict:
    """The best operating point of `w` on `gpu` that the planner would pick for a job asking
    for `slo` (`operating_point.job_choice` on `PLANNER_GPUS` GPUs: the lowest J/prompt that
    fits in memory and meets `slo`, each limit not given being the workload's default SLO)
    and its figures; throughput and power are for the whole tensor-parallel group
    (`point.tp` GPUs). `slo_binding` names the limits that ruled out a cheaper point.
    `fits` is False, and the figures None, when no operating point up to TP 8 fits in
    memory, the part lacks the workload's precision, or no point that fits meets the
    limits; `why` says which (None when it fits). Training has no latency model: its
    nominal point (`perf_model.best_point`), and a latency limit on it raises NoLatencyModel."""
    if slo.any() and is_nominal(w):
        raise NoLatencyModel(f"{w.name} has no latency model (nominal training): a latency limit cannot apply")
    applied, _ = planner_slo(w, slo)
    binding: tuple[str, ...] = ()
    if is_nominal(w):
        best = perf_model.best_point(w, gpu)
    else:
        choice = operating_point.job_choice(w.name, gpu, PLANNER_GPUS, slo.ttft_p95_ms, slo.tpot_p95_ms,
                                            slo.latency_p95_ms)
        best = choice.prediction if isinstance(choice, operating_point.Choice) else None
        binding = choice.binding if isinstance(choice, operating_point.Choice) else ()
    keys = ("prompts_per_s", "output_tokens_per_s", "power_w", "j_per_prompt", "j_per_token", "ttft_p50_ms",
            "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms", "latency_p95_ms", "memory_needed_gib",
            "memory_available_gib", "power_uncertainty_rel")
    if best is None:
        out = {"gpu": gpu, "fits": False, "point": None, **dict.fromkeys(keys), "source": None, "sources": {},
               "nominal": is_nominal(w), "slo_binding": []}
        if not perf_model.parts()[gpu].supports(w.precision):
            return {**out, "why": f"{gpu} has no {w.precision} support"}
        if applied.any() and perf_model.best_point(w, gpu) is not None:
            return {**out, "why": f"no operating point meets {applied.text()}"}
        smallest = perf_model.predict(w, gpu, perf_model.OperatingPoint(1, w.precision, 8))
        return {**out, "memory_needed_gib": smallest.memory_needed_gib,
                "memory_available_gib": smallest.memory_available_gib,
                "why": f"needs {smallest.memory_needed_gib:.0f} GiB per GPU even at TP 8, batch 1"}
    out = {"gpu": gpu, "fits": True, "point": asdict(best.point), **{k: getattr(best, k) for k in keys},
           "source": source_kind(best), "sources": dict(best.sources), "nominal": is_nominal(w), "why": None,
           "stack": best.stack.label() if best.stack is not None else None,
           "stack_factor": best.stack.factor if best.stack is not None else None,
           "speed_correction": best.speed_correction, "slo_binding": list(binding)}
    if is_nominal(w):  # a training step has no first token and no per-token latency
        out.update(ttft_p50_ms=None, ttft_p95_ms=None, tpot_p50_ms=None, tpot_p95_ms=None, latency_p95_ms=None)
    return out


def _learned_workloads(learned: list[dict] | None) -> set[str]:
    return {r["workload"] for r in learned or ()}


def resolve(name: str, learned: list[dict] | None) -> Workload | None:
    """The model's preset called `name`; None for a workload known only from learned
    profiles; UnknownWorkload (with suggestions) for anything else."""
    presets = perf_model.presets()
    if name in presets:
        return presets[name]
    if name.startswith("llm:"):  # a model by size, as `submit --workload` takes it
        from policies.model.operating_point import WorkloadSpecError, parse_spec

        try:
            return parse_spec(name)
        except WorkloadSpecError as e:
            raise UnknownWorkload(name, [*presets, *_learned_workloads(learned)], detail=str(e)) from None
    if name in _learned_workloads(learned):
        return None
    raise UnknownWorkload(name, [*presets, *_learned_workloads(learned)])


def _gpus_shown(gpus: tuple[str, ...], learned: list[dict]) -> list[str]:
    """The GPU models asked for, then any other model this cluster ran the workload on (not
    those whose seed is only corrected by runs elsewhere: that is every seeded model)."""
    return [*gpus, *sorted({r["model"] for r in learned if r["runs"] > 0} - set(gpus))]


def workload_view(name: str, learned: list[dict] | None, *, gpus: tuple[str, ...] = FLEET_GPUS,
                  learned_note: str | None = None, slo: Slo = Slo()) -> dict:
    """Everything `carbonsched profiles --workload NAME` shows. `learned` is the store's
    `learned_view` (None: unavailable, with `learned_note` saying why).

    Keys: `workload` (workload_info, or only `name` for a workload the model does not know),
    `gpus`: one entry per GPU model with the model's figures (model_figures; absent for a
    GPU model the catalog does not know) and `seed`, `learned`, `runs`, `runs_kept`,
    `rel_uncertainty` from the store (None / 0 without learned figures), `slo` (the latency
    limits asked for, Slo's fields), `slo_applied`, `slo_applied_text`, `slo_defaulted` (the
    limits the best points meet: those asked for, else the workload's defaults; `slo_info`),
    `learned_available`, `learned_note`, `source_kinds` (what
    each source word means)."""
    w = resolve(name, learned)
    mine = [r for r in learned or () if r["workload"] == name]
    by_model = {r["model"]: r for r in mine}
    known = set(perf_model.parts())
    entries = []
    for gpu in _gpus_shown(gpus, mine):
        entry = model_figures(w, gpu, slo) if w is not None and gpu in known else {"gpu": gpu}
        r = by_model.get(gpu)
        entry.update(seed=r["seed"] if r else None, learned=r["learned"] if r else None,
                     runs=r["runs"] if r else 0, runs_kept=r["runs_kept"] if r else 0,
                     rel_uncertainty=r["rel_uncertainty"] if r else None)
        entries.append(entry)
    return {"workload": workload_info(w) if w is not None else {"name": name, "kind": None, "nominal": False},
            "gpus": entries, "slo": asdict(slo), "slo_text": slo.text() or None, **slo_info(w, slo),
            "learned_available": learned is not None,
            "learned_note": learned_note, "source_kinds": SOURCE_KINDS,
            "stacks": _stacks(gpus, w.precision if w is not None else "bf16")}


def _stacks(gpus, precision: str = "bf16") -> dict[str, list[str]]:
    """Stack factor label -> the GPU models shown that run at it (at `precision`)."""
    out: dict[str, list[str]] = {}
    for g in gpus:
        if g in perf_model.parts():
            out.setdefault(stack_text(g, precision), []).append(g)
    return out


def summary_view(learned: list[dict] | None, *, gpus: tuple[str, ...] = FLEET_GPUS,
                 learned_note: str | None = None, slo: Slo = Slo()) -> dict:
    """Everything `carbonsched profiles` shows without --workload: per preset (then per
    workload known only from learned profiles) the model's best point on each GPU model
    (under `slo`; training, which has no latency model, is left out when one is given), and
    the runs learned here per GPU model. Keys: `workloads`: [{`workload`
    (workload_info), `slo_applied`, `slo_applied_text`, `slo_defaulted` (`slo_info`), `gpus`:
    [model_figures + `runs`], `learned_runs`: {GPU model: runs, for models with runs}}],
    `learned_available`, `learned_note`, `source_kinds`."""
    runs: dict[str, dict[str, int]] = {}
    for r in learned or ():
        if r["runs"] > 0:
            runs.setdefault(r["workload"], {})[r["model"]] = r["runs"]
    out = []
    # preset -> (its limits, model_figures per GPU): an alias held to the same limits as its
    # original has the same figures (a third of the presets are aliases).
    figures: dict[str, tuple[dict, list[dict]]] = {}
    for name, w in perf_model.presets().items():
        if slo.any() and is_nominal(w):
            continue
        info, limits = workload_info(w), slo_info(w, slo)
        original = figures.get(info["alias_of"] or "")
        mine = original[1] if original and original[0] == limits else [model_figures(w, g, slo) for g in gpus]
        figures[name] = (limits, mine)
        out.append({"workload": info, **limits,
                    "gpus": [{**e, "runs": runs.get(name, {}).get(e["gpu"], 0)} for e in mine],
                    "learned_runs": runs.get(name, {})})
    for name in sorted(set(runs) - set(perf_model.presets())):
        out.append({"workload": {"name": name, "kind": None, "nominal": False}, "gpus": [],
                    "learned_runs": runs[name]})
    return {"workloads": out, "slo": asdict(slo), "slo_text": slo.text() or None, "learned_available": learned is not None,
            "learned_note": learned_note, "source_kinds": SOURCE_KINDS, "stacks": _stacks(gpus)}


def frontier_curve(w: Workload, gpu: str) -> list[tuple[float, float]]:
    """The energy/latency frontier of `w` on `gpu`: (TPOT p95 ms, J/token) of the operating
    points in `perf_model.frontier` that no other point beats on both, by TPOT. For
    training the x value is the (nominal) step time."""
    points = sorted(((p.tpot_p95_ms, p.j_per_token) for p in perf_model.frontier(w, gpu)))
    curve: list[tuple[float, float]] = []
    for x, y in points:
        if not curve or y < curve[-1][1]:
            curve.append((x, y))
    return curve
