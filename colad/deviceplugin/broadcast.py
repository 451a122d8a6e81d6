"""The device set every ListAndWatch stream of a resource follows, and its version.

Pure threading over DeviceSet (no gRPC, no protobuf object): the life-cycle thread updates it,
each stream thread waits on it, every Allocate reads it. Split from service.py, which serves it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from colad.core.devices import DeviceSet
from colad.deviceplugin.device_list import encoded_list


class DeviceBroadcast:
    """The device set every ListAndWatch stream follows; thread-safe.

    `update` bumps a version only when the list the kubelet sees changed (IDs, health,
    topology: a new env or a probe's new reason reaches Allocate, not the streams), and
    streams send the newest set whenever the version moved since their last send, so a
    burst of changes coalesces into as few messages as the stream can take.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices = DeviceSet()
        self._version = 0
        self._closed_generation = -1

    @property
    def devices(self) -> DeviceSet:
        # One reference read, atomic under the GIL: every Allocate reads it, so no lock round-trip.
        return self._devices

    def update(self, devices: DeviceSet) -> bool:
        with self._cond:
            if devices is self._devices:
                return False
            visible = encoded_list(devices) != encoded_list(self._devices)  # cached on each set
            # A set the kubelet sees differently is a change: no O(devices) __eq__ for it.
            if not visible and devices == self._devices:
                return False
            self._devices = devices
            if visible:
                self._version += 1
                self._cond.notify_all()
            return True

    def close_generation(self, generation: int) -> None:
        """End every stream that belongs to server `generation` or an older one."""
        with self._cond:
            self._closed_generation = max(self._closed_generation, generation)
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_change(self, seen: int, generation: int, alive: Callable[[], bool]) -> tuple[int, DeviceSet] | None:
        """Block until the set moves past version `seen`; None when the stream must end."""
        with self._cond:
            while True:
                if generation <= self._closed_generation or not alive():
                    return None
                if self._version != seen:
                    return self._version, self._devices
                # The timeout is only a safety net; cancellation and updates notify.
                self._cond.wait(timeout=30.0)

    def snapshot(self) -> tuple[int, DeviceSet]:
        with self._cond:
            return self._version, self._devices
