"""Fair share: who is owed GPUs, from an account tree of shares and decayed usage.

The arithmetic of Slurm's classic fair share (the page "Classic Fairshare Algorithm",
https://slurm.schedmd.com/classic_fair_share.html, the algorithm Slurm keeps behind
`PriorityFlags=NO_FAIR_TREE`), on plain data so that the daemon's planner tick and the
simulator call the same code; nothing here reads the store or a configuration file.

- **Account tree.** Accounts with a parent (None: the top level) and raw shares; users are
  associated with accounts, 1 share each unless given more. A `default` account at the top
  level always exists (1 share unless the operator sets it), so a one-user install needs no
  set-up. An account's children are its sub-accounts *and* its users, all siblings of one
  another, as in Slurm.
- **Normalised shares.** S of an association is the product, down its path from the top, of
  (its raw shares / the sum of its siblings' raw shares, itself included).
- **Usage.** Each charge is an amount in the operator's currency (GPU-hours by default, kWh,
  or kgCO2e as measured) times its QOS usage factor, decayed with a half-life (default 7
  days): a charge made `age` seconds ago counts `amount * 2^(-age / half_life)`. A charge
  spread over `duration_s` (a job that ran for that long) counts as if made continuously
  over it, so a running job's usage so far is one charge ending now. `DecayingUsage` keeps
  the same sums incrementally, for a simulator that charges on every event.
- **Normalised usage** U = an association's decayed usage / the cluster's total decayed usage
  (accounts sum their subtree).
- **Effective usage**, top-down: at the top level U_E = U; below it
  U_E = U + (U_E(parent) - U) * S_raw(self) / S_raw(all siblings), so the usage of the
  parent account (of the other users drawing on it) weighs on every member.
- **Fair-share factor** F = 2^(-U_E / S), between 0 and 1: 0.5 is exactly at its share,
  above under-served, below over-served. An association with no share (S = 0) has F = 0:
  it is owed nothing, and runs only where nobody owed GPUs wants them.

Times are seconds since the epoch (`datetime.timestamp()`); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_ACCOUNT = "default"
DEFAULT_HALF_LIFE_S = 7 * 86400.0
CURRENCIES = ("gpu_hours", "kwh", "kgco2e")  # what usage is counted in; gpu_hours the default

Association = tuple[str, "str | None"]  # (account, user); user None: the account itself


# -- the account tree -------------------------------------------------------------------

@dataclass(frozen=True)
class AccountSpec:
    """One account as the operator set it: its parent (None: top level) and raw shares."""

    name: str
    parent: str | None = None
    shares: float = 1.0


@dataclass(frozen=True)
class UserSpec:
    """One user's association with an account and the user's raw shares inside it."""

    account: str
    user: str
    shares: float = 1.0


def _check_shares(what: str, shares: float) -> float:
    if not isinstance(shares, (int, float)) or isinstance(shares, bool) or not math.isfinite(shares) or shares < 0:
        raise ValueError(f"{what}: shares must be a finite number >= 0, got {shares!r}")
    return float(shares)


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} must be a non-empty name, got {name!r}")
    return name


class AccountTree:
    """The validated tree of accounts and user associations, with normalised shares.

    Raises ValueError (one line) on negative or non-finite shares, an unknown parent or
    account, a cycle of parents, a duplicate account or association, or a `default` account
    placed below the top level.
    """

    def __init__(self, accounts: Iterable[AccountSpec] = (), users: Iterable[UserSpec] = ()) -> None:
        specs: dict[str, AccountSpec] = {}
        for a in accounts:
            name = _check_name("an account", a.name)
            if name in specs:
                raise ValueError(f"account {name!r} is defined twice")
            if a.parent is not None:
                _check_name(f"the parent of account {name!r}", a.parent)
            _check_shares(f"account {name!r}", a.shares)
            specs[name] = a
        specs.setdefault(DEFAULT_ACCOUNT, AccountSpec(DEFAULT_ACCOUNT))
        if specs[DEFAULT_ACCOUNT].parent is not None:
            raise ValueError(f"the {DEFAULT_ACCOUNT!r} account sits at the top level; it cannot have a parent")
        for a in specs.values():
            if a.parent is not None and a.parent not in specs:
                raise ValueError(f"account {a.name!r} has an unknown parent {a.parent!r}")
        for a in specs.values():
            self._check_no_cycle(a.name, specs)
        self._accounts = specs
        self._users: dict[Association, float] = {}
        for u in users:
            self._add_user(u)
        kids: dict[str | None, list[Association]] = {None: []}
        for (account, user) in sorted(self._users):
            kids.setdefault(account, []).append((account, user))
        for name in sorted(specs):
            kids.setdefault(specs[name].parent, []).append((name, None))
        self._kids = kids
        self._order: list[Association] | None = None
        self._kid_total = {a: sum(self.raw_shares(k) for k in ks) for a, ks in kids.items()}

    @staticmethod
    def _check_no_cycle(name: str, specs: Mapping[str, AccountSpec]) -> None:
        seen = [name]
        parent = specs[name].parent
        while parent is not None:
            if parent in seen:
                raise ValueError(f"accounts form a cycle of parents: {' > '.join(seen + [parent])}")
            seen.append(parent)
            parent = specs[parent].parent

    def _add_user(self, u: UserSpec) -> None:
        user = _check_name("a user", u.user)
        if u.account not in self._accounts:
            raise ValueError(f"unknown account {u.account!r} (for user {user!r})")
        key = (u.account, user)
        if key in self._users:
            raise ValueError(f"user {user!r} is associated with account {u.account!r} twice")
        self._users[key] = _check_shares(f"user {user!r} in account {u.account!r}", u.shares)

    def with_users(self, associations: Iterable[Association]) -> AccountTree:
        """This tree plus a 1-share association for each (account, user) not yet in it: the
        users who charge the built-in `default` account, or whose jobs or usage name an
        account they were never added to by hand. Unknown accounts raise ValueError."""
        extra = set()
        for account, user in associations:
            if account not in self._accounts:
                raise ValueError(f"unknown account {account!r}" + ("" if user is None else f" (for user {user!r})"))
            if user is not None and (account, user) not in self._users:
                extra.add((account, user))
        if not extra:
            return self
        users = [UserSpec(a, u, s) for (a, u), s in self._users.items()]
        return AccountTree(self._accounts.values(), users + [UserSpec(a, u) for a, u in sorted(extra)])

    @property
    def accounts(self) -> list[str]:
        return sorted(self._accounts)

    @property
    def associations(self) -> list[Association]:
        """Every association in tree order: each account, then its users and sub-accounts."""
        if self._order is None:
            self._order = self._tree_order()
        return list(self._order)

    def _tree_order(self) -> list[Association]:
        out: list[Association] = []

        def walk(node: Association) -> None:
            out.append(node)
            for child in self.children(node[0]):
                if child[1] is None:
                    walk(child)
                else:
                    out.append(child)

        for top in self.children(None):
            walk(top)
        return out

    def parent_of(self, node: Association) -> Association | None:
        account, user = node
        if user is not None:
            return (account, None)
        parent = self._accounts[account].parent
        return None if parent is None else (parent, None)

    def children(self, account: str | None) -> list[Association]:
        """The children of an account (None: the top level): its users first, then its
        sub-accounts, each sorted by name."""
        return list(self._kids.get(account, ()))

    def raw_shares(self, node: Association) -> float:
        account, user = node
        return self._users[node] if user is not None else float(self._accounts[account].shares)

    def knows(self, node: Association) -> bool:
        account, user = node
        return node in self._users if user is not None else account in self._accounts

    def norm_shares(self) -> dict[Association, float]:
        """S of every association: the product down its path of raw shares / siblings'
        shares (0 where all siblings hold 0 shares)."""
        out: dict[Association, float] = {}

        def walk(account: str | None, above: float) -> None:
            kids = self.children(account)
            total = self._kid_total.get(account, 0.0)
            for k in kids:
                out[k] = above * self.raw_shares(k) / total if total > 0 else 0.0
                if k[1] is None:
                    walk(k[0], out[k])

        walk(None, 1.0)
        return out

    def children_shares(self, account: str | None) -> float:
        """The sum of the raw shares of an account's children (None: the top level)."""
        return self._kid_total.get(account, 0.0)

    def sibling_fraction(self, node: Association) -> float:
        """raw shares / the sum over its siblings (itself included); 0 where that sum is 0."""
        parent = self.parent_of(node)
        total = self._kid_total.get(None if parent is None else parent[0], 0.0)
        return self.raw_shares(node) / total if total > 0 else 0.0

    def share_targets(self, active_accounts: Iterable[str]) -> dict[str, float]:
        """Each active account's target fraction of what was delivered when only the accounts
        in `active_accounts` had work. Top-down, a parent's fraction is divided by raw shares
        over its children that had work: sub-accounts whose subtree had work, and the
        account's own jobs if it is active itself (weighted by its users' shares, 1 if it has
        none associated). An idle sibling's share goes to the busy ones. For a flat tree this
        equals the flat `share_targets(norm_shares, active)`."""
        active = set(active_accounts)
        for a in active:
            if a not in self._accounts:
                raise ValueError(f"unknown account {a!r}")
        busy: set[str] = set()
        for a in active:
            node: Association | None = (a, None)
            while node is not None:
                busy.add(node[0])
                node = self.parent_of(node)
        out: dict[str, float] = {}

        def walk(account: str | None, above: float) -> None:
            subs = [k for k in self.children(account) if k[1] is None and k[0] in busy]
            own = 0.0
            if account in active:
                own = sum(self.raw_shares(k) for k in self.children(account) if k[1] is not None) or 1.0
            total = own + sum(self.raw_shares(k) for k in subs)
            if account in active:
                out[account] = above * own / total
            for k in subs:
                walk(k[0], above * self.raw_shares(k) / total if total > 0 else 0.0)

        walk(None, 1.0)
        return out


# -- usage: charges, decay ---------------------------------------------------------------

@dataclass(frozen=True)
class Charge:
    """Usage charged to one association: the measured figures of one job (or of a running
    job so far), the QOS usage factor it is charged at, and when (`at_s`: the end of the
    `duration_s` it ran; 0: all at once). Figures not measured are None."""

    account: str
    user: str
    at_s: float
    gpu_hours: float
    kwh: float | None = None
    kgco2e: float | None = None
    usage_factor: float = 1.0
    duration_s: float = 0.0

    def amount(self, currency: str = "gpu_hours") -> float:
        """The amount charged in `currency` (times the usage factor), undecayed."""
        if currency not in CURRENCIES:
            raise ValueError(f"unknown usage currency {currency!r}; choose one of {', '.join(CURRENCIES)}")
        value = getattr(self, currency)
        if value is None:
            raise ValueError(f"a charge to {self.account}/{self.user} at {self.at_s} has no {currency} figure")
        if not math.isfinite(value) or value < 0 or not math.isfinite(self.usage_factor) or self.usage_factor < 0:
            raise ValueError(f"a charge to {self.account}/{self.user} is negative or not finite: "
                             f"{currency}={value}, usage factor {self.usage_factor}")
        return value * self.usage_factor

    def amount_at_end(self, currency: str, half_life_s: float) -> float:
        """What the charge counts at its own `at_s`: the amount itself for a point charge;
        for one spread evenly over `duration_s`, the mean decay over that span
        (h / (d ln 2)) * (1 - 2^(-d/h)) times the amount, so a job that ran a week ago
        counts less than one that ran this hour."""
        amount = self.amount(currency)
        d = self.duration_s
        if d < 0 or not math.isfinite(d):
            raise ValueError(f"a charge to {self.account}/{self.user} has a bad duration {d!r}")
        if d == 0 or math.isinf(half_life_s):
            return amount
        x = d * math.log(2) / half_life_s
        return amount * (-math.expm1(-x)) / x


def decay(age_s: float, half_life_s: float) -> float:
    """2^(-age / half_life): what one unit charged `age_s` ago counts now."""
    if not half_life_s > 0:
        raise ValueError(f"the usage half-life must be > 0 seconds, got {half_life_s!r}")
    if age_s < 0:
        raise ValueError(f"a charge lies {-age_s:g} s in the future")
    return 1.0 if math.isinf(half_life_s) else 2.0 ** (-age_s / half_life_s)


def decayed_usage(charges: Iterable[Charge], now_s: float, half_life_s: float = DEFAULT_HALF_LIFE_S,
                  currency: str = "gpu_hours") -> dict[Association, float]:
    """Decayed usage per (account, user) at `now_s`: sum of amount * 2^(-(now - at)/half_life)."""
    out: dict[Association, float] = {}
    for c in charges:
        key = (c.account, c.user)
        out[key] = out.get(key, 0.0) + c.amount_at_end(currency, half_life_s) * decay(now_s - c.at_s, half_life_s)
    return out


@dataclass
class DecayingUsage:
    """The incremental form of `decayed_usage`: O(1) per charge, for a simulator that charges
    on every event. Each association keeps its total as of its latest charge and decays it
    when read; charges may arrive out of order."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    currency: str = "gpu_hours"
    _totals: dict[Association, tuple[float, float]] = field(default_factory=dict)  # (value, as of s)

    def __post_init__(self) -> None:
        decay(0.0, self.half_life_s)  # checks the half-life
        if self.currency not in CURRENCIES:
            raise ValueError(f"unknown usage currency {self.currency!r}; choose one of {', '.join(CURRENCIES)}")

    def add(self, charge: Charge) -> None:
        amount = charge.amount_at_end(self.currency, self.half_life_s)
        key = (charge.account, charge.user)
        value, as_of = self._totals.get(key, (0.0, charge.at_s))
        if charge.at_s >= as_of:
            self._totals[key] = (value * decay(charge.at_s - as_of, self.half_life_s) + amount, charge.at_s)
        else:
            self._totals[key] = (value + amount * decay(as_of - charge.at_s, self.half_life_s), as_of)

    def totals(self, now_s: float, running: Iterable[Charge] = ()) -> dict[Association, float]:
        """Decayed usage per (account, user) at `now_s` (not before the latest charge), plus
        the usage so far of the `running` jobs (each one charge ending now, not kept: the
        finished job is charged in full when it ends)."""
        out = {k: v * decay(now_s - t, self.half_life_s) for k, (v, t) in self._totals.items()}
        for key, value in decayed_usage(running, now_s, self.half_life_s, self.currency).items():
            out[key] = out.get(key, 0.0) + value
        return out


# -- the fair-share factor ---------------------------------------------------------------

@dataclass(frozen=True)
class ShareRow:
    """One association's line of `carbonsched share` (like sshare)."""

    account: str
    user: str | None
    raw_shares: float
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    fair_share: float

    def to_dict(self, currency: str = "gpu_hours") -> dict[str, object]:
        """JSON-ready: the raw usage's key names its currency (raw_usage_gpu_hours,
        raw_usage_kwh or raw_usage_kgco2e); the other usages are fractions of the cluster's."""
        return {"account": self.account, "user": self.user, "raw_shares": self.raw_shares,
                "norm_shares": self.norm_shares, f"raw_usage_{currency}": self.raw_usage,
                "norm_usage": self.norm_usage, "effective_usage": self.effective_usage,
                "fair_share_factor": self.fair_share}


def fair_share_factor(effective_usage: float, norm_shares: float) -> float:
    """F = 2^(-U_E / S); 0 for an association with no share."""
    if norm_shares <= 0:
        return 0.0
    return 2.0 ** (-effective_usage / norm_shares)


class FairShare:
    """Every association's shares, usage and factor at one moment: computed once per tick,
    then looked up per job (`factor`) without recomputing any account."""

    def __init__(self, tree: AccountTree, usage: Mapping[Association, float]) -> None:
        """`usage`: decayed usage per (account, user), from `decayed_usage` or
        `DecayingUsage.totals`. Users not yet associated get 1 share (`with_users`)."""
        for (account, user), value in usage.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"usage of {account}/{user} must be finite and >= 0, got {value!r}")
        self.tree = tree = tree.with_users(usage)
        raw: dict[Association, float] = {k: 0.0 for k in tree.associations}
        for key, value in usage.items():
            node: Association | None = key
            while node is not None:  # an account's usage is its subtree's
                raw[node] += value
                node = tree.parent_of(node)
        total = sum(v for k, v in raw.items() if tree.parent_of(k) is None)
        shares = tree.norm_shares()
        rows: dict[Association, ShareRow] = {}
        for node in tree.associations:  # tree order: a parent before its children
            norm = raw[node] / total if total > 0 else 0.0
            parent = tree.parent_of(node)
            if parent is None:
                effective = norm
            else:
                effective = norm + (rows[parent].effective_usage - norm) * tree.sibling_fraction(node)
            rows[node] = ShareRow(node[0], node[1], tree.raw_shares(node), shares[node], raw[node], norm,
                                  effective, fair_share_factor(effective, shares[node]))
        self._rows = rows

    def factor(self, account: str, user: str | None = None) -> float:
        """The fair-share factor of a job charged to (account, user). A user with no
        association there (and no usage) is taken at the account's effective usage with
        1 share beside its siblings, what `with_users` would make of it."""
        row = self._rows.get((account, user))
        if row is not None:
            return row.fair_share
        acc = self._rows.get((account, None))
        if acc is None:
            raise ValueError(f"unknown account {account!r}")
        siblings = self.tree.children_shares(account) + 1.0
        return fair_share_factor(acc.effective_usage / siblings, acc.norm_shares / siblings)

    def rows(self) -> list[ShareRow]:
        """Every association in tree order, like sshare -a."""
        return [self._rows[k] for k in self.tree.associations]

    def to_json(self, currency: str = "gpu_hours") -> list[dict[str, object]]:
        return [r.to_dict(currency) for r in self.rows()]


# -- reporting: targets and fairness -----------------------------------------------------

def share_targets(norm_shares: Mapping[str, float], active: Iterable[str]) -> dict[str, float]:
    """Each active account's target fraction of the GPU-hours delivered in a period: its
    normalised share renormalised over the accounts that had work in that period (an idle
    account's share is not owed to anyone, so the busy ones divide it by their shares).
    Accounts without work get no entry; if the busy accounts hold no share, all get 0.
    Pass the shares of the accounts jobs are charged to; for a nested tree where a parent
    and its sub-account both charge, use `AccountTree.share_targets`."""
    busy = sorted(set(active))
    for a in busy:
        if a not in norm_shares:
            raise ValueError(f"unknown account {a!r}")
        _check_shares(f"account {a!r}", norm_shares[a])
    total = sum(norm_shares[a] for a in busy)
    return {a: (norm_shares[a] / total if total > 0 else 0.0) for a in busy}


def water_fill(capacity: float, shares: dict[str, float], demand: dict[str, float]) -> dict[str, float]:
    """Each account's fair part of `capacity`: split by shares, but no account gets more than
    it asked for (`demand`); what one leaves is split again among the rest by their shares
    (max-min fairness). An account with no share gets only what the others leave."""
    target = {a: 0.0 for a in demand}
    left = capacity
    open_ = {a for a, d in demand.items() if d > 0}
    while left > 1e-9 and open_:
        weights = {a: shares.get(a, 0.0) for a in open_}
        total = sum(weights.values())
        if total <= 0:
            weights, total = {a: 1.0 for a in open_}, float(len(open_))
        filled = {a for a in open_ if target[a] + left * weights[a] / total >= demand[a] - 1e-9}
        if not filled:
            for a in open_:
                target[a] += left * weights[a] / total
            break
        for a in filled:
            left -= demand[a] - target[a]
            target[a] = demand[a]
        open_ -= filled
    return target


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one
    takes everything; None for no values or all zero (the same as the simulator's report)."""
    xs = [float(v) for v in values]
    if any(not math.isfinite(x) or x < 0 for x in xs):
        raise ValueError(f"Jain's index takes finite values >= 0, got {xs}")
    squares = sum(x * x for x in xs)
    return None if squares == 0 else sum(xs) ** 2 / (len(xs) * squares)


def fairness_over_accounts(delivered: Mapping[str, float], targets: Mapping[str, float]) -> float | None:
    """Jain's index over accounts of delivered / target (both fractions of the GPU-hours
    delivered, or both GPU-hours): 1 when every account got the same multiple of its
    target. Accounts with no target (no share, or no work) are left out."""
    ratios = [delivered.get(a, 0.0) / t for a, t in targets.items() if t > 0]
    return jain_index(ratios)
