"""How a job's energy was measured, in words for receipts and exports."""

from __future__ import annotations

from telemetry.energy import MODELLED


def describe_measurement(method: str | None, note: str | None) -> dict:
    """How a job's energy was measured: the stored method, whether a counter fault forced the
    integral, and one line for people."""
    if not method:
        return {"method": None, "counter_fault": False, "static_share": False, "modelled": False,
                "description": "not measured (no GPU readings for the run)"}
    base, _, extra = method.partition("+")
    fault = base == "integral" and bool(note) and "counter" in note and "no energy counter" not in note
    text = {
        "modelled": MODELLED_DESCRIPTION,
        "counter": "GPU hardware energy counter, cross-checked against integrated power",
        "counter-unverified": "GPU hardware energy counter (too few power samples to cross-check it)",
        "integral": ("integral of sampled GPU power after a counter fault" if fault
                     else "integral of sampled GPU power"),
        "none": "not measured",
    }.get(base, base)
    if fault and note:
        text += f" ({note})"
    if extra == "static":
        text += ", plus the job's share of the node's static power"
    return {"method": method, "counter_fault": fault, "static_share": extra == "static",
            "modelled": is_modelled(method), "description": text}


MODELLED_DESCRIPTION = ("MODELLED, not measured: emulated GPUs, energy from the emulator's power model "
                        "(catalog TDP and idle power, or the --truth the fleet runs by)")


def is_modelled(method: str | None) -> bool:
    """Whether a stored energy method is a model's figure (emulated GPUs), not a measurement."""
    return bool(method) and method.partition("+")[0] == MODELLED
