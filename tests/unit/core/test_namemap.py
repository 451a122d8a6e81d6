"""Every name colad derives from a resource name or a device ID is one-to-one, or the config is refused.

A table with a clash for each lossy mapping (config.load -> one line naming both names and the thing),
a seeded property over random pairs of valid names checked against the real writers (cdi.SpecWriter,
nfd.render_features/parse), the device-ID mappings over random IDs, and a scan of the package that fails
when a function deriving a name from a resource name or a device ID is not in namemap's table.
"""

from __future__ import annotations

import ast
import inspect
import os
import random
import string
from pathlib import Path

import pytest

from colad.config.config import MAPPINGS, OUTPUTS, Config, Output, load
from colad.core import devices, namemap
from colad.core.errors import ConfigError
from colad.core.names import resource_name_problem
from colad.outputs import cdi, nfd
from colad.runtime import files
from tests.oracles import nfd_labels

pytestmark = pytest.mark.unit

COLAD = Path(namemap.__file__).parents[1]  # the colad package
LONG_DOMAIN = ".".join(c * 60 for c in "abc") + "." + "d" * 50 + ".com"  # 237 characters
assert resource_name_problem(LONG_DOMAIN + "/x") is None


def write_config(root: Path, names: list[str], head: str = "") -> dict[str, str]:
    """A config file of `names` as [[resources]] (one name: the top-level keys), its env for load()."""
    text = head.format(root=root)
    if len(names) == 1:
        text += f'resource_name = "{names[0]}"\ndevice_dir = "{root}/d0"\n'
    else:
        text += "".join(f'[[resources]]\nname = "{n}"\ndevice_dir = "{root}/d{i}"\n' for i, n in enumerate(names))
    path = root / "colad.toml"
    path.write_text(f'run_dir = "{root}/run"\nkubelet_dir = "{root}/k"\ncdi_spec_dir = "{root}/cdi"\n' + text)
    return {"COLAD_CONFIG": str(path)}


def refusal(root: Path, names: list[str], head: str = "") -> str | None:
    """The one line load() refuses the config with, or None when it loads."""
    try:
        load({}, write_config(root, names, head))
    except ConfigError as exc:
        return str(exc)
    return None


NFD = 'nfd_features_file = "{root}/features"\n'
DRA = 'mode = "dra"\nnode_name = "node-1"\n'
NFD_PREFIX = NFD + 'nfd_label_prefix = "example.com"\n'
# (names, config head, the thing they meet on, the value shown)
CLASHES = [
    pytest.param(["a.com/x-y", "a.com-x/y"], "", "CDI spec file", "colad-a.com-x-y.json", id="spec-file-slash-dash"),
    pytest.param(
        ["ex.com/a-b-c", "ex.com-a-b/c"], 'cdi = "only"\n', "CDI spec file", "colad-ex.com-a-b-c.json", id="spec-only"
    ),
    pytest.param(
        ["a.com/x-y", "a.com-x/y"],
        'cdi = "off"\n' + NFD,
        "NFD label",
        "feature.node.kubernetes.io/a.com-x-y.present",
        id="nfd-label-slash-dash",
    ),
    pytest.param(
        ["a.com/gpu", "b.com/gpu"], NFD_PREFIX, "NFD label", "example.com/gpu.present", id="nfd-prefix-drops-domain"
    ),
    pytest.param(
        ["a.com/x"],
        'nfd_features_file = "{root}/cdi/colad-a.com-x.json"\n',
        "CDI spec file",
        "colad-a.com-x.json",
        id="spec-file-is-the-nfd-file",
    ),
    pytest.param([LONG_DOMAIN + "/x"], "", "CDI spec file", "over the 242", id="spec-file-name-too-long"),
    pytest.param(["a.com/gpu", "a.com/GPU"], "", "CDI spec file", "colad-a.com-GPU.json", id="spec-file-case-folds"),
    pytest.param(["a.com/X_y"], DRA, "DRA driver name", "'X_y.a.com' must be a lowercase DNS", id="dra-driver-not-dns"),
    pytest.param(
        [LONG_DOMAIN + "/x"], 'cdi = "off"\n' + DRA, "DRA driver name", "at most 63", id="dra-driver-too-long"
    ),
]


@pytest.mark.parametrize(("names", "head", "thing", "shown"), CLASHES)
def test_a_clash_is_refused_in_one_line_naming_both_and_the_thing(
    tmp_path: Path, names: list[str], head: str, thing: str, shown: str
) -> None:
    line = refusal(tmp_path, names, head)
    assert line is not None and "\n" not in line
    assert "names: " in line and thing in line and shown in line, line
    for name in names:
        assert repr(name) in line, line
    if len(names) == 1 and "nfd_features_file" in head:
        assert "nfd_features_file and resource" in line


def test_the_longest_spec_file_name_allowed_is_written(tmp_path: Path) -> None:
    assert len(files.temporary_name("x" * files.MAX_NAME_BYTES, 4_194_304)) == files.NAME_MAX_BYTES
    name = "colad-" + "x" * (files.MAX_NAME_BYTES - len("colad-.json")) + ".json"
    files.replace(str(tmp_path / name), b"{}", 0o644, 0o755)
    assert (tmp_path / name).read_bytes() == b"{}" and len(name) == files.MAX_NAME_BYTES


@pytest.mark.parametrize(
    ("names", "head"),
    [
        pytest.param(["a.com/x-y", "a.com-x/y"], 'cdi = "off"\n', id="no-spec-no-nfd"),
        pytest.param(["a.com/gpu", "b.com/gpu"], NFD, id="nfd-without-prefix-keeps-the-domain"),
        pytest.param(["a.com/gpu", "b.com/gpu"], 'nfd_label_prefix = "example.com"\n', id="prefix-without-nfd-file"),
        pytest.param(["a.com/x", "a.com/X"], 'cdi = "off"\n' + NFD, id="case-differs-in-labels"),
        pytest.param(["a.com/x.y", "a.com-x/y"], "", id="a-class-with-a-dot-has-no-spec"),
        pytest.param([LONG_DOMAIN + "/x"], 'cdi = "off"\n', id="long-name-without-spec"),
        pytest.param(["a.com/X_y"], "", id="no-driver-name-in-device-plugin-mode"),
        pytest.param(["a.com/X_y"], DRA + 'dra_driver = "y.a.com"\n', id="a-set-driver-name-in-dra-mode"),
    ],
)
def test_names_that_meet_on_nothing_in_use_load(tmp_path: Path, names: list[str], head: str) -> None:
    assert refusal(tmp_path, names, head) is None


def test_every_lossy_mapping_has_a_clash_in_the_table_and_the_kind_is_the_name() -> None:
    things = {p.values[2] for p in CLASHES}
    assert {m.thing for m in MAPPINGS} - things == {"CDI kind"}
    rng = random.Random(5)
    for _ in range(500):
        name = random_name(rng)
        assert namemap.cdi_kind(name) == name  # the identity: one-to-one


@pytest.mark.parametrize("prefix", ["", "example.com"])
def test_the_label_keys_are_those_nfd_publishes_from_the_feature_file(prefix: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        name = random_name(rng)
        published = nfd_labels(nfd.render_features([(name, devices.DeviceSet.of([]))], prefix))
        full = {k if "/" in k else f"{namemap.NFD_DEFAULT_PREFIX}/{k}" for k in published}
        assert full == set(namemap.nfd_label_keys(name, prefix)), name


def test_a_reload_of_a_clash_is_refused_by_the_same_check(tmp_path: Path) -> None:
    """config.load is what every role and `colad reload` call: a refused file never reaches a running role."""
    env = write_config(tmp_path, ["a.com/gpu", "b.com/gpu"], NFD_PREFIX)
    with pytest.raises(ConfigError, match="names: resource 'a.com/gpu' and resource 'b.com/gpu'"):
        load({}, env)


# --- the property: refused exactly when the real writers would send two names to one thing ----------

DNS = string.ascii_lowercase[:3] + "0-"
SHORT = string.ascii_letters[:2] + "AB" + "0_.-"


def _word(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, n)))


def random_name(rng: random.Random) -> str:
    """A valid extended-resource name over small alphabets, so that clashes are frequent."""
    while True:
        name = f"{_word(rng, DNS + '.', 8)}/{_word(rng, SHORT, 8)}"
        if resource_name_problem(name) is None:
            return name


def partner(rng: random.Random, name: str) -> str:
    """Another valid name, often one built to meet `name`: '/' moved to a '-', or the domain changed."""
    domain, _, short = name.partition("/")
    joined = f"{domain}-{short}"
    for _ in range(20):
        how = rng.randrange(4)
        if how == 0:
            cut = rng.choice([i for i, c in enumerate(joined) if c == "-"])
            other = joined[:cut] + "/" + joined[cut + 1 :]
        elif how == 1:
            other = f"{_word(rng, DNS + '.', 6)}/{short}"
        elif how == 2:
            other = f"{domain}/{short.swapcase()}"
        else:
            other = random_name(rng)
        if other != name and resource_name_problem(other) is None:
            return other
    return random_name(rng)


def real_clash(cfg: Config, a: str, b: str, tmp: Path) -> bool:
    """Whether the writers colad runs would send `a` and `b` (or one of them and a fixed file) to one thing."""
    if cfg.cdi != "off" and namemap.cdi_kind_problem(a) is None and namemap.cdi_kind_problem(b) is None:
        writer = cdi.SpecWriter(cfg.cdi_spec_dir)
        if writer.path(a).casefold() == writer.path(b).casefold():  # one file where the directory folds case
            return True
    if cfg.nfd_features_file:
        empty = devices.DeviceSet.of([])
        labels = nfd_labels(nfd.render_features([(a, empty), (b, empty)], cfg.nfd_label_prefix))
        if len(labels) < 2 * len(namemap.NFD_LABEL_SUFFIXES):
            return True
    return False


def test_random_pairs_load_or_are_refused_exactly_when_the_writers_would_clash(tmp_path: Path) -> None:
    seed = random.randrange(1 << 32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    heads = ["", 'cdi = "off"\n', 'cdi = "off"\n' + NFD, NFD, NFD_PREFIX, 'cdi = "only"\n' + NFD_PREFIX]
    refused = accepted = 0
    for _ in range(1000):
        a = random_name(rng)
        b = partner(rng, a)
        head = rng.choice(heads)
        line = refusal(tmp_path, [a, b], head)
        if line is not None and "names: " not in line:
            continue  # refused for another reason (a name that is no CDI kind under "only", a label too long)
        cfg = Config(
            cdi="off" if "off" in head else "only" if "only" in head else "both",
            cdi_spec_dir=str(tmp_path / "cdi"),
            nfd_features_file=str(tmp_path / "features") if "features" in head else "",
            nfd_label_prefix="example.com" if "prefix" in head else "",
        )
        clash = real_clash(cfg, a, b, tmp_path)
        assert (line is not None) is clash, (seed, a, b, head, line)
        refused += clash
        accepted += not clash
    assert refused > 25 and accepted > 500, (refused, accepted)


# --- device IDs ------------------------------------------------------------------------------------

ID_ALPHABET = string.ascii_letters[:3] + "AB" + "01._-"


def random_id(rng: random.Random) -> str:
    while True:
        device_id = _word(rng, ID_ALPHABET, 6)
        if devices.id_problem(device_id) is None:
            return device_id if rng.random() < 0.7 else devices.replica_id(device_id, rng.randrange(3))


def test_device_id_mappings_are_one_to_one_over_ids_and_replica_ids() -> None:
    rng = random.Random(11)
    ids = {random_id(rng) for _ in range(6000)}
    resources = ["a.com/x-y", "a.com-x/y", "a.com/X"]
    assert len({namemap.cdi_marker_name(i) for i in ids}) == len(ids)
    names = {namemap.cdi_device_name(r, i) for r in resources for i in ids}
    assert len(names) == len(ids) * len(resources)  # the '=' splits a pair one way only
    physical = {i for i in ids if "::" not in i}
    replicas = {devices.replica_id(i, n): (i, n) for i in physical for n in range(3)}
    assert len(replicas) == 3 * len(physical) and not set(replicas) & physical  # never a file's ID
    assert all(devices.base_id(r) == i for r, (i, _) in replicas.items())
    assert len({namemap.dra_device_name(i) for i in ids}) == len(ids)
    assert set(namemap.DEVICE_ID_MAPPINGS) == {
        namemap.cdi_device_name,
        namemap.cdi_marker_name,
        namemap.dra_device_name,
    }


# --- the table covers every function that derives a name ------------------------------------------

# Outside namemap: functions that take a resource name or a device ID and give a name, and why each
# needs no entry of its own.
ELSEWHERE = {
    ("outputs/cdi.py", "path"): "joins cdi_spec_dir and namemap.cdi_spec_file",
    ("outputs/cdi.py", "marker"): "namemap.cdi_marker_name plus '=' and the ID",
    ("config/config.py", "_spec_path"): "MAPPINGS' CDI spec file: joins cdi_spec_dir and namemap.cdi_spec_file",
    ("discovery/scan.py", "key"): "namemap.cdi_device_name",
    ("core/devices.py", "base_id"): "the inverse of replica_id",
    ("core/devices.py", "replica_id"): "one-to-one: an ID never holds ':' (test_device_id_mappings_are_one_to_one...)",
    ("queue/messages.py", "snapshot_key"): "a constant prefix and the name: one-to-one",
}
NAME_ARGS = {"resource_name", "resource", "device_id"}
NAME_RETURNS = {"str", "bytes", "tuple[str, ...]"}


def _deriving(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.returns is not None:
            args = {a.arg for a in node.args.args + node.args.kwonlyargs}
            if args & NAME_ARGS and ast.unparse(node.returns) in NAME_RETURNS:
                found.append(node.name)
    return found


def test_every_function_deriving_a_name_is_in_the_table_or_accounted_for() -> None:
    outside = {
        (path.relative_to(COLAD).as_posix(), name)
        for path in sorted(COLAD.rglob("*.py"))
        if path.name != "namemap.py"
        for name in _deriving(ast.parse(path.read_text()))
    }
    assert outside == set(ELSEWHERE), (
        "a new derived name: give it a function in colad/core/namemap.py and a NameMapping in colad/config/config.py"
    )
    inside = {
        name
        for name, fn in inspect.getmembers(namemap, inspect.isfunction)
        if fn.__module__ == namemap.__name__ and not name.startswith("_")
    }
    tabled = {fn.__name__ for m in MAPPINGS for fn in m.functions}
    tabled |= {fn.__name__ for fn in namemap.DEVICE_ID_MAPPINGS}
    assert inside == tabled


# --- colad's own paths: every pair compared where it leads, none in a device directory -------------

RUN_FILES = [o for o in OUTPUTS if o.keys == ("run_dir",) and not o.directory]
OWN_DIRS = [o for o in OUTPUTS if o.directory]


DRA_DIRS = DRA + 'plugins_registry_dir = "{root}/reg"\nplugins_dir = "{root}/plugins"\n'


def own_path(root: Path, output: Output) -> str:
    dra = {"mode": "dra", "plugins_registry_dir": f"{root}/reg", "plugins_dir": f"{root}/plugins"}
    return output.path(
        Config(
            run_dir=f"{root}/run", kubelet_dir=f"{root}/k", cdi_spec_dir=f"{root}/cdi", resource_name="a.com/x", **dra
        )
    )


@pytest.mark.parametrize("output", RUN_FILES + OWN_DIRS, ids=lambda o: o.who)
def test_the_nfd_file_on_any_path_colad_writes_is_refused_naming_both_keys_and_the_path(
    tmp_path: Path, output: Output
) -> None:
    path = own_path(tmp_path, output)
    head = DRA_DIRS if "mode" in output.keys else ""
    line = refusal(tmp_path, ["a.com/x"], head + f'nfd_features_file = "{path}"\n')
    assert line is not None and "\n" not in line
    if output.who == "run_dir":
        return  # a directory: refused by the path check before names (the file cannot be written)
    assert f"names: nfd_features_file and {output.who} both map to the path {path!r}" in line, line


def test_every_run_dir_file_is_in_the_table() -> None:
    names = {os.path.relpath(own_path(Path("/r"), o), "/r/run") for o in RUN_FILES}
    assert names >= {
        "queue.sock",
        "supervisor.sock",
        "supervisord.conf",
        "supervisord.pid",
        "state/plugin.json",
        "state/status.sock",
        "state/inuse.json",
        "state/sockets.json",
    }


@pytest.mark.parametrize(
    ("link_to", "spelled", "shown"),
    [
        pytest.param("cdi", "colad-a.com-x.json", "CDI spec file", id="spec-file-through-a-link"),
        pytest.param("run", "queue.sock", "run_dir (the queue socket)", id="queue-socket-through-a-link"),
        pytest.param("run/state", "../state/inuse.json", "run_dir (the in-use state file)", id="link-then-dotdot"),
    ],
)
def test_a_path_spelled_through_a_symlink_is_compared_where_it_leads(
    tmp_path: Path, link_to: str, spelled: str, shown: str
) -> None:
    (tmp_path / link_to).mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / link_to)
    line = refusal(tmp_path, ["a.com/x"], f'nfd_features_file = "{tmp_path}/link/{spelled}"\n')
    assert line is not None and "nfd_features_file and " in line and shown in line, line
    assert str(tmp_path / link_to) in line and "link" not in line.split("both map to")[1], line


def device_dir_refusal(root: Path, head: str) -> str | None:
    """The line load() refuses a config with resource a.com/x in root/d0 and one key set by `head`."""
    (root / "d0").mkdir()
    (root / "dlink").symlink_to(root / "d0")
    keys = {"run_dir": f"{root}/run", "kubelet_dir": f"{root}/k", "cdi_spec_dir": f"{root}/cdi"}
    key, _, value = head.format(root=root).partition(" = ")
    keys[key] = value.strip().strip('"')
    text = "".join(f'{k} = "{v}"\n' for k, v in keys.items())
    (root / "colad.toml").write_text(text + f'resource_name = "a.com/x"\ndevice_dir = "{root}/d0"\n')
    try:
        load({}, {"COLAD_CONFIG": str(root / "colad.toml")})
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("head", "who"),
    [
        pytest.param('cdi_spec_dir = "{root}/d0"\n', "cdi_spec_dir", id="spec-dir-is-the-device-dir"),
        pytest.param('nfd_features_file = "{root}/d0/nfd"\n', "nfd_features_file", id="nfd-file-in-the-device-dir"),
        pytest.param('cdi_spec_dir = "{root}/dlink/."\n', "cdi_spec_dir", id="spec-dir-through-a-link"),
        pytest.param('nfd_features_file = "{root}/dlink/nfd"\n', "nfd_features_file", id="through-a-link"),
    ],
)
def test_an_output_of_colad_in_a_device_directory_is_refused(tmp_path: Path, head: str, who: str) -> None:
    line = device_dir_refusal(tmp_path, head)
    assert line is not None and "\n" not in line and f"names: {who}" in line, line
    assert f"is in the device directory {str(tmp_path / 'd0')!r} of resource 'a.com/x'" in line, line


@pytest.mark.parametrize(
    "head",
    [
        pytest.param('nfd_features_file = "{root}/run/features"\n', id="nfd-file-beside-the-sockets"),
        pytest.param('nfd_features_file = "{root}/cdi/features"\n', id="nfd-file-beside-the-specs"),
        pytest.param('nfd_features_file = "{root}/d0.nfd"\n', id="a-sibling-of-the-device-dir"),
        pytest.param('nfd_features_file = "{root}/d0/sub/nfd"\n', id="nfd-file-in-a-subdirectory-of-it"),
        pytest.param('run_dir = "{root}/d0/run"\n', id="run-dir-a-subdirectory-of-it"),
        pytest.param('cdi_spec_dir = "{root}/d0/cdi"\n', id="spec-dir-a-subdirectory-of-it"),
    ],
)
def test_outputs_that_share_a_directory_or_sit_below_a_device_directory_load(tmp_path: Path, head: str) -> None:
    assert device_dir_refusal(tmp_path, head) is None
    env = write_config(tmp_path, ["a.com/x"]) | {"COLAD_CDI_SPEC_DIR": str(tmp_path / "run")}
    assert load({}, env).cdi_spec_dir == str(tmp_path / "run")  # spec files beside the sockets


# Joins onto a directory outside colad/config/config.py's path properties, and why each needs no OUTPUTS entry.
JOINS_ELSEWHERE = {
    ("outputs/cdi.py", "os.path.join(self.spec_dir, cdi_spec_file(resource_name))"): "a spec file: MAPPINGS",
    ("outputs/cdi.py", "os.path.join(spec_dir, cdi_spec_file(resource_name))"): "a spec file: MAPPINGS",
    ("cli/check.py", "os.path.join(kubelet_dir, n)"): "reads the kubelet directory",
    ("cli/kubelet_sim.py", "os.path.join(self.cfg.kubelet_dir, request.endpoint)"): "the simulated kubelet dials",
    ("kubelet_watch/main.py", "os.path.join(where, constants.KUBELET_SOCKET_NAME)"): "the kubelet's socket, read",
    ("runtime/kubeletdir.py", "os.path.join(kubelet_dir, endpoint_name(stamp))"): "a plugin socket: kubelet_dir",
    ("runtime/kubeletdir.py", "os.path.join(kubelet_dir, n)"): "lists the kubelet directory",
    ("plugin/sockets.py", "os.path.join(self.cfg.kubelet_dir, name)"): "a plugin socket: kubelet_dir",
    ("core/dra_registration.py", "posixpath.join(plugins_dir, driver, PLUGIN_SOCKET_NAME)"): "Config.dra_plugin_socket",
    ("dra/service.py", "os.path.join(self.cdi_spec_dir, claims.claim_spec_file(self.driver, uid))"): (
        "a claim's spec file, k8s.<driver>-claim_<uid>.json: never a resource's, whose names start colad-"
    ),
}
DIRECTORY_WORDS = ("run_dir", "kubelet_dir", "spec_dir", "constants.", "_NAME", "state/", "where")


def test_every_path_colad_writes_is_in_the_output_table() -> None:
    """A Config path property under one of colad's directories is an OUTPUTS entry, and no module
    joins a name onto such a directory itself (it would be a path `collisions` never sees)."""
    sample = Config(run_dir="/r/run", kubelet_dir="/r/k", cdi_spec_dir="/r/cdi", nfd_features_file="/r/nfd")
    tabled = {o.path(sample) for o in OUTPUTS}
    for name, prop in inspect.getmembers(Config, lambda m: isinstance(m, property)):
        value = prop.fget(sample)
        if isinstance(value, str) and value.startswith("/r/") and name != "kubelet_socket":  # the kubelet's
            assert value in tabled, f"Config.{name} is a path colad writes: give it an Output in colad/config/config.py"
    joins = {
        (path.relative_to(COLAD).as_posix(), ast.unparse(node))
        for path in sorted(COLAD.rglob("*.py"))
        if path.name != "config.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("os.path.join", "posixpath.join")
        and any(word in ast.unparse(arg) for arg in node.args for word in DIRECTORY_WORDS)
    }
    assert joins == set(JOINS_ELSEWHERE), "a path joined outside Config: make it a Config property and an Output"
