"""The files `colad discovery` writes besides the queue: each resource's CDI spec and the NFD feature file.

`OutputWriter` writes a resource's CDI spec (cdi.py) before the kubelet hears of a device that needs
it, and once per turn what else changed; the feature file (nfd.py) once per turn and on its refresh.
A write that fails is logged once, counted, and tried again at the next change or rescan.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta

from colad.config.config import Config
from colad.core import namemap
from colad.core.device_rules import cdi_device_name_problem
from colad.core.devices import Device
from colad.outputs import cdi, nfd
from colad.queue.client import StatsReporter
from colad.runtime import log

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"

if TYPE_CHECKING:
    from colad.discovery.scan import ResourceWatch

# The role's logger: its lines (and the tests matching them) stay those of discovery.
LOG = log.get(__name__)


def _spec_writer(cfg: Config) -> cdi.SpecWriter | None:
    return cdi.SpecWriter(cfg.cdi_spec_dir) if cfg.cdi != "off" and cfg.cdi_spec_dir else None


def _feature_file(cfg: Config) -> nfd.FeatureFileWriter | None:
    return nfd.FeatureFileWriter(cfg.nfd_features_file) if cfg.nfd_features_file else None


class OutputWriter:
    """The CDI spec and feature file writers of the running config, and what is due to be written."""

    def __init__(self, cfg: Config, stats: StatsReporter, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.stats = stats
        self.clock = clock
        self.spec_writer = _spec_writer(cfg)
        self.features = _feature_file(cfg)
        self.nfd_expires = ""  # the expiry-time the feature file carries until its next refresh
        self.nfd_refresh = 0.0
        self.nfd_dirty = False
        self.failed_writes: dict[str, str] = {}  # file -> the error last logged for it
        self.specs_dirty: set[str] = set()  # resources whose CDI spec is written at the end of this turn

    def configure(self, cfg: Config, resources: Iterable[str]) -> None:
        """A reload's spec directory, CDI mode, feature file or label prefix: a spec or feature file the
        new config no longer writes there is removed, and what changed is written this turn."""
        previous, self.cfg = self.cfg, cfg
        if (cfg.cdi, cfg.cdi_spec_dir) != (previous.cdi, previous.cdi_spec_dir):
            for name in resources:  # out of the old directory (or CDI off): no stale spec left behind
                self.remove_spec(name)
            self.spec_writer = _spec_writer(cfg)
            self.specs_dirty.update(resources)
        if cfg.nfd_features_file != previous.nfd_features_file:
            if self.features is not None:
                self._write("nfd", self.features.path, self.features.remove)
            self.features = _feature_file(cfg)
        nfd_keys = ("nfd_features_file", "nfd_label_prefix", "nfd_expiry")
        if any(getattr(cfg, k) != getattr(previous, k) for k in nfd_keys):
            self.nfd_refresh, self.nfd_dirty = 0.0, self.features is not None

    def changed(self, resources: Iterable[str] = ()) -> None:
        """The device sets changed: the feature file is due this turn, and the specs of `resources`."""
        self.specs_dirty.update(resources)
        self.nfd_dirty = self.features is not None

    def due_now(self) -> bool:
        """Something is to be written at the end of this turn."""
        return bool(self.specs_dirty and self.spec_writer is not None) or self.nfd_dirty

    def next_refresh(self) -> float | None:
        """When the feature file's expiry-time is next renewed (None: no feature file)."""
        return self.nfd_refresh if self.features is not None else None

    def write_turn(self, watches: Mapping[str, ResourceWatch]) -> None:
        """The CDI specs and the feature file of what changed this turn, once per turn: each is
        O(devices) to build (36 ms and 1.2 MB for 10,000), so a burst of changes costs one write.
        The feature file also when its expiry-time is due for a refresh."""
        for name in sorted(self.specs_dirty):
            if name in watches:
                self.write_spec(watches[name])
        self.specs_dirty.clear()
        if self.nfd_dirty or (self.features is not None and self.clock() >= self.nfd_refresh):
            self.write_features(watches)

    def write_spec(self, rw: ResourceWatch) -> None:
        """The resource's CDI spec, one device per advertised ID (replicas included)."""
        if self.spec_writer is None or rw.current is None:
            return
        name, writer = rw.resource.name, self.spec_writer
        data = cdi.encode_spec(name, rw.current, rw.resource.replicas)  # cdi.build's bytes, from kept entries
        self._write(f"cdi {name}", writer.path(name), lambda: writer.write_bytes(name, data))

    def spec_before_publish(
        self, rw: ResourceWatch, came: list[Device], gone: list[Device], removed: Iterable[str]
    ) -> None:
        """A device that came, or whose spec entry changed, is in the spec before the kubelet hears of
        it (an Allocate of it then finds its CDI name); a removal alone waits for the end of the turn,
        a change of health or reason alone (no part of the spec) writes nothing."""
        if self.spec_writer is None:
            return
        before = {d.device_id: d for d in gone}
        self._note_unnamed(rw, [d.device_id for d in came if d.device_id not in before])
        if any(d.device_id not in before or not cdi.same_entry(d, before[d.device_id]) for d in came):
            self.specs_dirty.discard(rw.resource.name)
            self.write_spec(rw)
        elif removed:
            self.specs_dirty.add(rw.resource.name)

    def _note_unnamed(self, rw: ResourceWatch, added: list[str]) -> None:
        """One line and one count for each new ID the spec cannot carry. Its CDI name is the ID itself
        (namemap.cdi_device_name: never rewritten, so two IDs never share one); an ID that is no CDI name
        gets none rather than a rewritten one, which could be another file's ID."""
        if rw.resource.replicas > 1 or namemap.cdi_kind_problem(rw.resource.name) is not None:
            return  # a replica ID "<id>::<n>" ends in a digit; a resource that is no CDI kind has no spec
        for device_id in added:
            if (problem := cdi_device_name_problem(device_id)) is not None:
                LOG.warning(
                    "device left out of the CDI spec: Allocate gives it the classic answer",
                    resource=rw.resource.name,
                    device=device_id,
                    reason=problem,
                )
                self.stats.count("input.no_cdi_name")

    def remove_spec(self, name: str) -> None:
        if self.spec_writer is not None:
            self._write(f"cdi {name}", self.spec_writer.path(name), functools.partial(self.spec_writer.remove, name))

    def write_features(self, watches: Mapping[str, ResourceWatch]) -> None:
        """The NFD feature file; a new expiry-time every third of nfd_expiry."""
        if self.features is None:
            return
        self.nfd_dirty = False
        now = self.clock()
        if now >= self.nfd_refresh:
            expires = datetime.now(UTC) + timedelta(seconds=self.cfg.nfd_expiry)
            self.nfd_expires = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
            self.nfd_refresh = now + self.cfg.nfd_expiry / 3
        # Counts.of(rw.current) without a pass over the set: a file name ID holds no ':', so no
        # physical device folds into another, and rw.unhealthy is kept per change.
        sets = [
            (rw.resource.name, nfd.Counts(len(rw.current or ()), len(rw.current or ()) - rw.unhealthy))
            for rw in watches.values()
        ]
        data = nfd.render_features(sets, self.cfg.nfd_label_prefix, self.nfd_expires)
        features = self.features
        self._write("nfd", features.path, lambda: features.write(data))

    def _write(self, what: str, path: str, write: Callable[[], object]) -> None:
        """One line (and one count) when writing `what` starts failing or fails differently, one when it works again."""
        try:
            write()
        except OSError as exc:
            error = f"{errno.errorcode.get(exc.errno or 0, str(exc.errno))}: {exc.strerror}"
            if self.failed_writes.get(what) != error:
                LOG.error("cannot write file; retried at the next change or rescan", file=what, path=path, error=error)
                self.stats.count("write.cdi_failed" if what.startswith("cdi") else "write.nfd_failed")
            self.failed_writes[what] = error
            return
        if self.failed_writes.pop(what, None) is not None:
            LOG.info("file written again", file=what, path=path)
