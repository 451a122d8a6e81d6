"""`python -m colad`: the same entry point as the `colad` console script, and how supervisord starts the roles.

Its first instruction blocks SIGHUP, SIGTERM and SIGINT, before the imports and the config load that take
time: a `colad reload` or a stop in a role's first second must not kill it. Roles
keep them blocked and take them when ready (the plugin with sigwait, the watchers' SignalWaker unblocks
after installing its handlers); every other command gets them back before it runs.
"""

import signal

_STARTUP_SIGNALS = {signal.SIGHUP, signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, _STARTUP_SIGNALS)

import os  # noqa: E402  (after the mask, on purpose)
import sys  # noqa: E402

from colad.core.roles import ROLE_NAMES, ROLES  # noqa: E402

# Long-running commands for which a stop during start-up is a clean exit and SIGHUP means nothing
# (supervisord installs its own handler after exec).
DAEMON_COMMANDS = frozenset({"supervise"})


def command_of(argv: list[str]) -> str:
    """The subcommand: the first word that is not an option (flags follow it; `--version` has none)."""
    return next((word for word in argv if not word.startswith("-")), "")


def _stopped(signum: int, _frame: object) -> None:
    # A daemon told to stop before it ran exits 0, as supervisord does on SIGTERM; a tool says which
    # signal ended it. Never a traceback.
    raise SystemExit(0 if command_of(sys.argv[1:]) in DAEMON_COMMANDS else 128 + signum)


def restore_signals(command: str) -> None:
    """Give a non-role command its signals back, without dying of one that arrived meanwhile.

    The mask is inherited across exec: `colad supervise` must never hand it to supervisord. A
    SIGHUP ignored here stays ignored across exec until supervisord installs its own handler.
    """
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, _stopped)
    if command in DAEMON_COMMANDS:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STARTUP_SIGNALS)


if __name__ == "__main__":
    if nice := next((r.nice for r in ROLES if r.name == command_of(sys.argv[1:])), 0):
        try:
            os.nice(nice)
        except OSError:
            pass  # setpriority is refused by colad.service's SystemCallFilter=~@resources: run at normal priority
    # A role takes the blocked signals itself once it can act on them.
    if command_of(sys.argv[1:]) not in ROLE_NAMES:
        restore_signals(command_of(sys.argv[1:]))

    from colad.cli.main import main

    sys.exit(main())
