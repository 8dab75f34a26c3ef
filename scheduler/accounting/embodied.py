"""Embodied carbon on receipts and in sums: a run's share of what making its GPUs (and their
host server, where a figure exists) emitted, from the catalog (`policies.model.embodied`),
and the SCI-style total per prompt made of it and the operational grams.

The embodied grams are always their own figure beside the operational ones (`gco2`, priced
with the zone's average or marginal signal): never added into that column. Where both are
known and the job counts prompts, the receipt also gives the SCI-style total per prompt,
labelled as such, with both parts beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.model.embodied import Embodied, unknown_embodied

FORMULA = ("GPU-hours / (lifetime_years x 8766 h) x (GPU kgCO2e + host kgCO2e per GPU, where known) x 1000")
SCI_WHAT = ("SCI-style total per prompt: operational gCO2 (energy x grid intensity of the named signal x PUE) "
            "plus embodied gCO2e (GPU-hours' share of the GPUs' and, where known, the host's manufacturing), "
            "divided by the prompts; both parts are given beside it")


def embodied_of(gpu_model: str | None) -> Embodied:
    """The catalog's embodied figures for `gpu_model`; unknown (saying why) for a model the
    catalog does not know."""
    from policies.model.catalog import catalog

    spec = catalog().get(gpu_model or "")
    if spec is None:
        return unknown_embodied(f"GPU model {gpu_model!r} is not in the catalog" if gpu_model
                                else "the job's GPU model is not recorded")
    return spec.embodied


def embodied_receipt(gpu_model: str | None, gpus: int | None, runtime_s: float | None) -> dict:
    """The receipt's embodied part for `gpus` GPUs of `gpu_model` held `runtime_s` seconds:
    the grams (None: unknown, never 0), the GPU and host parts, and every figure they come
    from with its basis and source."""
    e = embodied_of(gpu_model)
    gpu_hours = None if gpus is None or runtime_s is None else gpus * runtime_s / 3600.0

    def grams(part: str) -> float | None:
        rate = e.g_per_gpu_hour(part)
        return None if rate is None or gpu_hours is None else rate * gpu_hours

    return {
        "gco2": grams("all"), "gpu_gco2": grams("gpu"), "host_gco2": grams("host"),
        "host_included": e.known and e.host_kgco2e is not None,
        "gpu_hours": gpu_hours, "lifetime_years": e.lifetime_years,
        "gpu_kgco2e_per_gpu": e.gpu_kgco2e, "host_kgco2e_per_gpu": e.host_kgco2e,
        "gpu_basis": e.gpu_basis, "host_basis": e.host_basis,
        "gpu_source": e.gpu_source, "host_source": e.host_source or None,
        "method": e.method or None, "lifetime_source": e.lifetime_source,
        "formula": FORMULA,
    }


def sci_per_prompt(operational_gco2: float | None, embodied_gco2: float | None, prompts: int | None,
                   *, signal: str | None, prompts_source: str | None) -> dict | None:
    """The SCI-style total per prompt and its two parts; None unless the operational grams,
    the embodied grams and a positive prompt count are all known."""
    if operational_gco2 is None or embodied_gco2 is None or not prompts:
        return None
    op, emb = operational_gco2 / prompts, embodied_gco2 / prompts
    return {"gco2_per_prompt": op + emb, "operational_gco2_per_prompt": op, "embodied_gco2_per_prompt": emb,
            "signal": signal, "prompts": prompts, "prompts_source": prompts_source, "what": SCI_WHAT}


def g_per_gpu_second() -> dict[str, Mapping[str, float]]:
    """Per catalog model with a known GPU figure, the embodied grams one GPU-second carries:
    {"gpu": ..., "host": ... (only where the host figure is known)}. What the sums in SQL
    price GPU-seconds with; a model missing here is unknown."""
    from policies.model.catalog import catalog

    out: dict[str, Mapping[str, float]] = {}
    for name, spec in sorted(catalog().items()):
        e = spec.embodied
        if not e.known:
            continue
        rates = {"gpu": e.g_per_gpu_hour("gpu") / 3600.0}
        if e.host_kgco2e is not None:
            rates["host"] = e.g_per_gpu_hour("host") / 3600.0
        out[name] = rates
    return out


def embodied_figures(r: Mapping[str, Any]) -> dict:
    """The embodied figures of a group from its sums (`scheduler.jobs.sums.finished_sums`):
    kgCO2e in all and by part, and the GPU-hours with no figure (their grams are unknown,
    not zero; None where no GPU-hour of the group has a figure)."""
    known_s = float(r.get("embodied_gpu_s") or 0.0)
    gpu_g, host_g = float(r.get("embodied_gpu_g") or 0.0), float(r.get("embodied_host_g") or 0.0)
    return {
        "embodied_kgco2e": (gpu_g + host_g) / 1000.0 if known_s else None,
        "embodied_gpu_kgco2e": gpu_g / 1000.0 if known_s else None,
        "embodied_host_kgco2e": host_g / 1000.0 if r.get("embodied_host_gpu_s") else None,
        "embodied_gpu_hours": known_s / 3600.0,
        "embodied_host_gpu_hours": float(r.get("embodied_host_gpu_s") or 0.0) / 3600.0,
        "embodied_unknown_gpu_hours": max(0.0, float(r.get("gpu_s") or 0.0) - known_s) / 3600.0,
    }



def catalog_figures(models: list[str | None]) -> list[dict]:
    """The embodied figures of `models` (those a report or export covers), each with its
    basis and source: what the embodied sums were priced with."""
    out = []
    for name in sorted({m for m in models if m} | ({None} if None in models else set()), key=str):
        e = embodied_of(name)
        out.append({"gpu_model": name, "gpu_kgco2e": e.gpu_kgco2e, "gpu_basis": e.gpu_basis,
                    "gpu_source": e.gpu_source, "host_kgco2e": e.host_kgco2e, "host_basis": e.host_basis,
                    "host_source": e.host_source or None, "method": e.method or None,
                    "lifetime_years": e.lifetime_years, "lifetime_source": e.lifetime_source})
    return out


#: What the disclosure export and the report say about embodied carbon, once.
METHODOLOGY = {
    "formula": FORMULA,
    "boundary": "cradle-to-gate manufacturing of the GPUs (vendor product carbon footprints or published LCA "
                "figures, or estimates scaled from them) and, where a figure exists, the host server's share per "
                "GPU; the run's GPU-hours' share of it over the part's lifetime",
    "separate": "reported beside the operational emissions, never added into them; the SCI-style total per "
                "prompt (sci_gco2_per_prompt) is the one figure that adds both, labelled as such, with both parts",
    "unknown": "a GPU model without a figure contributes its GPU-hours to embodied_unknown_gpu_hours, never 0 g",
    "placement": "not used for placement: embodied carbon is sunk once the GPU is bought, and putting it into "
                 "placement decisions can raise total emissions (the Sunk Carbon Fallacy, arXiv 2410.15087)",
}
