"""The certificate the operator keeps for its webhook (`webhook_tls`): what it issues verifies as a server
certificate for the Service's names, a rotation keeps trusting the previous CA, and renewal is due exactly when
it should be. The settings that turn it on are checked at start with the variable's name."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from strata_operator.settings import Settings
from strata_operator.webhook.certificates import from_secret, issue, renewal_reason, service_names

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
NAMES = service_names("strata-system", "strata-webhook")


def test_an_issued_certificate_serves_every_service_name_and_is_signed_by_the_bundle() -> None:
    tls = issue(NAMES, NOW)
    cert = tls.certificate
    (ca,) = x509.load_pem_x509_certificates(tls.trusted_pem)
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == NAMES
    assert "strata-webhook.strata-system.svc" in NAMES
    assert cert.not_valid_after_utc == NOW + datetime.timedelta(days=365)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert renewal_reason(tls, NAMES, NOW) is None
    assert base64.b64decode(tls.ca_bundle) == tls.trusted_pem


def test_renewal_is_due_in_the_last_third_for_other_names_or_without_a_certificate() -> None:
    tls = issue(NAMES, NOW, datetime.timedelta(days=90))
    assert renewal_reason(tls, NAMES, NOW + datetime.timedelta(days=59)) is None
    due = renewal_reason(tls, NAMES, NOW + datetime.timedelta(days=61))
    assert due is not None and "expires" in due
    other = renewal_reason(tls, service_names("elsewhere", "strata-webhook"), NOW)
    assert other is not None and "strata-webhook.elsewhere.svc" in other
    assert renewal_reason(None, NAMES, NOW) == "the Secret holds no certificate yet"


def test_a_rotation_trusts_the_new_ca_first_and_the_previous_one_while_it_is_valid() -> None:
    old = issue(NAMES, NOW, datetime.timedelta(days=30))
    new = issue(NAMES, NOW + datetime.timedelta(days=25), previous=old)
    first, second = x509.load_pem_x509_certificates(new.trusted_pem)
    new.certificate.verify_directly_issued_by(first)
    old.certificate.verify_directly_issued_by(second)
    later = issue(NAMES, NOW + datetime.timedelta(days=40), previous=old)  # the old CA has expired by then
    assert len(x509.load_pem_x509_certificates(later.trusted_pem)) == 1
    twice = issue(NAMES, NOW + datetime.timedelta(days=26), previous=new)
    assert len(x509.load_pem_x509_certificates(twice.trusted_pem)) == 2, "only one previous CA is carried"


def test_a_secret_round_trips_and_an_empty_or_damaged_one_holds_nothing() -> None:
    tls = issue(NAMES, NOW)
    assert from_secret(tls.secret_data()) == tls
    assert from_secret(None) is None and from_secret({}) is None, "the chart renders the Secret empty"
    damaged = dict(tls.secret_data(), **{"tls.crt": base64.b64encode(b"not a certificate").decode()})
    assert from_secret(damaged) is None
    mismatched = dict(tls.secret_data(), **{"tls.key": issue(NAMES, NOW).secret_data()["tls.key"]})
    assert from_secret(mismatched) is None, "a key that does not match the certificate is no pair"


def test_settings_turn_it_on_and_name_the_variable_they_refuse() -> None:
    env = {
        "STRATA_WEBHOOK_TLS_SECRET": "strata-system/strata-webhook-tls",
        "STRATA_WEBHOOK_SERVICE": "strata-system/strata-webhook",
        "STRATA_WEBHOOK_CONFIGURATIONS": "MutatingWebhookConfiguration/a, ValidatingWebhookConfiguration/b",
    }
    kept = Settings.from_env(env).webhook_tls
    assert kept is not None and kept.secret == ("strata-system", "strata-webhook-tls")
    assert kept.configurations == (("MutatingWebhookConfiguration", "a"), ("ValidatingWebhookConfiguration", "b"))
    assert kept.validity_days == 365 and Settings.from_env({}).webhook_tls is None
    with pytest.raises(ValueError, match="STRATA_WEBHOOK_SERVICE"):
        Settings.from_env({**env, "STRATA_WEBHOOK_SERVICE": "no-namespace"})
    with pytest.raises(ValueError, match="STRATA_WEBHOOK_CONFIGURATIONS"):
        Settings.from_env({**env, "STRATA_WEBHOOK_CONFIGURATIONS": "Secret/x"})
    with pytest.raises(ValueError, match="STRATA_WEBHOOK_CERT_VALIDITY_DAYS"):
        Settings.from_env({**env, "STRATA_WEBHOOK_CERT_VALIDITY_DAYS": "0"})
