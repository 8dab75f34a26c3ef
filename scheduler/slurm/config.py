"""The `[slurm]` config table (used with `executor = "slurm"`).

```toml
executor = "slurm"
[slurm]
partitions = ["carbon"]          # nodes carbonsched plans on; held sbatch jobs here are adopted
zone_feature_prefix = "zone_"    # node Features=zone_DE -> carbon zone DE
gpu_models = { h100 = "H100" }   # GRES type -> catalog model (default: the type itself)
conf = "/etc/slurm/slurm.conf"   # SLURM_CONF for the tools (default: Slurm's own)
timeout = "30s"                  # per Slurm command
adopt = true                     # plan users' held sbatch jobs in `partitions`
observe = true                   # receipts for Slurm's other GPU jobs on the nodes too
pass_account = true              # sbatch --account=A for a job charged to account A
qos_names = { urgent = "high" }  # carbonsched QOS -> Slurm QOS for sbatch --qos ("" : none)
```

carbonsched hands each job to `sbatch` with the job's account and QOS, so Slurm's own
accounting, limits and `sacct` see what carbonsched charged. A job in the built-in `default`
account gets no `--account` (Slurm then charges the user's own default account), and a QOS
is passed under its own name unless `qos_names` maps it to another Slurm QOS, or to "" for
none: on a Slurm with accounting (slurmdbd), create the QOS levels with `sacctmgr add qos`
or map them. A Slurm that refuses a job's account, QOS or time limit ends that job FAILED with
Slurm's words as its REASON: retrying could only be refused again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.model.catalog import lookup
from scheduler.store.account_models import DEFAULT_ACCOUNT
from scheduler.timeparse import parse_duration

EXECUTORS = ("local", "slurm")


@dataclass(frozen=True)
class SlurmConfig:
    partitions: tuple[str, ...] = ("carbon",)
    zone_feature_prefix: str = "zone_"
    gpu_models: dict[str, str] = field(default_factory=dict)
    conf: Path | None = None
    timeout_s: float = 30.0
    adopt: bool = True
    # Slurm GPU jobs that did not come through carbonsched, seen running on a node, become
    # carbonsched jobs too (RUNNING, "observed"): they get receipts, and plans avoid their GPUs.
    observe: bool = True
    # The job's account goes to sbatch as --account (not the built-in `default` account).
    pass_account: bool = True
    # carbonsched QOS name -> the Slurm QOS that sbatch gets ("" : no --qos); a QOS not
    # named here is passed under its own name.
    qos_names: dict[str, str] = field(default_factory=dict)

    def sbatch_account(self, account: str | None) -> str | None:
        """The `--account` of a job charged to `account` (None: no option)."""
        if not self.pass_account or not account or account == DEFAULT_ACCOUNT:
            return None
        return account

    def sbatch_qos(self, qos: str | None) -> str | None:
        """The `--qos` of a job in carbonsched QOS `qos` (None: no option)."""
        if not qos:
            return None
        return self.qos_names.get(qos, qos) or None

    @property
    def submit_partition(self) -> str:
        """Where `carbonsched submit` jobs go: the first of `partitions`."""
        return self.partitions[0]

    def model_of(self, gres_type: str) -> str:
        """The catalog model of a GRES type (`gpu_models`, else the type as a model name).
        Raises ValueError for a type the catalog does not know."""
        name = self.gpu_models.get(gres_type, gres_type)
        return lookup(name).name

    def gres_type_of(self, model: str) -> str | None:
        """The GRES type that names a catalog model on this cluster (None: not mapped)."""
        for gres_type, name in self.gpu_models.items():
            if name.lower() == model.lower():
                return gres_type
        return None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SlurmConfig:
        """Read the `[slurm]` table of a whole config file; ValueError names what is wrong."""
        table = config.get("slurm") or {}
        if not isinstance(table, Mapping):
            raise ValueError("[slurm] must be a table")
        known = {"partitions", "zone_feature_prefix", "gpu_models", "conf", "timeout", "adopt", "observe",
                 "pass_account", "qos_names"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        parts = table.get("partitions", ["carbon"])
        if isinstance(parts, str):
            parts = [p.strip() for p in parts.split(",") if p.strip()]
        if not parts or not all(isinstance(p, str) and p for p in parts):
            raise ValueError("partitions must be a non-empty list of partition names")
        models = dict(table.get("gpu_models") or {})
        for gres_type, name in models.items():
            try:
                lookup(str(name))
            except (KeyError, ValueError):
                raise ValueError(f"gpu_models.{gres_type} = {name!r} is not a catalog GPU model") from None
        timeout = table.get("timeout", 30.0)
        timeout_s = float(timeout) if isinstance(timeout, (int, float)) else parse_duration(str(timeout))
        if not 1 <= timeout_s <= 600:
            raise ValueError("timeout must be between 1s and 10m")
        conf = table.get("conf")
        adopt = table.get("adopt", True)
        observe = table.get("observe", True)
        pass_account = table.get("pass_account", True)
        if not all(isinstance(v, bool) for v in (adopt, observe, pass_account)):
            raise ValueError("adopt, observe and pass_account must be true or false")
        qos_names = table.get("qos_names") or {}
        if not isinstance(qos_names, Mapping) or not all(isinstance(v, str) for v in qos_names.values()):
            raise ValueError('qos_names must be a table of QOS = "Slurm QOS" (or "" for none)')
        return cls(partitions=tuple(parts), zone_feature_prefix=str(table.get("zone_feature_prefix", "zone_")),
                   gpu_models={str(k): str(v) for k, v in models.items()},
                   conf=Path(conf) if conf else None, timeout_s=timeout_s, adopt=adopt, observe=observe,
                   pass_account=pass_account, qos_names={str(k): v for k, v in qos_names.items()})


def check_table(table: Any, whole: Mapping[str, Any]) -> list[str]:
    """`carbonsched config check`'s view of `[slurm]`: the errors, or none."""
    try:
        SlurmConfig.from_config(whole)
    except ValueError as e:
        return [str(e)]
    return []
