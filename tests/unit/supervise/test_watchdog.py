"""The watchdog's pure core (colad/supervise/watchdog.py): when a FATAL role is started again.

The back-off starts at 10 s, doubles per FATAL in a row up to 10 min, and starts over once the
role ran STABLE_AFTER; each start is handed out once. The glue inside supervisord is tested
under the real supervisord (tests/e2e/test_watchdog_inprocess.py).
"""

from __future__ import annotations

import pytest

from colad.supervise.watchdog import BACKOFF_FIRST, RESTART_BACKOFF_MAX, STABLE_AFTER, Watchdog, raised_at

pytestmark = pytest.mark.unit
ROLE = "colad:discovery"


def fatal_then_due(core: Watchdog, now: float) -> float:
    """FATAL at `now`; returns how long until the core hands the start out (searched in 0.5 s steps)."""
    core.fatal(ROLE, now)
    step = 0.0
    while not core.due(now + step):
        step += 0.5
        assert step <= RESTART_BACKOFF_MAX + 1
    return step


def test_the_backoff_doubles_per_fatal_in_a_row_up_to_its_cap() -> None:
    core, now, delays = Watchdog(), 1000.0, []
    for _ in range(9):
        delays.append(fatal_then_due(core, now))
        now += delays[-1] + 2  # started again, FATAL again within seconds
        core.running(ROLE, now - 1)  # even a short RUNNING keeps the count
    assert delays == [10, 20, 40, 80, 160, 320, 600, 600, 600]
    assert delays[0] == BACKOFF_FIRST


def test_the_decision_is_described_in_one_line() -> None:
    core = Watchdog()
    assert core.fatal(ROLE, 0.0) == "colad:discovery in 10s (FATAL 1 in a row)"
    assert core.fatal(ROLE, 11.0) == "colad:discovery in 20s (FATAL 2 in a row)"


@pytest.mark.parametrize(("ran", "expected"), [(STABLE_AFTER, 10), (STABLE_AFTER - 1, 40)], ids=["stable", "short"])
def test_a_role_that_ran_stable_after_starts_the_backoff_over(ran: float, expected: float) -> None:
    core = Watchdog()
    fatal_then_due(core, 0.0)
    fatal_then_due(core, 20.0)
    core.running(ROLE, 100.0)
    assert fatal_then_due(core, 100.0 + ran) == expected


def test_each_start_is_handed_out_once_and_roles_are_independent() -> None:
    core = Watchdog()
    core.fatal("colad:discovery", 0.0)
    core.fatal("colad:kubelet-watch", 5.0)
    assert core.due(9.9) == []
    assert core.due(10.0) == ["colad:discovery"]
    assert core.due(100.0) == ["colad:kubelet-watch"]
    assert core.due(1000.0) == []


def test_pending_lists_the_coming_starts_with_xmlrpc_values() -> None:
    core = Watchdog()
    assert core.pending(0.0) == []
    core.fatal(ROLE, 0.0)
    core.running("colad:plugin", 0.0)  # running roles have nothing pending
    assert core.pending(2.5) == [{"name": ROLE, "in_s": 7.5, "fatal_in_a_row": 1}]
    core.due(10.0)
    assert core.pending(10.0) == []


def test_where_names_the_raising_line_without_a_traceback() -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        where = raised_at(exc)
    assert where.startswith("test_watchdog.py:") and "\n" not in where
    assert raised_at(ValueError("never raised")) == "-"


def test_the_entry_point_an_installed_supervisord_conf_names_still_resolves() -> None:
    """An upgraded .deb keeps /etc/colad/supervisord.conf (a conffile), which names the watchdog's
    entry point of before the package layout; supervisord resolves it as the new one."""
    from supervisor.options import ServerOptions  # noqa: PLC0415 - supervisord's own resolver

    old = ServerOptions().import_spec("colad.watchdog:make_rpcinterface")
    assert old is ServerOptions().import_spec("colad.supervise.watchdog:make_rpcinterface")
