"""The slice publisher against the strict fake API server over HTTPS: slices exact after every change,
only the changed ones written, re-created after a wipe, exact again after an outage and a conflicting
writer, withdrawn on request, and a prompt stop."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from colad.core.backoff import Backoff
from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.dra.publisher import SlicePublisher
from colad.kube.access import Access, Credentials
from colad.kube.client import SLICES, KubeClient
from colad.kube.errors import UNREACHABLE
from colad.outputs.statefile import SliceStatus
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

DRIVER = "cola.myway5.com"
RESOURCE = "myway5.com/cola"
NODE = "node-1"
TOKEN = "test-token"
FAST = Backoff(first=0.02, cap=0.2)
WAIT = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fake(pki: Pki) -> Iterator[FakeApiServer]:
    server = FakeApiServer(pki, tokens={TOKEN}).start()
    server.add_node(NODE, "node-uid-1")
    yield server
    server.hang.clear()
    server.stop()


def client_for(fake: FakeApiServer, cls: type[KubeClient] = KubeClient) -> KubeClient:
    return cls(Credentials(Access(server=fake.url, ca_file=str(fake.pki.ca), token=TOKEN)), timeout=5.0)


@pytest.fixture
def errors() -> Counter[tuple[str, str]]:
    return Counter()


@pytest.fixture
def written() -> Counter[str]:
    return Counter()


@pytest.fixture
def publishers() -> Iterator[list[SlicePublisher]]:
    made: list[SlicePublisher] = []
    yield made
    for publisher in made:
        publisher.stop()


@pytest.fixture
def start(
    fake: FakeApiServer, errors: Counter[tuple[str, str]], written: Counter[str], publishers: list[SlicePublisher]
) -> Callable[..., SlicePublisher]:
    def make(client: KubeClient | None = None, resources: tuple[str, ...] = (RESOURCE,)) -> SlicePublisher:
        publisher = SlicePublisher(
            client or client_for(fake),
            driver=DRIVER,
            node_name=NODE,
            resource_names=resources,
            count_error=lambda verb, code: errors.update([(verb, code)]),
            count_write=lambda verb: written.update([verb]),
            backoff=FAST,
        )
        publishers.append(publisher)
        return publisher.start()

    return make


def devices(*ids: str, unhealthy: tuple[str, ...] = ()) -> dict[str, DeviceSet]:
    return {RESOURCE: DeviceSet.of(Device(i, health=UNHEALTHY if i in unhealthy else "Healthy") for i in ids)}


def published(fake: FakeApiServer) -> list[str]:
    """The device names this node's slices of the driver list, sorted."""
    return sorted(d["name"] for s in fake.node_slices(NODE, DRIVER) for d in s["spec"]["devices"])


def writes(fake: FakeApiServer) -> Counter[str]:
    """Successful writes of slices so far, by method."""
    with fake.lock:
        return Counter(m for m, path, code in fake.requests if path.startswith(SLICES) and m != "GET" and code < 300)


def converge(publisher: SlicePublisher, sets: dict[str, DeviceSet]) -> None:
    publisher.publish(sets)
    assert publisher.wait_converged(WAIT), "the publisher did not converge"


def test_three_devices_make_one_slice_owned_by_the_node(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    converge(start(), devices("cola0", "cola1", "cola2"))
    (held,) = fake.node_slices(NODE, DRIVER)
    assert [d["name"] for d in held["spec"]["devices"]] == ["cola0", "cola1", "cola2"]
    assert held["spec"]["pool"] == {"name": NODE, "generation": 0, "resourceSliceCount": 1}
    assert held["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"


def test_one_device_more_is_one_update_and_no_create(fake: FakeApiServer, start: Callable[..., SlicePublisher]) -> None:
    publisher = start()
    converge(publisher, devices("cola0", "cola1", "cola2"))
    before = writes(fake)
    converge(publisher, devices("cola0", "cola1", "cola2", "cola3"))
    assert writes(fake) - before == Counter({"PUT": 1})
    assert published(fake) == ["cola0", "cola1", "cola2", "cola3"]


def lists(fake: FakeApiServer) -> int:
    """Lists of slices so far (watches not counted)."""
    with fake.lock:
        return sum(1 for m, path, _ in fake.requests if m == "GET" and path.startswith(SLICES) and "watch=" not in path)


def test_a_change_is_written_without_listing_again_until_another_writer_is_seen(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    publisher = start()
    converge(publisher, devices("cola0", "cola1"))
    wait_until(lambda: any("watch=1" in p for _, p, _ in fake.requests), WAIT, "the watch open")
    converge(publisher, devices("cola0", "cola1", "cola2"))  # the watch's own list may come before it
    before, listed = writes(fake), lists(fake)
    for n in range(3, 6):
        converge(publisher, devices(*(f"cola{i}" for i in range(n + 1))))
    assert (writes(fake) - before, lists(fake) - listed) == (Counter({"PUT": 3}), 0)

    other = client_for(fake)
    (held,) = fake.node_slices(NODE, DRIVER)
    held["spec"]["devices"] = held["spec"]["devices"][:1]
    other.update_slice(held)
    wait_until(lambda: len(published(fake)) == 6 or None, WAIT, "the slice put back")
    assert lists(fake) - listed >= 1  # another writer seen on the watch: read again before writing


def test_an_unchanged_publish_writes_nothing(fake: FakeApiServer, start: Callable[..., SlicePublisher]) -> None:
    publisher = start()
    converge(publisher, devices("cola0", "cola1"))
    before = writes(fake)
    converge(publisher, devices("cola0", "cola1"))
    assert writes(fake) == before


def test_300_devices_fill_three_slices_of_one_pool_generation(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    publisher = start()
    converge(publisher, devices("cola0"))
    converge(publisher, devices(*(f"cola{i:03d}" for i in range(300))))
    held = fake.node_slices(NODE, DRIVER)
    assert len(held) == 3 and all(len(s["spec"]["devices"]) <= 128 for s in held)
    assert {json.dumps(s["spec"]["pool"]) for s in held} == {
        json.dumps({"name": NODE, "generation": 1, "resourceSliceCount": 3})
    }
    assert published(fake) == [f"cola{i:03d}" for i in range(300)]


def test_an_unhealthy_device_is_left_out(fake: FakeApiServer, start: Callable[..., SlicePublisher]) -> None:
    publisher = start()
    converge(publisher, devices("cola0", "cola1", "cola2"))
    converge(publisher, devices("cola0", "cola1", "cola2", unhealthy=("cola1",)))
    assert published(fake) == ["cola0", "cola2"]


def test_one_pool_per_resource(fake: FakeApiServer, start: Callable[..., SlicePublisher]) -> None:
    other = "myway5.com/soda"
    publisher = start(resources=(RESOURCE, other))
    converge(publisher, {RESOURCE: DeviceSet.of([Device("cola0")]), other: DeviceSet.of([Device("soda0")])})
    pools = {s["spec"]["pool"]["name"]: [d["name"] for d in s["spec"]["devices"]] for s in fake.node_slices(NODE)}
    assert sorted(pools.values()) == [["cola0"], ["soda0"]] and all(p.startswith(f"{NODE}/") for p in pools)


def test_slices_wiped_by_the_kubelet_are_created_again(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    converge(start(), devices(*(f"cola{i:03d}" for i in range(200))))
    assert fake.wipe_node(NODE) == 2
    wait_until(lambda: len(published(fake)) == 200, WAIT, "the wiped slices created again")


def test_a_slice_changed_by_another_writer_is_put_back(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    converge(start(), devices("cola0", "cola1"))
    other = client_for(fake)
    (held,) = fake.node_slices(NODE, DRIVER)
    held["spec"]["devices"] = held["spec"]["devices"][:1]
    other.update_slice(held)
    wait_until(lambda: published(fake) == ["cola0", "cola1"], WAIT, "the slice put back")


class _Behind(KubeClient):
    """A client whose next slice update (or its next create) first lets another writer act."""

    before_update: Callable[[dict[str, Any]], None] | None = None

    def update_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        meddle, self.before_update = self.before_update, None
        if meddle is not None:
            meddle(obj)
        return super().update_slice(obj)


def test_a_conflicting_writer_is_read_again_and_converged(
    fake: FakeApiServer, start: Callable[..., SlicePublisher], errors: Counter[tuple[str, str]]
) -> None:
    client = client_for(fake, _Behind)
    assert isinstance(client, _Behind)
    publisher = start(client)
    converge(publisher, devices("cola0", "cola1"))
    other = client_for(fake)

    def update_behind(obj: dict[str, Any]) -> None:
        held = other.get_slice(obj["metadata"]["name"])
        held["spec"]["devices"] = []
        other.update_slice(held)

    client.before_update = update_behind
    converge(publisher, devices("cola0", "cola1", "cola2"))
    assert errors[("update", "409")] == 1
    assert published(fake) == ["cola0", "cola1", "cola2"]


def test_a_slice_deleted_under_an_update_is_created_again(
    fake: FakeApiServer, start: Callable[..., SlicePublisher], errors: Counter[tuple[str, str]]
) -> None:
    client = client_for(fake, _Behind)
    assert isinstance(client, _Behind)
    publisher = start(client)
    converge(publisher, devices("cola0"))
    client.before_update = lambda obj: fake.wipe_node(NODE)
    converge(publisher, devices("cola0", "cola1"))
    assert errors[("update", "404")] == 1
    assert published(fake) == ["cola0", "cola1"]


def test_an_outage_is_retried_counted_and_ends_exact(
    fake: FakeApiServer, start: Callable[..., SlicePublisher], errors: Counter[tuple[str, str]]
) -> None:
    publisher = start()
    converge(publisher, devices("cola0", "cola1", "cola2"))
    fake.stop()
    publisher.publish(devices("cola1", "cola2", "cola3", unhealthy=("cola2",)))
    wait_until(lambda: errors[("list", UNREACHABLE)] >= 3, WAIT, "failed lists counted")
    assert not publisher.wait_converged(0)
    fake.start()
    assert publisher.wait_converged(WAIT)
    assert published(fake) == ["cola1", "cola3"]
    assert errors[("watch", UNREACHABLE)] + errors[("list", UNREACHABLE)] >= 3


def test_status_says_current_only_while_the_api_server_holds_the_last_publish_and_answers(
    fake: FakeApiServer, publishers: list[SlicePublisher], errors: Counter[tuple[str, str]]
) -> None:
    changes: list[SliceStatus] = []
    publisher = SlicePublisher(
        client_for(fake),
        driver=DRIVER,
        node_name=NODE,
        resource_names=(RESOURCE,),
        count_error=lambda verb, code: errors.update([(verb, code)]),
        backoff=FAST,
        on_change=lambda: changes.append(publisher.status()),
    )
    publishers.append(publisher)
    assert publisher.status() == SliceStatus()  # nothing handed over: not wanted, not published
    publisher.start()
    converge(publisher, devices("cola0", "cola1", "cola2"))
    wait_until(lambda: publisher.status().current or None, WAIT, "the slices current")
    held = publisher.status()
    assert (held.wanted, held.slices, held.devices, held.failing, held.last_error) == (True, 1, 3, "", "")
    assert changes and changes[-1].current  # told, not only asked
    fake.stop()
    failing = wait_until(lambda: (s := publisher.status()).failing and s, WAIT, "the outage seen")
    assert not failing.current and not failing.pending and failing.published  # the watch is cut: changes unseen
    publisher.publish(devices("cola1"))
    pending = wait_until(lambda: (s := publisher.status()).failing and s.pending and s, WAIT, "a change pending")
    assert pending.failing.startswith(("list: ", "watch: ")) and pending.last_error, pending
    fake.start()
    assert publisher.wait_converged(WAIT)
    back = wait_until(lambda: (s := publisher.status()).current and s, WAIT, "the slices current again")
    assert (back.devices, back.failing) == (1, "") and back.last_error, back
    assert changes[-1].current


def test_a_watch_too_old_to_resume_lists_again(
    fake: FakeApiServer, start: Callable[..., SlicePublisher], errors: Counter[tuple[str, str]]
) -> None:
    publisher = start()
    converge(publisher, devices("cola0"))
    fake.stop()
    wait_until(lambda: errors[("watch", UNREACHABLE)] >= 1, WAIT, "the watch cut")
    fake.wipe_node(NODE)
    fake.compact()  # the deletion is forgotten: only a new list shows it
    fake.start()
    wait_until(lambda: errors[("watch", "410")] >= 1, WAIT, "the watch refused as too old")
    wait_until(lambda: published(fake) == ["cola0"], WAIT, "the wiped slice created again after a new list")


def test_stop_ends_an_open_watch_and_a_back_off(fake: FakeApiServer, start: Callable[..., SlicePublisher]) -> None:
    publisher = start()
    converge(publisher, devices("cola0"))
    wait_until(lambda: any("watch=1" in p for _, p, _ in fake.requests), WAIT, "the watch open")
    assert publisher.stop(timeout=WAIT)
    slow = SlicePublisher(client_for(fake), driver=DRIVER, node_name=NODE, resource_names=(RESOURCE,))
    fake.stop()
    slow.start().publish(devices("cola0"))
    assert slow.stop(timeout=WAIT)


def test_withdraw_deletes_only_this_drivers_slices_on_this_node(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    publisher = start()
    converge(publisher, devices(*(f"cola{i:03d}" for i in range(130))))
    foreign = json.loads(json.dumps(fake.node_slices(NODE, DRIVER)[0]))
    foreign["metadata"] = {"generateName": "other-"}
    foreign["spec"]["driver"] = "other.example.com"
    client_for(fake).create_slice(foreign)
    assert publisher.withdraw(WAIT)
    assert fake.node_slices(NODE, DRIVER) == []
    assert [s["spec"]["driver"] for s in fake.node_slices(NODE)] == ["other.example.com"]


def test_each_accepted_write_is_counted_and_status_says_how_many_slices_are_current(
    fake: FakeApiServer, start: Callable[..., SlicePublisher], written: Counter[str]
) -> None:
    publisher = start()
    held = lambda: (publisher.status().slices, publisher.status().current)  # noqa: E731
    assert held() == (0, False)  # nothing published yet
    converge(publisher, devices(*(f"cola{i:03d}" for i in range(300))))
    assert held() == (3, True)
    converge(publisher, devices("cola000"))
    assert held() == (1, True)
    assert publisher.withdraw(WAIT)
    assert held() == (0, False)  # withdrawn: none held, and nothing published to be current
    methods = {"create": "POST", "update": "PUT", "delete": "DELETE"}
    assert writes(fake) == Counter({methods[verb]: n for verb, n in written.items()})
    assert set(written) == {"create", "update", "delete"}


def test_nothing_is_written_before_the_first_publish(fake: FakeApiServer, start: Callable[..., SlicePublisher]) -> None:
    publisher = start()
    wait_until(lambda: any("watch=1" in p for _, p, _ in fake.requests), WAIT, "the watch open")
    assert not publisher.wait_converged(0)
    assert writes(fake) == Counter()


def test_a_restarted_publisher_leaves_the_slices_as_held_until_it_knows_the_devices(
    fake: FakeApiServer, start: Callable[..., SlicePublisher]
) -> None:
    other = "myway5.com/soda"
    first = start(resources=(RESOURCE, other))
    many = {RESOURCE: DeviceSet.of(Device(f"cola{i:03d}") for i in range(130)), other: DeviceSet.of([Device("soda0")])}
    converge(first, many)
    assert first.stop(WAIT)
    held = {s["metadata"]["name"]: s for s in fake.node_slices(NODE, DRIVER)}
    before = writes(fake)

    restarted = start(resources=(RESOURCE, other))
    converge(restarted, {})  # started: discovery not heard yet
    converge(restarted, {other: many[other]})  # one resource heard, unchanged
    assert writes(fake) == before
    assert {s["metadata"]["name"]: s for s in fake.node_slices(NODE, DRIVER)} == held
    status = restarted.status()
    assert (status.slices, status.wanted, status.published, status.current) == (len(held), False, False, False)

    converge(restarted, {RESOURCE: many[RESOURCE], other: DeviceSet()})  # heard with no devices: emptied
    assert published(fake) == sorted(f"cola{i:03d}" for i in range(130))
    assert restarted.status().current
    assert restarted.withdraw(WAIT) and fake.node_slices(NODE, DRIVER) == []
