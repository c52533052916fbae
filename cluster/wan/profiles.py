"""Link profiles and fleets for the WAN testbed, read from configs/wan/links.toml (a file a user edits)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

LINKS_FILE = Path(__file__).resolve().parents[2] / "configs" / "wan" / "links.toml"


@dataclass(frozen=True)
class LinkProfile:
    """One node's access link to the core."""

    name: str
    down_mbps: float
    up_mbps: float
    rtt_ms: float = 0.0  # round trip to the core (between two workers: the sum of theirs)
    jitter_ms: float = 0.0  # each one-way delay varies uniformly within +- this
    loss_percent: float = 0.0  # packets dropped in each direction

    def __post_init__(self) -> None:
        if self.down_mbps <= 0 or self.up_mbps <= 0:
            raise ValueError(f"link profile {self.name}: rates must be positive")
        if self.rtt_ms < 0 or self.jitter_ms < 0 or not 0 <= self.loss_percent < 100:
            raise ValueError(f"link profile {self.name}: rtt and jitter >= 0, loss in [0, 100)")
        if self.jitter_ms > self.rtt_ms / 2:
            raise ValueError(f"link profile {self.name}: jitter {self.jitter_ms} ms exceeds the one-way delay")


@dataclass(frozen=True)
class Fleet:
    name: str
    core: LinkProfile
    workers: tuple[LinkProfile, ...]
    nat: frozenset[int] = field(default_factory=frozenset)  # worker indices that accept no inbound connection

    def worker_profile(self, index: int) -> LinkProfile:
        return self.workers[index % len(self.workers)]


def read_profiles(path: Path = LINKS_FILE) -> tuple[dict[str, LinkProfile], dict[str, dict]]:
    document = tomllib.loads(path.read_text())
    profiles = {name: LinkProfile(name=name, **values) for name, values in document.get("profiles", {}).items()}
    return profiles, document.get("fleets", {})


def load_fleet(name: str, path: Path = LINKS_FILE, nat: frozenset[int] = frozenset()) -> Fleet:
    """The fleet `name` from `path`, or every worker on profile `name` behind the `core` profile. `nat`
    adds workers (by index) that accept no inbound connection."""
    profiles, fleets = read_profiles(path)

    def profile(profile_name: str) -> LinkProfile:
        if profile_name not in profiles:
            raise ValueError(f"{path}: no link profile {profile_name!r} (profiles: {', '.join(sorted(profiles))})")
        return profiles[profile_name]

    if name in fleets:
        spec = fleets[name]
        workers = tuple(profile(p) for p in spec["workers"])
        if not workers:
            raise ValueError(f"{path}: fleet {name!r} has no workers")
        return Fleet(name, profile(spec.get("core", "core")), workers, frozenset(spec.get("nat", ())) | nat)
    if name in profiles:
        return Fleet(name, profile("core"), (profiles[name],), nat)
    raise ValueError(
        f"{path}: no fleet or link profile {name!r} (fleets: {', '.join(sorted(fleets))};"
        f" profiles: {', '.join(sorted(profiles))})"
    )
