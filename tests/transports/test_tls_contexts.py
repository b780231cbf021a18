"""TLS contexts made once per process for each set of certificate files
(netq/transports/tls_contexts.py): the same files give the same context, a changed file a new
one, a file that cannot be loaded fails every time, and the cache stays bounded."""

from __future__ import annotations

import os
import shutil
import ssl

import pytest

from netq import SecurityOptions
from netq.transports import tls_contexts

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _fresh():
    tls_contexts.forget()
    yield
    tls_contexts.forget()


def _client(tls_files) -> SecurityOptions:
    return SecurityOptions(certificate=tls_files.ca)


def _server(tls_files) -> SecurityOptions:
    return SecurityOptions(certificate=tls_files.server_cert, key=tls_files.server_key)


def test_the_same_files_give_the_same_context_per_role(tls_files):
    client = tls_contexts.tls_context(False, _client(tls_files))
    assert tls_contexts.tls_context(False, _client(tls_files)) is client
    server = tls_contexts.tls_context(True, _server(tls_files))
    assert tls_contexts.tls_context(True, _server(tls_files)) is server
    assert server is not client
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert server.num_tickets == 0
    assert client.minimum_version == server.minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_rewritten_certificate_makes_a_new_context(tls_files, tmp_path):
    ca = tmp_path / "ca.pem"
    shutil.copy(tls_files.ca, ca)
    before = tls_contexts.tls_context(False, SecurityOptions(certificate=ca))
    stat = os.stat(ca)
    os.utime(ca, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rotated in place
    after = tls_contexts.tls_context(False, SecurityOptions(certificate=ca))
    assert after is not before
    assert tls_contexts.tls_context(False, SecurityOptions(certificate=ca)) is after


def test_a_file_that_cannot_be_loaded_fails_every_time(tmp_path):
    missing = SecurityOptions(certificate=tmp_path / "absent.pem")
    for _ in range(2):
        with pytest.raises(OSError):
            tls_contexts.tls_context(False, missing)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    for _ in range(2):
        with pytest.raises(ssl.SSLError):
            tls_contexts.tls_context(False, SecurityOptions(certificate=garbage))


def test_at_most_KEPT_contexts_are_kept_least_recently_used_first(tls_files, tmp_path):
    copies = []
    for index in range(tls_contexts.KEPT + 1):
        ca = tmp_path / f"ca{index}.pem"
        shutil.copy(tls_files.ca, ca)
        copies.append(SecurityOptions(certificate=ca))
    first = tls_contexts.tls_context(False, copies[0])
    second = tls_contexts.tls_context(False, copies[1])
    for security in copies[2:tls_contexts.KEPT]:
        tls_contexts.tls_context(False, security)
    assert tls_contexts.tls_context(False, copies[0]) is first  # used again: now the newest
    tls_contexts.tls_context(False, copies[tls_contexts.KEPT])  # one over: the oldest goes
    assert len(tls_contexts._kept) == tls_contexts.KEPT
    assert tls_contexts.tls_context(False, copies[0]) is first
    assert tls_contexts.tls_context(False, copies[1]) is not second  # dropped: made again
    assert len(tls_contexts._kept) == tls_contexts.KEPT
