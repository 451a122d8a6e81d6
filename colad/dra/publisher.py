"""Keeps this node's ResourceSlices of this driver exact at the API server, in threads of its own.

Reads the device sets the plugin process receives (publish()) and this node's slices of this driver
(list, then watch from the list's resourceVersion); writes the changes colad/core/slices.py plans
(delete, update, create), only those. Level-triggered: a new device set and any change someone else
makes (the kubelet deleting the node's slices, a writer updating one) lead to the same list, plan and
apply. A sync plans against the slices as the last sync left them (its list and the answers to its
writes) while the watch has shown no other writer since, so a new device set costs only its writes; a
change seen on the watch, a write refused (409, 404) or any failure makes the next sync list again.
API-server errors are counted by verb and status, retried after a back-off, never raised.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from colad.core.backoff import Backoff
from colad.core.devices import DeviceSet
from colad.core.slices import ExistingSlice, Pool, SlicePlan, plan, pool, pool_names, read_slice, slice_object
from colad.kube.client import KubeClient, WatchEvent, field_selector
from colad.kube.errors import ApiError, Conflict, Expired, KubeError, NotFound, error_code
from colad.outputs.statefile import SliceStatus
from colad.runtime import log
from colad.runtime.log import EventLogger

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any, Final

LOG = log.get(__name__)
# client-go's reflector backs off from 800 ms to 30 s; a fleet's retries are spread by the jitter.
RETRY: Final = Backoff(first=0.5, cap=30.0, jitter=0.5)
WATCH_SECONDS: Final = 300  # the server ends a watch after this; it is opened again from the last version
SHORT_WATCH: Final = 1.0  # a watch ending sooner with no event is followed by a pause, not a new watch at once
STOP_JOIN: Final = 5.0


class _Replan(Exception):
    """The slices changed under a write (409, 404): read them again and plan again."""


class SlicePublisher:
    """This node's slices of `driver`, one pool per resource, converged in a thread to the last publish().

    start() runs it; publish() hands over new device sets and returns at once; withdraw() deletes the
    slices (mode switch, shutdown); stop() ends it. `count_error(verb, code)` is called for every
    failed call: verb one of list, watch, get, create, update, delete; code the HTTP status or
    "unreachable"; `count_write(verb)` for every write the server accepted (create, update, delete).
    wait_converged() is for tests and shutdown: the API server held the last publish() exactly when it
    returns True. status() says how current the slices are (for /readyz, `colad status` and the metrics);
    `on_change()` is called, from the publisher's threads, whenever it may have changed.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        driver: str,
        node_name: str,
        resource_names: Sequence[str],
        node_uid: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        count_error: Callable[[str, str], None] = lambda verb, code: None,
        count_write: Callable[[str], None] = lambda verb: None,
        logger: EventLogger = LOG,
        backoff: Backoff = RETRY,
        draw: Callable[[], float] = random.random,
        watch_seconds: int = WATCH_SECONDS,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.node_name = node_name
        self.resource_names = tuple(resource_names)
        self._pool_names = pool_names(node_name, self.resource_names)
        self._selector = field_selector(node_name=node_name, driver=driver)
        self._node_uid = node_uid  # None: read from the Node on the first write (its ownerReference)
        self._clock = clock
        self._count_error = count_error
        self._count_write = count_write
        self._log = logger
        self._backoff = backoff
        self._draw = draw
        self._watch_seconds = watch_seconds
        self._on_change = on_change
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        # Guarded by _cond: what to publish (None: nothing yet; withdrawn: no pools), its number, and
        # whether the API server may differ from it (a publish or an outside change since the last sync).
        self._wanted: Mapping[str, DeviceSet] | None = None
        self._withdrawn = False
        self._generation = 0
        self._converged = -1
        self._dirty = False
        self._retry_at = 0.0
        self._watch: Any = None
        # The echoes of our own writes on the watch, which need no new sync: name -> the resourceVersions
        # written whose echo has not come yet (a write can follow the last before its echo comes), and
        # the names deleted.
        self._written: dict[str, set[str]] = {}
        self._deleted: set[str] = set()
        self._threads: list[threading.Thread] = []
        # Guarded by _cond: the slices as the last sync left them, kept while no outside change is seen
        # (None: list them), and the number of outside changes seen.
        self._last_sync: list[ExistingSlice] | None = None
        self._outside = 0
        # Held by the sync thread from a write's call until its answer is noted, and by the watch
        # thread while it tells an echo: _cond is never held across a call.
        self._writing = threading.Lock()
        # Guarded by _cond, for status(): the failing call ("" once one is answered), the last failure,
        # whether a publish was ever held, and the slices and devices of the last sync.
        self._failing = ""
        self._last_error = ""
        self._held = False
        self._synced = (0, 0)

    # --- the caller's side -------------------------------------------------------------------------

    def start(self) -> SlicePublisher:
        for name, target in (("dra-slices", self._sync_loop), ("dra-slices-watch", self._watch_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()
        self._log.info("slice publisher started", driver=self.driver, node=self.node_name)
        return self

    def publish(self, device_sets: Mapping[str, DeviceSet]) -> None:
        """Make the slices list these device sets; never blocks. A resource without a device set is not
        known yet (discovery not heard since a start): its slices stay as the API server holds them."""
        with self._cond:
            self._wanted = dict(device_sets)
            self._withdrawn = False
            self._generation += 1
            self._dirty = True
            self._retry_at = 0.0
            self._cond.notify_all()

    def withdraw(self, timeout: float = STOP_JOIN) -> bool:
        """Delete this node's slices of this driver, waiting up to `timeout`: True once they are gone."""
        with self._cond:
            self._wanted = {}
            self._withdrawn = True
            self._generation += 1
            self._dirty = True
            self._retry_at = 0.0
            self._cond.notify_all()
        done = self.wait_converged(timeout)
        if done:
            self._log.info("slices withdrawn", driver=self.driver, node=self.node_name)
        else:
            self._log.warning("slices not withdrawn in time", driver=self.driver, node=self.node_name, seconds=timeout)
        return done

    def wait_converged(self, timeout: float) -> bool:
        """Wait until the last publish() (or withdraw()) is what the API server holds, with no outside
        change seen since: True, or False after `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._converged == self._generation and not self._dirty, timeout)

    def status(self) -> SliceStatus:
        """How current this node's slices are now (colad/health/rule.py decides what that means)."""
        with self._cond:
            return SliceStatus(
                wanted=self._wanted is not None and set(self._wanted) >= set(self.resource_names),
                published=self._held and not self._withdrawn,
                pending=self._wanted is not None and (self._dirty or self._converged != self._generation),
                failing=self._failing,
                last_error=self._last_error,
                slices=self._synced[0],
                devices=self._synced[1],
            )

    def stop(self, timeout: float = STOP_JOIN) -> bool:
        """End both threads (the open watch is closed); True when they ended within `timeout`."""
        self._stopping.set()
        with self._cond:
            watch, self._watch = self._watch, None
            self._cond.notify_all()
        if watch is not None:
            watch.close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        ended = not any(t.is_alive() for t in self._threads)
        self._log.info("slice publisher stopped", driver=self.driver, node=self.node_name, ended=ended)
        return ended

    # --- converging ----------------------------------------------------------------------------------

    def _poke(self) -> None:
        """The API server may no longer hold what was published: sync again, from a new list."""
        with self._cond:
            self._dirty = True
            self._last_sync = None
            self._outside += 1
            self._cond.notify_all()

    def _next(self) -> tuple[Mapping[str, DeviceSet], int, bool] | None:
        """Wait for something to do: the device sets, their generation and withdrawn; None once stopping."""
        with self._cond:
            while True:
                if self._stopping.is_set():
                    return None
                if self._dirty and self._wanted is not None:
                    wait = self._retry_at - self._clock()
                    if wait <= 0:
                        self._dirty = False
                        return self._wanted, self._generation, self._withdrawn
                    self._cond.wait(wait)
                else:
                    self._cond.wait()

    def _sync_loop(self) -> None:
        failures = 0
        conflicts = 0
        while (job := self._next()) is not None:
            wanted, generation, withdrawn = job
            try:
                self._sync(wanted, withdrawn)
            except _Replan:
                conflicts += 1
                self._retry(self._backoff.delay(conflicts - 1, self._draw()))  # the first at once
                continue
            except KubeError as exc:
                failures += 1
                delay = self._backoff.delay(failures, self._draw())
                self._log.warning("slices not published; retrying", error=exc, seconds=round(delay, 3))
                self._retry(delay)
                continue
            except Exception as exc:  # a bug must not end publishing: log once per try, count, back off
                failures += 1
                self._count_error("sync", type(exc).__name__)
                self._log.exception("slice sync failed", error=exc)
                self._retry(self._backoff.delay(failures, self._draw()))
                continue
            failures = conflicts = 0
            with self._cond:
                if not self._dirty:
                    self._converged = generation
                    # Held only once every resource's devices were known (a pool left as held is not)
                    self._held = self._held or (not withdrawn and set(wanted) >= set(self.resource_names))
                self._cond.notify_all()
            self._on_change()

    def _retry(self, delay: float) -> None:
        with self._cond:
            self._dirty = True
            self._retry_at = self._clock() + delay
            self._cond.notify_all()

    def _call(self, verb: str, call: Callable[[], Any]) -> Any:
        """One API call, its failure counted and raised."""
        try:
            answer = call()
        except KubeError as exc:
            self._count_error(verb, error_code(exc))
            self._failed(verb, exc)
            raise
        self._answered()
        return answer

    def _answered(self) -> None:
        with self._cond:
            was, self._failing = self._failing, ""
        if was:
            self._on_change()

    def _failed(self, verb: str, exc: KubeError) -> None:
        if isinstance(exc, Conflict | NotFound | Expired):  # answers that say "read again", not a failing server
            self._answered()
            return
        with self._cond:
            self._failing = self._last_error = f"{verb}: {exc}"
        self._on_change()

    def _pools(self, wanted: Mapping[str, DeviceSet], withdrawn: bool) -> tuple[list[Pool], list[str]]:
        """The pools to publish, and the names of those whose devices are not known (left as held)."""
        if withdrawn:
            return [], []
        known = [pool(self._pool_names[r], r, wanted[r]) for r in self.resource_names if r in wanted]
        return known, [self._pool_names[r] for r in self.resource_names if r not in wanted]

    def _sync(self, wanted: Mapping[str, DeviceSet], withdrawn: bool) -> None:
        with self._cond:
            existing, outside = self._last_sync, self._outside
            self._last_sync = None  # until this sync ends well: a failed one lists again
        if existing is None:
            items, _ = self._call("list", lambda: self.client.list_slices(self._selector))
            existing = [read_slice(o) for o in items]
            with self._cond:  # a slice someone else deleted has no echo to come
                self._written = {s.name: self._written[s.name] for s in existing if s.name in self._written}
        pools, unknown = self._pools(wanted, withdrawn)
        todo = plan(self.driver, self.node_name, pools, existing, unknown)
        after = self._apply(todo, existing) if todo else existing
        with self._cond:
            self._synced = (len(after), sum(len(s.devices) for s in after))
            if self._outside == outside:
                self._last_sync = after

    def _owner_uid(self) -> str:
        """The Node's UID for the slices' ownerReference; "" (no owner) when the Node cannot be read."""
        if self._node_uid is None:
            try:
                node = self._call("get", lambda: self.client.get_node(self.node_name))
                self._node_uid = str((node.get("metadata") or {}).get("uid") or "")
            except ApiError as exc:  # 403 without RBAC on nodes, 404 for a node not registered yet
                self._log.warning("node not readable; slices published without an owner", error=exc)
                self._node_uid = ""
        return self._node_uid

    def _apply(self, todo: SlicePlan, existing: Sequence[ExistingSlice]) -> list[ExistingSlice]:
        """Carry out a plan made from `existing`: the slices held after it, as the answers show them. A 409
        or 404 (the slices changed since they were read) raises _Replan."""
        after = {s.name: s for s in existing}
        try:
            for gone in todo.delete:
                delete = partial(
                    self.client.delete_slice, gone.name, uid=gone.uid, resource_version=gone.resource_version
                )
                with self._writing:
                    after.pop(gone.name, None)
                    try:
                        self._call("delete", delete)
                    except NotFound:
                        continue  # already gone: what the delete was for
                    self._count_write("delete")
                    with self._cond:
                        self._deleted.add(gone.name)
            owner = self._owner_uid() if todo.update or todo.create else ""
            for held, desired in todo.update:
                obj = slice_object(desired, self.driver, self.node_name, owner, held)
                with self._writing:
                    written = self._note(self._call("update", partial(self.client.update_slice, obj)))
                after[written.name] = written
                self._count_write("update")
            for desired in todo.create:
                obj = slice_object(desired, self.driver, self.node_name, owner)
                with self._writing:
                    written = self._note(self._call("create", partial(self.client.create_slice, obj)))
                after[written.name] = written
                self._count_write("create")
        except (Conflict, NotFound) as exc:
            self._log.info("slices changed under a write; planning again", error=exc)
            raise _Replan from exc
        self._log.info(
            "slices published",
            driver=self.driver,
            node=self.node_name,
            deleted=len(todo.delete),
            updated=len(todo.update),
            created=len(todo.create),
        )
        return list(after.values())

    def _note(self, written: dict[str, Any]) -> ExistingSlice:
        """Remember a write's answer, to tell its echo on the watch; the slice as written."""
        held = read_slice(written)
        with self._cond:
            self._written.setdefault(held.name, set()).add(held.resource_version)
        return held

    # --- watching ------------------------------------------------------------------------------------

    def _echo(self, event: WatchEvent) -> bool:
        """Whether `event` is one of our own writes coming back (nothing to do)."""
        name = str((event.object.get("metadata") or {}).get("name") or "")
        with self._writing, self._cond:  # a write's echo can come before its answer is noted
            if event.type == "DELETED" and name in self._deleted:
                self._deleted.discard(name)
                self._written.pop(name, None)  # the echoes of its writes came before this one
                return True
            written = self._written.get(name, set())
            if event.type in ("ADDED", "MODIFIED") and event.resource_version in written:
                written.discard(event.resource_version)
                return True
            return False

    def _watch_loop(self) -> None:
        version = ""
        failures = 0
        while not self._stopping.is_set():
            try:
                if not version:
                    _, version = self._call("list", lambda: self.client.list_slices(self._selector))
                    with self._cond:  # the watch starts after this list: writes before it have no echo
                        self._deleted.clear()
                        self._written.clear()
                    self._poke()
                opened = self._clock()
                version, events = self._follow(version, resumed=failures > 0)
                if failures:
                    self._log.info("API server answering again", failures=failures)
                failures = 0
                if not events and self._clock() - opened < SHORT_WATCH:
                    # Ended at once with nothing in it: a server not ready to serve watches (client-go's
                    # reflector treats "very short watch" alike); open the next one after a pause.
                    self._stopping.wait(self._backoff.delay(1, self._draw()))
            except Expired:
                version = ""  # too old to resume from: list again
            except KubeError as exc:
                failures += 1
                delay = self._backoff.delay(failures, self._draw())
                self._log.warning("watch of slices failed; retrying", error=exc, seconds=round(delay, 3))
                self._stopping.wait(delay)
            except Exception as exc:  # a bug must not end watching: log once per try, count, back off
                failures += 1
                self._count_error("watch", type(exc).__name__)
                self._log.exception("watch of slices failed", error=exc)
                self._stopping.wait(self._backoff.delay(failures, self._draw()))

    def _follow(self, version: str, *, resumed: bool) -> tuple[str, int]:
        """Watch from `version` until the server ends the watch: the last version seen and the number of
        events. `resumed`: the watch follows a failure, so what failed meanwhile may be tried at once."""
        events = 0
        watch = self._call(
            "watch", lambda: self.client.watch_slices(self._selector, version, timeout_seconds=self._watch_seconds)
        )
        with self._cond:
            if self._stopping.is_set():
                watch.close()
                return version, events
            self._watch = watch
            if resumed and self._dirty:
                self._retry_at = 0.0
                self._cond.notify_all()
        try:
            for event in watch:
                events += 1
                version = event.resource_version or version
                if event.type != "BOOKMARK" and not self._echo(event):
                    self._log.debug("slice changed by another writer", event=event.type)
                    self._poke()
        except KubeError as exc:
            self._count_error("watch", error_code(exc))
            self._failed("watch", exc)
            raise
        finally:
            with self._cond:
                if self._watch is watch:
                    self._watch = None
            watch.close()
        return version, events
