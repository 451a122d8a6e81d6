"""The trust rule for device files and directories, as a table over owners, modes and stickiness."""

from __future__ import annotations

import itertools

import pytest

from colad.core.trust import (
    ROOT_ONLY,
    UNTRUSTED,
    chain_problem,
    directory_problem,
    file_problem,
    host_path_problem,
    program_problem,
    trusted_uids,
)

pytestmark = pytest.mark.unit
ROOT, DELEGATE, NOBODY = 0, 1001, 65534
TRUSTED = trusted_uids([DELEGATE])
FILE, DIR = 0o100000, 0o040000  # S_IFREG, S_IFDIR


@pytest.mark.parametrize(
    ("uid", "mode", "why"),
    [
        (ROOT, 0o644, None),
        (ROOT, 0o600, None),
        (ROOT, 0o444, None),
        (ROOT, 0o4755, None),  # setuid bits say nothing about who can write
        (DELEGATE, 0o644, None),
        (DELEGATE, 0o640, None),
        (ROOT, 0o664, "writable by group (mode 0664)"),
        (ROOT, 0o646, "writable by others (mode 0646)"),
        (ROOT, 0o666, "writable by group and others (mode 0666)"),
        (DELEGATE, 0o660, "writable by group (mode 0660)"),
        (NOBODY, 0o644, "owned by uid 65534, which is neither root nor in trusted_owners"),
        (NOBODY, 0o400, "owned by uid 65534, which is neither root nor in trusted_owners"),
        (NOBODY, 0o666, "owned by uid 65534, which is neither root nor in trusted_owners"),
    ],
    ids=lambda v: f"{v:o}" if isinstance(v, int) and v > 0o77 else str(v),
)
def test_a_device_file_is_trusted_when_a_trusted_owner_alone_can_write_it(uid: int, mode: int, why: str | None) -> None:
    problem = file_problem("/etc/colas/cola1", FILE | mode, uid, TRUSTED)
    assert problem == (None if why is None else f"{UNTRUSTED}/etc/colas/cola1 is {why}")


def test_root_alone_is_trusted_by_default_and_always() -> None:
    assert ROOT_ONLY == trusted_uids([]) == frozenset({0})
    assert trusted_uids([DELEGATE, DELEGATE]) == {0, DELEGATE}
    assert file_problem("/d/f", FILE | 0o644, DELEGATE, ROOT_ONLY) is not None
    assert file_problem("/d/f", FILE | 0o644, ROOT, frozenset({DELEGATE})) is not None  # the shell adds root


OWNERS = {"root": ROOT, "delegate": DELEGATE, "nobody": NOBODY}
DIR_MODES = [0o755, 0o700, 0o775, 0o757, 0o777, 0o1777, 0o1755, 0o1775]


@pytest.mark.parametrize(
    ("owner", "mode", "device_dir"),
    list(itertools.product(OWNERS, DIR_MODES, (True, False))),
    ids=lambda v: f"{v:04o}" if isinstance(v, int) and not isinstance(v, bool) else str(v),
)
def test_a_directory_is_trusted_when_only_trusted_owners_can_change_its_entries(
    owner: str, mode: int, device_dir: bool
) -> None:
    problem = directory_problem("/srv/colas", DIR | mode, OWNERS[owner], TRUSTED, device_dir=device_dir)
    writable = bool(mode & 0o022)
    sticky = bool(mode & 0o1000)
    # An ancestor that others can write is safe when sticky (/tmp): only an entry's owner can move
    # it, and the entry is checked next. The device directory itself never: others could add files.
    expected = owner != "nobody" and (not writable or (sticky and not device_dir))
    assert (problem is None) == expected, problem
    if problem is not None:
        what = "device directory" if device_dir else "directory"
        assert problem.startswith(f"{UNTRUSTED}{what} /srv/colas is ")
        assert ("uid 65534" in problem) == (owner == "nobody")


def test_the_way_to_a_device_directory_is_judged_from_the_root_down() -> None:
    tmp_like = [("/", DIR | 0o755, ROOT), ("/tmp", DIR | 0o1777, ROOT), ("/tmp/t", DIR | 0o700, ROOT)]
    assert chain_problem([*tmp_like, ("/tmp/t/colas", DIR | 0o755, ROOT)], ROOT_ONLY) is None
    # The last entry is the device directory: sticky does not save it.
    assert (
        chain_problem(tmp_like[:2], ROOT_ONLY)
        == f"{UNTRUSTED}device directory /tmp is writable by group and others (mode 1777)"
    )
    open_parent = [("/", DIR | 0o755, ROOT), ("/srv", DIR | 0o777, ROOT), ("/srv/colas", DIR | 0o755, NOBODY)]
    assert (
        chain_problem(open_parent, ROOT_ONLY)
        == f"{UNTRUSTED}directory /srv is writable by group and others (mode 0777)"
    )
    delegated = [("/", DIR | 0o755, ROOT), ("/srv", DIR | 0o755, DELEGATE), ("/srv/colas", DIR | 0o750, DELEGATE)]
    assert chain_problem(delegated, TRUSTED) is None
    assert "uid 1001" in (chain_problem(delegated, ROOT_ONLY) or "")
    assert chain_problem([], ROOT_ONLY) is None


@pytest.mark.parametrize(
    ("dirs", "program", "why"),
    [
        ([("/", 0o755, ROOT), ("/usr", 0o755, ROOT)], ("/usr/probe", 0o755, ROOT), None),
        ([("/", 0o755, ROOT), ("/tmp", 0o1777, ROOT)], ("/tmp/probe", 0o755, ROOT), None),  # sticky: not swappable
        ([("/", 0o755, ROOT), ("/opt", 0o755, DELEGATE)], ("/opt/probe", 0o750, DELEGATE), None),
        ([("/", 0o755, ROOT), ("/srv", 0o777, ROOT)], ("/srv/probe", 0o755, ROOT), "directory /srv is writable"),
        ([("/", 0o755, ROOT), ("/srv", 0o755, NOBODY)], ("/srv/probe", 0o755, ROOT), "directory /srv is owned"),
        ([("/", 0o755, ROOT)], ("/probe", 0o777, ROOT), "/probe is writable by group and others"),
        ([("/", 0o755, ROOT)], ("/probe", 0o755, NOBODY), "/probe is owned by uid 65534"),
    ],
    ids=["usr", "sticky-tmp", "delegate", "open-dir", "nobody-dir", "open-file", "nobody-file"],
)
def test_a_program_run_as_root_is_judged_as_a_device_file_in_its_directories(
    dirs: list[tuple[str, int, int]], program: tuple[str, int, int], why: str | None
) -> None:
    judged = program_problem(
        [(p, DIR | m, u) for p, m, u in dirs], (program[0], FILE | program[1], program[2]), TRUSTED
    )
    assert (judged is None) == (why is None), judged
    assert judged is None or judged.startswith(f"{UNTRUSTED}{why}")


STICKY_OPEN = 0o1777


@pytest.mark.parametrize(
    ("dirs", "entries", "why"),
    [
        ([("/", 0o755, ROOT), ("/srv", 0o755, ROOT)], [("/srv/data", NOBODY, 0o755)], None),  # its own content
        ([("/", 0o755, ROOT), ("/tmp", STICKY_OPEN, ROOT)], [("/tmp/data", ROOT, STICKY_OPEN)], None),
        ([("/", 0o755, ROOT), ("/srv", 0o755, DELEGATE)], [("/srv/link", DELEGATE, 0o755)], None),
        ([("/", 0o755, ROOT), ("/srv", 0o755, ROOT)], [("/srv/link", NOBODY, 0o755)], None),  # a link is immutable
        ([("/", 0o755, ROOT), ("/srv", 0o777, ROOT)], [], "directory /srv is writable by group and others"),
        ([("/", 0o755, ROOT), ("/srv", 0o775, ROOT)], [], "directory /srv is writable by group"),
        ([("/", 0o755, ROOT), ("/home/u", 0o755, NOBODY)], [], "directory /home/u is owned by uid 65534"),
        (
            [("/", 0o755, ROOT), ("/tmp", STICKY_OPEN, ROOT)],
            [("/tmp/link", NOBODY, STICKY_OPEN)],
            "/tmp/link is owned by uid 65534, which is neither root nor in trusted_owners, in a directory",
        ),
        (
            [("/", 0o755, ROOT), ("/tmp", STICKY_OPEN, ROOT)],
            [("/tmp/data", NOBODY, STICKY_OPEN)],
            "/tmp/data is owned by uid 65534",
        ),
    ],
    ids=[
        "own-content",
        "root-entry-in-tmp",
        "delegate",
        "link-in-closed-dir",
        "open",
        "group",
        "user-dir",
        "user-link-in-tmp",
        "user-entry-in-tmp",
    ],
)
def test_the_way_to_a_host_path_is_judged_but_not_what_it_names(
    dirs: list[tuple[str, int, int]], entries: list[tuple[str, int, int]], why: str | None
) -> None:
    judged = host_path_problem([(p, DIR | m, u) for p, m, u in dirs], [(p, u, DIR | m) for p, u, m in entries], TRUSTED)
    assert (judged is None) == (why is None), judged
    assert judged is None or judged.startswith(f"{UNTRUSTED}{why}"), judged
