"""The OTLP/HTTP exporter's session: its certificate survives REQUESTS_CA_BUNDLE.

``requests`` itself merges the environment into every request (``Session.request`` calls
``merge_environment_settings``): these tests run that real code path.
"""

from __future__ import annotations

import pytest
import requests

from async_tee._http_session import MAX_RETRY_AFTER_S, ExporterSession, retry_after_s


def _verify_for(session: requests.Session) -> object:
    return session.merge_environment_settings(
        "https://collector:4318/v1/metrics", {}, None, None, None
    )["verify"]


def test_a_configured_certificate_is_not_replaced_by_requests_ca_bundle(monkeypatch, tmp_path):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    plain, ours = requests.Session(), ExporterSession()
    for session in (plain, ours):
        session.verify = str(tmp_path / "collector-ca.pem")  # what the exporter sets
    assert _verify_for(plain) == "/etc/ssl/certs/ca-certificates.crt"  # requests' own rule
    assert _verify_for(ours) == str(tmp_path / "collector-ca.pem")
    ours.verify = True  # no certificate configured: the environment's bundle applies
    assert _verify_for(ours) == "/etc/ssl/certs/ca-certificates.crt"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("-5", 0.0),
        ("1e9", MAX_RETRY_AFTER_S),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
    ],
)
def test_retry_after_values(value, expected):
    assert retry_after_s(value) == expected


def test_retry_after_as_an_http_date():
    import time
    from email.utils import formatdate

    wait = retry_after_s(formatdate(time.time() + 60, usegmt=True))
    assert wait is not None
    assert 55 <= wait <= 61
