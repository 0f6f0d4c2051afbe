"""What a Hub refusal becomes: one line naming the repository and what to change.

The gated and token cases cannot run against a server here: olah, the Hub-compatible server the integration
tests use, never checks tokens (see `strata_testsupport.hub`). So these tests stand in for the Hub with HTTP
responses carrying the status and `X-Error-Code`/`X-Error-Message` headers the Hub sends for each case, and
put them through huggingface_hub's own `hf_raise_for_status` (the real classification) and then the loader's
translation. The missing-repository and unreachable-endpoint cases run against olah in
`loader/tests/integration/test_hub.py`.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from huggingface_hub.utils import hf_raise_for_status
from strata_loader.fetch.hub import HubError, _hub_errors

URL = "http://127.0.0.1:9/api/models/acme/llama/revision/main"


def refusal(status: int, code: str | None, message: str) -> None:
    """Raise what huggingface_hub raises for this answer of the Hub."""
    http = _http_package()
    headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
    hf_raise_for_status(http.Response(status, headers=headers, request=http.Request("GET", URL)))


def _http_package() -> Any:
    """huggingface_hub's HTTP client package (httpx, later httpx2), whose responses its errors read."""
    from huggingface_hub.utils import get_session

    return importlib.import_module(type(get_session()).__module__.split(".")[0])


def explained(status: int, code: str | None, message: str, revision: str = "main") -> str:
    with pytest.raises(HubError) as err, _hub_errors("acme/llama", revision):
        refusal(status, code, message)
    text = str(err.value)
    assert "\n" not in text and "hf://acme/llama" in text
    return text


@pytest.fixture
def anonymous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture
def with_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


def test_gated_repo_without_a_token_says_to_set_one(anonymous: None) -> None:
    text = explained(401, "GatedRepo", "Access to model acme/llama is restricted. You must be authenticated.")
    assert "gated" in text and "set HF_TOKEN" in text and "secretRef" in text


def test_gated_repo_whose_token_has_no_access_says_to_accept_the_terms(with_token: None) -> None:
    text = explained(403, "GatedRepo", "Access to model acme/llama is restricted and you are not in the list.")
    assert "gated" in text and "accept the model's terms" in text


def test_a_refused_token_says_to_replace_it(with_token: None) -> None:
    text = explained(401, None, "Invalid credentials in Authorization header")
    assert "401" in text and "HF_TOKEN was refused" in text and "replace it" in text


def test_missing_revision_names_the_field(anonymous: None) -> None:
    text = explained(404, "RevisionNotFound", "Invalid rev id: v9", revision="v9")
    assert "no revision 'v9'" in text and "source.revision" in text


def test_missing_or_private_repo_without_a_token_mentions_both(anonymous: None) -> None:
    text = explained(401, "RepoNotFound", "Repository not found")
    assert "no such repository" in text and "source.uri" in text and "HF_TOKEN" in text


def test_missing_repo_with_a_token_says_the_token_cannot_see_it(with_token: None) -> None:
    text = explained(404, "RepoNotFound", "Repository not found")
    assert "HF_TOKEN cannot see it" in text


def test_a_server_error_names_the_endpoint(anonymous: None) -> None:
    assert "HTTP 503 from http://127.0.0.1:9" in explained(503, None, "overloaded")
