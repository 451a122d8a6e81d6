"""The scale table: each plugin alone over 1,000 / 10,000 / 50,000 devices and the most that fit the kubelet.

Device IDs are the shortest there are ("0", "1", ...), so the last count is the largest whose
ListAndWatch answer fits the kubelet's 4 MiB receive limit. The files are made once, in a staging
directory that grows from count to count and is renamed into each subject's root, so a count costs
its own figures, not file creation twice. Per count: start -> full list, one more change (at the
largest count, one device removed and added back), CPU per change (all processes), PSS.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench import measure
from bench.subjects import Baseline, Colad, PluginUnderTest, Split, Subject
from colad.core.constants import KUBELET_MAX_RECV_MESSAGE_BYTES
from colad.core.devices import Device
from colad.deviceplugin.device_list import list_entry
from tests.helpers import WaitTimeout

HEALTHY = "Healthy"
# The count the budgets at scale read (bench/budgets.py); the split (bench/baseline_split.py) starts there
# too, plain and with the card's imports: the floor under colad's start and PSS at scale (bench/floor.py).
BUDGET_COUNT = 10_000


def entry_bytes(device_id: str, health: str = HEALTHY) -> int:
    """Encoded size of one `Device{ID, health}` inside ListAndWatchResponse (field 1, length-delimited)."""
    return len(list_entry(Device(device_id, health)))


def max_fit(limit: int = KUBELET_MAX_RECV_MESSAGE_BYTES) -> int:
    """The most devices named "0", "1", ... whose ListAndWatch answer is at most `limit` bytes."""
    total = count = 0
    while total + entry_bytes(str(count)) <= limit:
        total += entry_bytes(str(count))
        count += 1
    return count


def counts(spec: str) -> list[int]:
    """ "1000,10000,50000,max" -> ascending device counts ("max": max_fit())."""
    found = {max_fit() if word.strip() == "max" else int(word) for word in spec.split(",") if word.strip()}
    return sorted(found)


def changes_at(count: int, more: int) -> int:
    """Single changes to time at `count` devices: `more` up to 10,000, fewer above (each costs O(set) today).

    Always even, so creates and unlinks alternate back to the staged set.
    """
    scaled = more if count <= 10_000 else max(4, more * 20_000 // count)
    return scaled + scaled % 2


def phase(base: Path, args: argparse.Namespace, results: dict[str, Any], progress: Any) -> None:
    """Fill results[subject]["scale"][str(count)] for every count of `args.scale`, colad then the baseline.

    At BUDGET_COUNT the split and the split with the card's imports start too, into
    results["floor"]["scale"][str(count)][name]: their start and memory, no changes.
    """
    stage = base / "stage"
    stage.mkdir()
    made = 0
    for count in counts(args.scale):
        progress(f"scale: {count:,} device files")
        for i in range(made, count):
            (stage / str(i)).write_bytes(b"")
        made = count
        names = {str(i) for i in range(count)}
        plugins: list[PluginUnderTest] = [Colad(args.python, args.colad_env), Baseline(args.python)]
        if count == BUDGET_COUNT:
            plugins += [Split(args.python), Split(args.python, card=True)]
        for plugin in plugins:
            subject = Subject(plugin, base / f"{plugin.name}-{count}")
            subject.device_dir.rmdir()
            stage.rename(subject.device_dir)
            progress(f"{subject.name}: start over {count:,} devices")
            is_floor = isinstance(plugin, Split)
            more = 0 if is_floor else changes_at(count, args.more)
            try:
                figures = measure.scale(subject, names, more, args.gap, full=count >= max_fit())
            except WaitTimeout as exc:  # one count that fails is a row of dashes, not the end of the bench
                progress(f"{subject.name} at {count:,} devices: {exc}")
                figures = {"devices": count, "listed": 0, "message_bytes": 0, "error": str(exc)[:300]}
            finally:
                subject.close()
                subject.device_dir.rename(stage)
            figures["message_kib"] = round(figures["message_bytes"] / 1024, 1)
            if is_floor:
                results["floor"].setdefault("scale", {}).setdefault(str(count), {})[subject.name] = figures
            else:
                results[subject.name].setdefault("scale", {})[str(count)] = figures
    results["scale_counts"] = counts(args.scale)


def _cell(value: Any, width: int) -> str:
    return f"{'-' if value is None else f'{value:g}':>{width}}"


ROWS = (
    ("start -> full list, ms", "full_list_ms"),
    ("one more change p50, ms", "one_more_change.p50_ms"),
    ("one more change max, ms", "one_more_change.max_ms"),
    ("CPU per change, ms", "cpu_ms_per_change.total"),
    ("total PSS, MiB", "memory.total.pss_mib"),
    ("ListAndWatch message, KiB", "message_kib"),
)


def figure(results: dict[str, Any], subject: str, count: int, path: str) -> float | None:
    return measure.at(results[subject], f"scale.{count}.{path}")


def table(results: dict[str, Any]) -> str:
    """The scale table as `make bench` prints it."""
    title = 'scale (IDs "0", "1", ...)'
    lines = [f"{title:<36}{'colad':>11}{'baseline':>11}{'ratio':>8}"]
    for count in results.get("scale_counts", []):
        note = "" if count != max_fit() else " (most that fit 4 MiB)"
        lines.append(f"{count:,} devices{note}")
        for label, path in ROWS:
            mine, theirs = figure(results, "colad", count, path), figure(results, "baseline", count, path)
            ratio = round(mine / theirs, 2) if mine is not None and theirs else None
            lines.append(f"  {label:<34}{_cell(mine, 11)}{_cell(theirs, 11)}{_cell(ratio, 8)}")
        for subject in ("colad", "baseline"):
            got = results[subject].get("scale", {}).get(str(count), {})
            if got and got.get("full_list_ms") is None:
                lines.append(f"  {subject}: the full list never came; at most {got['listed']:,} of {count:,} listed")
    return "\n".join(lines)
