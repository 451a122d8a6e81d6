"""What a reload does to the plugin's resources, decided before anything is touched.

`plan(current, wanted)` compares the running resources with the reloaded config's:
added ones register, removed ones withdraw their devices and go, changed ones keep
their socket and registration with new settings, the rest are not touched. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from colad.config.config import Resource


@dataclass(frozen=True)
class ReloadPlan:
    """The resources by name, in the order the plugin serves them afterwards (the config's)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    order: tuple[str, ...]


def plan(current: Mapping[str, Resource], wanted: Sequence[Resource]) -> ReloadPlan:
    names = {r.name for r in wanted}
    return ReloadPlan(
        added=tuple(r.name for r in wanted if r.name not in current),
        removed=tuple(name for name in current if name not in names),
        changed=tuple(r.name for r in wanted if r.name in current and current[r.name] != r),
        unchanged=tuple(r.name for r in wanted if current.get(r.name) == r),
        order=tuple(r.name for r in wanted),
    )
