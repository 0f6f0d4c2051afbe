"""AUTH is on by default: a tier without auth.secretRef gets a generated token Secret, wired as a user's is."""

from __future__ import annotations

from typing import Any

import yaml
from strata_kv.config import CONFIG_FILE_NAME
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.auth import generated_token, token_secret
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.runtime_image import RuntimeImage

TIER = TierRef("kv", "serving", "tier-uid", 1)
RUNTIME = RuntimeImage("registry.local/strata-runtime:test")


def wiring(auth: dict[str, Any] | None) -> tuple[Any, dict[str, Any], dict[str, str], Any]:
    """(token_file in the server config, the auth volume or None, the connection env, the secret ref)."""
    spec = KVCacheTierSpec.model_validate({} if auth is None else {"auth": auth})
    children = build_children(spec, TIER, RUNTIME)
    config = yaml.safe_load(children.config_map["data"][CONFIG_FILE_NAME])
    volumes = children.daemonset["spec"]["template"]["spec"]["volumes"]
    volume = next((v for v in volumes if v["name"] == "auth"), None)
    return config.get("auth", {}).get("token_file"), volume, children.connection["data"], token_secret(spec, TIER)


def test_without_auth_the_generated_secret_is_mounted_and_named_to_clients() -> None:
    token_file, volume, env, _ = wiring(None)
    assert token_file == "/var/run/secrets/strata-kv/token"
    assert volume is not None and volume["secret"]["secretName"] == "kv-kv-token"
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert (env["STRATA_KV_AUTH_SECRET"], env["STRATA_KV_AUTH_SECRET_KEY"]) == ("kv-kv-token", "token")


def test_a_users_secret_is_wired_the_same_way() -> None:
    token_file, volume, env, ref = wiring({"secretRef": {"name": "mine", "key": "password"}})
    assert token_file == "/var/run/secrets/strata-kv/token" and not ref.generated
    assert volume is not None and volume["secret"]["secretName"] == "mine"
    assert volume["secret"]["items"] == [{"key": "password", "path": "token"}]
    assert (env["STRATA_KV_AUTH_SECRET"], env["STRATA_KV_AUTH_SECRET_KEY"]) == ("mine", "password")


def test_auth_disabled_runs_open_servers() -> None:
    token_file, volume, env, ref = wiring({"disabled": True})
    assert token_file is None and volume is None and ref is None
    assert "STRATA_KV_AUTH_SECRET" not in env


def test_the_generated_secret_is_owned_immutable_and_holds_the_token() -> None:
    secret = generated_token(TIER).secret("t" * 43)
    assert secret["metadata"]["name"] == "kv-kv-token"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "tier-uid"
    assert secret["immutable"] is True and secret["stringData"] == {"token": "t" * 43}


def test_a_new_generated_token_rolls_the_servers() -> None:
    spec = KVCacheTierSpec()

    def template_hash(version: str | None) -> str:
        daemonset = build_children(spec, TIER, RUNTIME, token_version=version).daemonset
        return str(daemonset["spec"]["template"]["metadata"]["annotations"]["strata.dev/config-hash"])

    assert template_hash("uid-1") == template_hash("uid-1") != template_hash("uid-2")
