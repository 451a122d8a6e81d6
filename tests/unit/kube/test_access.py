"""Unit tests for colad.kube.access: what a kubeconfig yields, and what it refuses."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from colad.kube.access import REREAD_SECONDS, Access, Credentials, from_kubeconfig
from colad.kube.errors import KubeconfigError

pytestmark = pytest.mark.unit


def kubeconfig(tmp_path: Path, cluster: dict[str, object], user: dict[str, object], **top: object) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "main", "context": {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c"}},
        ],
        **top,
    }
    path = tmp_path / "config"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_current_context_gives_the_server_and_files_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path, {"certificate-authority": "ca.crt"}, {"client-certificate": "/abs/c.crt", "client-key": "k"}
    )
    access = from_kubeconfig(path)
    assert access.server == "https://10.0.0.1:6443"
    assert access.ca_file == str(tmp_path / "ca.crt") and access.cert_file == "/abs/c.crt"
    assert access.key_file == str(tmp_path / "k")


def test_inline_data_is_decoded_and_another_context_can_be_chosen(tmp_path: Path) -> None:
    data = base64.b64encode(b"PEM").decode()
    path = kubeconfig(tmp_path, {"certificate-authority-data": data}, {"token": "abc"})
    assert from_kubeconfig(path).ca_data == b"PEM"
    assert from_kubeconfig(path).token == "abc"
    assert from_kubeconfig(path, context="other").token == ""


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({"insecure-skip-tls-verify": True}, {}, "insecure-skip-tls-verify is refused"),
        ({}, {"exec": {"command": "aws"}}, "exec is not supported"),
        ({}, {"auth-provider": {"name": "oidc"}}, "auth-provider is not supported"),
        ({}, {"client-certificate": "c.crt"}, "needs its key"),
        ({"server": "http://10.0.0.1"}, {}, "not an https:// URL"),
        ({"certificate-authority-data": "%%%"}, {}, "not base64"),
    ],
)
def test_what_a_kubeconfig_may_not_ask_for_is_refused(
    tmp_path: Path, cluster: dict[str, object], user: dict[str, object], message: str
) -> None:
    with pytest.raises(KubeconfigError, match=message):
        from_kubeconfig(kubeconfig(tmp_path, cluster, user))


def test_insecure_is_accepted_when_asked_for_and_then_verifies_nothing(tmp_path: Path) -> None:
    access = from_kubeconfig(kubeconfig(tmp_path, {"insecure-skip-tls-verify": True}, {}), allow_insecure=True)
    assert access.insecure
    assert not Credentials(access).ssl_context().check_hostname


def test_a_missing_context_or_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="no context named 'absent'"):
        from_kubeconfig(kubeconfig(tmp_path, {}, {}), context="absent")
    with pytest.raises(KubeconfigError, match="no current-context"):
        from_kubeconfig(kubeconfig(tmp_path, {}, {}, **{"current-context": ""}))
    with pytest.raises(KubeconfigError, match="kubeconfig .*missing"):
        from_kubeconfig(str(tmp_path / "missing"))


def test_a_token_file_is_read_again_only_when_it_changes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    credentials = Credentials(from_kubeconfig(kubeconfig(tmp_path, {}, {"tokenFile": "token"})))
    assert credentials.token() == "one"
    replacement = tmp_path / "token.next"
    replacement.write_text("two")
    replacement.replace(token)
    assert credentials.token() == "two"


def rewrite_keeping_stat(path: Path, text: str) -> None:
    """Change a file's content so that its stat (inode, size, times) stays what it was."""
    stat = path.stat()
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_token_file_is_read_again_once_a_minute_and_after_a_refusal(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("aaaa")
    now = [100.0]
    credentials = Credentials(Access(server="https://10.0.0.1", token_file=str(token)), clock=lambda: now[0])
    assert credentials.token() == "aaaa"
    rewrite_keeping_stat(token, "bbbb")
    now[0] += REREAD_SECONDS - 1
    assert credentials.token() == "aaaa"  # its stat says unchanged, and it was read less than a minute ago
    now[0] += 1
    assert credentials.token() == "bbbb"
    rewrite_keeping_stat(token, "cccc")
    credentials.refresh()  # the server answered 401
    assert credentials.token() == "cccc"


def test_a_rewritten_kubeconfig_gives_the_next_call_its_access(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {}, {"token": "one"})
    credentials = Credentials(from_kubeconfig(path), kubeconfig=path)
    assert credentials.token() == "one"
    (tmp_path / "token").write_text("from-file\n")
    kubeconfig(tmp_path, {"server": "https://10.0.0.2:6443"}, {"tokenFile": "token"})
    assert credentials.token() == "from-file"
    assert credentials.access.server == "https://10.0.0.2:6443"


def test_a_kubeconfig_caught_half_written_fails_that_call_and_is_read_again_on_the_next(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {}, {"token": "one"})
    credentials = Credentials(from_kubeconfig(path), kubeconfig=path)
    assert credentials.token() == "one"
    whole = Path(path).read_text()
    Path(path).write_text(whole[: len(whole) // 2])
    with pytest.raises(KubeconfigError, match="kubeconfig"):
        credentials.token()
    kubeconfig(tmp_path, {}, {"token": "two"})
    assert credentials.token() == "two"
