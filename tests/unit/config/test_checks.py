"""Config keys of CDI, probes, prepares, host paths and pod resources: each checked at load, naming the key.

CDI mode and spec directory, host-path checks, probes (per resource, overridable per device),
prepare commands and their timeout below the kubelet's 30 s, the NFD feature file. Also the
device-file keys (`optional`, `probe`, `prepare`) and that none of them changes the queue's wire.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from colad.config.checks import PRE_START_DEADLINE
from colad.config.config import Config, Resource, load
from colad.core.devices import Device, DeviceSet, Mount
from colad.core.errors import ConfigError
from colad.discovery import devicefile
from colad.queue import device_wire

pytestmark = pytest.mark.unit


def load_text(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "colad.toml"
    path.write_text(text)
    return load({"config": str(path)}, env or {})


def refused(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text, env)
    return str(info.value)


def test_defaults(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "")
    assert (cfg.cdi, cfg.cdi_spec_dir, cfg.host_path_check) == ("both", "/var/run/cdi", True)
    assert cfg.probe_max_in_flight == 4
    assert (cfg.nfd_features_file, cfg.nfd_label_prefix, cfg.nfd_expiry) == ("", "", 3600.0)
    (resource,) = cfg.resources
    assert resource.probe == () and resource.prepare == () and not resource.pre_start_required
    assert resource.prepare_timeout < PRE_START_DEADLINE


def test_top_level_keys_make_the_single_resource(tmp_path: Path) -> None:
    cfg = load_text(
        tmp_path,
        'probe = ["/usr/bin/cola-probe", "--fast"]\nprobe_timeout = 2\nprobe_interval = 7.5\n'
        'prepare = ["/usr/bin/cola-reset"]\nprepare_timeout = 20\n',
    )
    (r,) = cfg.resources
    assert r.probe == ("/usr/bin/cola-probe", "--fast") and (r.probe_timeout, r.probe_interval) == (2.0, 7.5)
    assert r.prepare == ("/usr/bin/cola-reset",) and r.prepare_timeout == 20.0 and r.pre_start_required


def test_resource_tables_set_their_own(tmp_path: Path) -> None:
    cfg = load_text(
        tmp_path,
        '[[resources]]\nname = "a.example/x"\ndevice_dir = "/srv/x"\nprepare = ["/bin/true"]\n'
        '[[resources]]\nname = "a.example/y"\ndevice_dir = "/srv/y"\nprobe = ["/bin/false"]\nprobe_interval = 3\n',
    )
    x, y = cfg.resources
    assert x.pre_start_required and not y.pre_start_required
    assert y.probe == ("/bin/false",) and y.probe_interval == 3.0 and x.probe == ()
    assert y == Resource("a.example/y", "/srv/y", probe=("/bin/false",), probe_interval=3.0)


def test_command_from_the_environment_is_split_without_a_shell(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "", {"COLAD_PREPARE": "/usr/bin/reset --mode 'a b' $HOME"})
    assert cfg.prepare == ("/usr/bin/reset", "--mode", "a b", "$HOME")
    assert load(None, cfg.environment()) == cfg  # what supervise hands its children


BAD = [
    pytest.param('cdi = "sometimes"', "cdi (file", "must be one of both, only, off", id="cdi-mode"),
    pytest.param('cdi_spec_dir = "cdi"', "cdi_spec_dir", "absolute", id="spec-dir-relative"),
    pytest.param('cdi_spec_dir = "/"', "cdi_spec_dir", "must not be '/'", id="spec-dir-root"),
    pytest.param('host_path_check = "maybe"', "host_path_check", "true or false", id="host-path-check"),
    pytest.param("probe_max_in_flight = 0", "probe_max_in_flight", "from 1 to 64", id="in-flight-zero"),
    pytest.param("probe_max_in_flight = 65", "probe_max_in_flight", "from 1 to 64", id="in-flight-many"),
    pytest.param('probe = "/bin/true"', "probe (file", None, id="probe-string-in-file-is-split"),
    pytest.param('probe = ["true"]', "probe (file", "absolute path", id="probe-relative"),
    pytest.param("probe = [1]", "probe (file", "list of strings", id="probe-not-strings"),
    pytest.param('probe = ["/bin/x\\u0000"]', "probe (file", "NUL", id="probe-nul"),
    pytest.param("probe = [" + ", ".join(['"/a"'] * 65) + "]", "probe (file", "64 arguments", id="probe-long"),
    pytest.param("probe_timeout = 0", "probe_timeout", "greater than 0", id="probe-timeout"),
    pytest.param("probe_interval = -1", "probe_interval", "greater than 0", id="probe-interval"),
    pytest.param('prepare = ["bin/reset"]', "prepare (file", "absolute path", id="prepare-relative"),
    pytest.param("prepare_timeout = 29", "prepare_timeout", "at most 28", id="prepare-timeout-past-kubelet"),
    pytest.param("prepare_timeout = 0", "prepare_timeout", "greater than 0", id="prepare-timeout-zero"),
    pytest.param('nfd_features_file = "features"', "nfd_features_file", "absolute", id="nfd-relative"),
    pytest.param('nfd_label_prefix = "Not_DNS"', "nfd_label_prefix", "DNS subdomain", id="nfd-prefix"),
    pytest.param("nfd_expiry = 10", "nfd_expiry", "from 60", id="nfd-expiry"),
    pytest.param(
        '[[resources]]\nname = "a.example/x"\ndevice_dir = "/srv/x"\nprepare_timeout = 30',
        "resources[0].prepare_timeout",
        "at most 28",
        id="table-prepare-timeout",
    ),
    pytest.param(
        '[[resources]]\nname = "a.example/x"\ndevice_dir = "/srv/x"\nprobe = "/bin/true"\nprobe_timeout = "x"',
        "resources[0].probe_timeout",
        "could not convert",
        id="table-probe-timeout-type",
    ),
    pytest.param(
        'prepare = ["/bin/true"]\n[[resources]]\nname = "a.example/x"\ndevice_dir = "/srv/x"',
        "prepare (file",
        "cannot be used with a [[resources]] list",
        id="top-level-with-tables",
    ),
    pytest.param(
        'cdi = "only"\nresource_name = "1x.example/cola"', "cdi (file", "CDI vendor", id="only-needs-cdi-kind"
    ),
]


@pytest.mark.parametrize("text, key, reason", BAD)
def test_bad_values_are_refused_naming_the_key(tmp_path: Path, text: str, key: str, reason: str | None) -> None:
    if reason is None:  # a string in the file is read as a command line, as from the environment
        assert load_text(tmp_path, text).probe == ("/bin/true",)
        return
    message = refused(tmp_path, text)
    assert key in message and reason in message, message
    assert len(message.splitlines()) == 1


def test_every_problem_at_once(tmp_path: Path) -> None:
    message = refused(tmp_path, 'cdi = "x"\nprobe = ["rel"]\nprepare_timeout = 99\nprobe_max_in_flight = 0\n')
    for key in ("cdi (", "probe (", "prepare_timeout (", "probe_max_in_flight ("):
        assert key in message, message


def test_only_accepts_every_valid_cdi_kind(tmp_path: Path) -> None:
    assert load_text(tmp_path, 'cdi = "only"').cdi == "only"
    assert load_text(tmp_path, 'cdi = "both"\nresource_name = "1x.example/cola"').cdi == "both"  # no spec then


# --- device files: optional entries, probe and prepare overrides -----------------------------


def test_device_file_overrides_and_optional_entries() -> None:
    device = devicefile.parse(
        "cola1",
        b'probe = ["/usr/bin/probe", "--deep"]\nprepare = []\n'
        b'[[device_nodes]]\nhost_path = "/dev/cola1"\noptional = true\n'
        b'[[mounts]]\nhost_path = "/srv/fw"\n',
    )
    assert device.problem == ""
    assert device.probe == ("/usr/bin/probe", "--deep") and device.prepare == ()
    assert device.device_nodes[0].optional and not device.mounts[0].optional
    assert devicefile.parse("cola2", b"").probe is None  # absent: the resource's


@pytest.mark.parametrize(
    "text, reason",
    [
        (b'probe = "/bin/true"', "probe must be a list of strings"),
        (b'prepare = ["reset"]', "prepare must start with the command's absolute path"),
        (b'[[mounts]]\nhost_path = "/a"\noptional = "yes"', "mounts[0].optional must be true or false"),
        (b'[[device_nodes]]\nhost_path = "/dev/a"\noptional = 1', "device_nodes[0].optional must be true or false"),
    ],
)
def test_device_file_refuses_bad_overrides(text: bytes, reason: str) -> None:
    device = devicefile.parse("cola1", text)
    assert device.health == "Unhealthy" and device.problem.startswith(reason), device.problem


def test_local_fields_never_change_the_wire() -> None:
    # The digest both ends compute is over the wire entries: a field one end cannot see would
    # make them disagree forever (a resync loop). A probe and an entry's `optional` are
    # discovery's alone; a device's `prepare` crosses the queue (the plugin runs it).
    plain = [Device("a"), Device("b", envs=(("X", "1"),), mounts=(Mount("/m", "/m"),))]
    local = [
        devicefile.parse("a", b'probe = ["/bin/true"]'),
        devicefile.parse("b", b'probe = []\nenvs.X = "1"\n[[mounts]]\nhost_path = "/m"\noptional = true\n'),
    ]
    assert local[0] != plain[0] and local[1] != plain[1]
    for ours, theirs in zip(plain, local, strict=True):
        assert device_wire.device_entry(ours) == device_wire.device_entry(theirs)
    assert local[0].bare
    assert device_wire.set_digest(DeviceSet.of(plain)) == device_wire.set_digest(DeviceSet.of(local))
    prepared = devicefile.parse("a", b"prepare = []")
    assert not prepared.bare and device_wire.device_entry(prepared) == b'{"id":"a","prepare":[]}'
    assert device_wire.device_from_wire(device_wire.device_to_wire(prepared)) == prepared


# --- every example in docs/DEVICES.md ----------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs" / "DEVICES.md"


def test_docs_config_examples_load(tmp_path: Path) -> None:
    # Device-file examples are ```toml blocks (tests/unit/discovery/test_devicefile.py parses them);
    # colad.toml examples are ```toml conf blocks, each loaded as the whole config file.
    import re

    blocks = re.findall(r"^```toml conf\n(.*?)^```", DOCS.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert len(blocks) >= 4
    for block in blocks:
        load_text(tmp_path, block)
    device_blocks = re.findall(r"^```toml\n(.*?)^```", DOCS.read_text(encoding="utf-8"), flags=re.S | re.M)
    parsed = [devicefile.parse("cola1", b.encode()) for b in device_blocks]
    assert all(d.problem == "" for d in parsed)
    assert any(d.prepare and d.probe for d in parsed)
    assert any(m.optional for d in parsed for m in d.mounts)
