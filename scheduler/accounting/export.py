"""The energy and emissions disclosure: a period's energy and emissions per system (node x
GPU model x zone) with the methodology behind them, for sustainability and regulatory
reporting."""

from __future__ import annotations

from datetime import datetime
from importlib.metadata import PackageNotFoundError, version

from policies.pricing.counterfactual import RULE_SHORT
from scheduler.accounting.aggregate import JobSums, kg_by_signal, shares, signal_figures, work_figures
from scheduler.accounting.embodied import METHODOLOGY as EMBODIED_METHODOLOGY
from scheduler.accounting.embodied import catalog_figures, embodied_of
from scheduler.accounting.figures import iso, tidy
from scheduler.accounting.ledger import Ledger
from scheduler.carbon_table import actual_sources
from scheduler.jobs.sums import system_columns
from telemetry.grid.readings import SIGNAL_AVERAGE

#: Licences and descriptions of the intensity sources, for the disclosure export.
SOURCE_INFO: dict[str, dict[str, str]] = {
    "electricitymaps": {"provider": "Electricity Maps API", "licence": "Electricity Maps API terms of use"},
    "electricitymaps-csv": {"provider": "Electricity Maps historical data export",
                            "licence": "ODbL 1.0 (Open Database License)"},
    "watttime": {"provider": "WattTime API (marginal operating emissions rate)",
                 "licence": "WattTime API terms of use"},
    "watttime-csv": {"provider": "WattTime historical MOER export", "licence": "WattTime data licence"},
    "ukgrid": {"provider": "National Grid ESO Carbon Intensity API", "licence": "CC BY 4.0"},
    "csv": {"provider": "operator-supplied CSV trace", "licence": "as supplied by the operator"},
    "static": {"provider": "static yearly mean (Electricity Maps 2022 hourly exports, or operator config)",
               "licence": "ODbL 1.0"},
}


class Disclosure:
    """The disclosure export over one store; never-priced jobs of the period are priced by
    `ledger` first."""

    def __init__(self, ledger: Ledger, sums: JobSums) -> None:
        self.ledger = ledger
        self.sums = sums

    def export(self, since: datetime, until: datetime, *, owner_uid: int | None = None) -> dict:
        """The period's energy and emissions per system (node x GPU model x zone), with the
        methodology: how energy was measured, which signal and PUE priced it, the data
        sources and their licences. For sustainability and regulatory reporting."""
        if until <= since:
            raise ValueError("the export period is empty: --since must be before --until")
        where = self.sums.period_filter(since, until, owner_uid)
        self.ledger.price_missing(where, 200)
        rows = self.sums.aggregate(where, *system_columns())
        systems: dict[tuple, list[dict]] = {}
        for r in rows:
            systems.setdefault((r["node"], r["gpu_model"], r["zone"]), []).append(r)
        out_systems = [_system(node, model, zone, parts) for (node, model, zone), parts
                       in sorted(systems.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]
        total = signal_figures(rows)
        zones = sorted({s["zone"] for s in out_systems if s["zone"]})
        try:
            ver = version("carbonsched")
        except PackageNotFoundError:
            ver = "unknown"
        return tidy({
            "document": "carbonsched energy and emissions disclosure",
            "schema_version": 1,
            "period": {"start": iso(since), "end": iso(until)},
            "generated_at": iso(self.ledger.clock()),
            "generator": {"name": "carbonsched", "version": ver},
            "scope": "all users" if owner_uid is None else f"jobs of uid {owner_uid}",
            "systems": out_systems,
            "totals": _totals(total, rows),
            "methodology": _methodology(self.ledger.emission_factor(), self._sources(zones, since, until),
                                        catalog_figures([s["gpu_model"] for s in out_systems])),
        })

    def _sources(self, zones: list[str], since: datetime, until: datetime) -> list[dict]:
        out = []
        if zones:
            with self.ledger.store.read() as conn:
                rows = actual_sources(conn, zones, since, until)
            by_source: dict[str, dict] = {}
            for source, zone, signal, n in rows:
                e = by_source.setdefault(source, {"source": source, "zones": [], "signals": [], "rows": 0,
                                                  **SOURCE_INFO.get(source, {"provider": source, "licence": "unknown"})})
                e["zones"] = sorted(set(e["zones"]) | {zone})
                e["signals"] = sorted(set(e["signals"]) | {signal})
                e["rows"] += n
            out = sorted(by_source.values(), key=lambda e: e["source"])
        out.append({"source": "static", "zones": zones, "signals": [SIGNAL_AVERAGE], "rows": None,
                    **SOURCE_INFO["static"]})
        out.append({"source": "gpu-telemetry", "provider": "carbonsched agents (NVML / AMD SMI / emulated)",
                    "licence": "own measurement", "zones": zones, "signals": [], "rows": None})
        return out


def _system(node: str | None, model: str | None, zone: str | None, parts: list[dict]) -> dict:
    """The export's figures of one system (node x GPU model x zone) from its aggregate rows."""
    fig = signal_figures(parts)
    return {
        "node": node, "gpu_model": model, "zone": zone,
        "jobs": fig["jobs"], "gpu_hours": fig["gpu_hours"],
        "it_energy_kwh": fig["energy_kwh"], "facility_energy_kwh": fig["facility_energy_kwh"],
        "emissions_kgco2e": fig["kgco2"],
        "emissions_kgco2e_by_signal": kg_by_signal(fig),
        "intensity_g_per_kwh": fig["intensity_g_per_kwh"],
        "pue": sorted({p["pue"] for p in parts if p["pue"] is not None}),
        "signal": sorted(fig["by_signal"]),
        "measurement_shares": shares(parts, "method", "energy_j"),
        "intensity_basis_shares": shares(parts, "basis", "energy_j"),
        "jobs_without_measurement": fig["jobs"] - fig["jobs_measured"],
        "jobs_without_emissions": fig["jobs"] - fig["jobs_with_gco2"],
        "jobs_modelled": fig["jobs_modelled"], "modelled_energy_kwh": fig["modelled_energy_kwh"],
        "energy": "modelled" if fig["jobs_modelled"] == fig["jobs_measured"] and fig["jobs_modelled"]
        else "partly modelled" if fig["jobs_modelled"] else "measured",
        **work_figures(fig),
        **_embodied(fig),
        "embodied_basis": embodied_of(model).gpu_basis,
    }


def _embodied(fig: dict) -> dict:
    """The export's embodied figures (beside the emissions, never added into them) and the
    SCI-style total per prompt with its two parts."""
    return {k: fig[k] for k in ("embodied_kgco2e", "embodied_gpu_kgco2e", "embodied_host_kgco2e",
                                "embodied_gpu_hours", "embodied_host_gpu_hours", "embodied_unknown_gpu_hours",
                                "sci_gco2_per_prompt", "sci_operational_gco2_per_prompt",
                                "sci_embodied_gco2_per_prompt")}


def _totals(total: dict, rows: list[dict]) -> dict:
    """The export's figures of the whole period (`total`: the figures of all its `rows`)."""
    return {"jobs": total["jobs"], "gpu_hours": total["gpu_hours"],
            "it_energy_kwh": total["energy_kwh"], "facility_energy_kwh": total["facility_energy_kwh"],
            "emissions_kgco2e": total["kgco2"],  # None where the period mixes signals
            "emissions_kgco2e_by_signal": kg_by_signal(total),
            "signal": total["signal"],
            "jobs_without_measurement": total["jobs"] - total["jobs_measured"],
            "jobs_without_emissions": total["jobs"] - total["jobs_with_gco2"],
            "jobs_modelled": total["jobs_modelled"], "modelled_energy_kwh": total["modelled_energy_kwh"],
            "measurement_shares": shares(rows, "method", "energy_j"),
            "intensity_basis_shares": shares(rows, "basis", "energy_j"),
            **work_figures(total), **_embodied(total)}


def _methodology(emission_factor: str, data_sources: list[dict], embodied_figures: list[dict]) -> dict:
    """How the export's figures were made: boundary, measurement, pricing, gaps, sources."""
    return {
        "boundary": "GPU energy of batch jobs scheduled by carbonsched (scope 2, operational, "
                    "location-based); facility overhead by PUE; embodied emissions are not in emissions_kgco2e: "
                    "they are reported beside it (embodied_kgco2e, see embodied)",
        "work": "prompts and output tokens as each job reported them in its metrics file, else as "
                "declared at submit (prompts_source / tokens_source: reported, declared or partly "
                "reported); per-prompt and per-token figures count only jobs with that count",
        "energy_measurement": {
            "counter": "GPU hardware energy counter (NVML total energy / AMD SMI accumulator), "
                       "used when it moves forward and agrees with integrated power within 10%",
            "counter-unverified": "GPU energy counter without enough power samples to cross-check",
            "integral": "trapezoid integral of sampled GPU power (default 1 Hz); also used after a "
                        "counter fault",
            "+static": "plus the job's share of the node's configured static power",
            "modelled": "NOT MEASURED: emulated GPUs (no GPU hardware), energy from the emulator's "
                        "power model; systems with modelled_energy_kwh > 0 include such figures",
        },
        "emissions": "sum over the run of energy x grid carbon intensity of the zone at that time "
                     "x PUE; each part of a run weighted by its own measured energy",
        "signal": "average (consumption-based) or marginal, per zone, as named per system; never "
                  "added together: where a system or the totals hold both, emissions_kgco2e and "
                  "intensity_g_per_kwh are null and emissions_kgco2e_by_signal gives each",
        "intensity": "grams per kWh of facility energy (IT energy x PUE): the energy-weighted grid "
                     "intensity, as on receipts",
        "emission_factor": emission_factor,
        "saving_counterfactual": f"measured gCO2 x the plan's estimate of {RULE_SHORT} / its "
                                 "estimate of the chosen plan",
        "pue": "per node's site from the configuration: [nodes.NODE] pue, else the [sites.SITE] "
               "listing the node, else [zones.ZONE] pue, else [site] pue, else 1.0",
        "gaps": "periods without recorded intensity are priced at the zone's static yearly mean "
                "(basis mixed/static) or left unpriced (jobs_without_emissions); never zero",
        "data_sources": data_sources,
        "embodied": {**EMBODIED_METHODOLOGY, "figures": embodied_figures},
    }
