"""`strata-loader pack --to` against a real registry (distribution's, over HTTPS): what it stores is what was
packed, a second tag that changes only `config.json` uploads one small layer (counted from the registry's own
log), and basic auth is enforced both ways."""

from __future__ import annotations

import hashlib
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest
from strata_loader.pack import vocabulary as v
from strata_testsupport.models import write_raw_model as write_model

pytestmark = pytest.mark.integration


def run_pack(registry, source: Path, reference: str, *extra: str, password: str | None = None):
    env = {**os.environ}
    env.pop("STRATA_REGISTRY_PASSWORD", None)
    if password is not None:
        env["STRATA_REGISTRY_PASSWORD"] = password
    argv = [sys.executable, "-m", "strata_loader.cli", "pack", str(source), "--to", reference, *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def pushed(registry, source: Path, repository: str, tag: str) -> dict:
    result = run_pack(registry, source, registry.reference(repository, tag), *registry.pack_args())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def get(registry, path: str, accept: str | None = None) -> tuple[bytes, str]:
    request = urllib.request.Request(f"https://{registry.address}{path}", headers={"Accept": accept} if accept else {})
    context = ssl.create_default_context(cafile=str(registry.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return response.read(), response.headers.get("Docker-Content-Digest", "")


def test_a_second_tag_differing_in_config_json_uploads_one_small_layer(registry, tmp_path):
    repository = "models/tiny-config"
    files = write_model(tmp_path / "v1")
    write_model(tmp_path / "v2", config='{"model_type": "tiny", "rope_theta": 500000}')

    first = pushed(registry, tmp_path / "v1", repository, "v1")
    uploads_v1 = registry.uploaded_blobs(repository)
    layers_v1 = [layer["digest"] for layer in first["layers"]]
    assert set(layers_v1) <= set(uploads_v1)
    assert len(uploads_v1) == len(layers_v1) + 2  # and one config per platform
    assert first["uploaded"]["blobs"] == len(uploads_v1)

    second = pushed(registry, tmp_path / "v2", repository, "v2")
    new_uploads = registry.uploaded_blobs(repository)[len(uploads_v1) :]
    new_layers = [d for d in new_uploads if d in {layer["digest"] for layer in second["layers"]}]
    small = second["layers"][-1]
    assert new_layers == [small["digest"]]
    assert small["digest"] not in layers_v1 and small["size"] < 64 * 2**10
    assert len(new_uploads) == 1 + 2  # the small layer, two configs; every weight layer was already there
    assert second["present"]["blobs"] == len(layers_v1) - 1
    print(json.dumps({"tag v1 uploads": len(uploads_v1), "tag v2 uploads": len(new_uploads), "small": small}))

    again = pushed(registry, tmp_path / "v1", repository, "v1-again")
    assert again["digest"] == first["digest"]
    assert again["uploaded"]["blobs"] == 0
    assert len(files) == 4


def test_what_the_registry_holds_is_what_was_packed(registry, tmp_path):
    repository = "models/tiny-readback"
    files = write_model(tmp_path / "m")
    summary = pushed(registry, tmp_path / "m", repository, "v1")
    index, digest = get(registry, f"/v2/{repository}/manifests/v1", v.MEDIA_TYPE_INDEX)
    assert digest == summary["digest"] == f"sha256:{hashlib.sha256(index).hexdigest()}"
    assert summary["reference"] == f"{registry.address}/{repository}:v1@{digest}"
    amd64 = next(m for m in json.loads(index)["manifests"] if m["platform"]["architecture"] == "amd64")
    manifest, _ = get(registry, f"/v2/{repository}/manifests/{amd64['digest']}", v.MEDIA_TYPE_MANIFEST)
    found: dict[str, bytes] = {}
    for layer in json.loads(manifest)["layers"]:
        blob, _ = get(registry, f"/v2/{repository}/blobs/{layer['digest']}")
        assert f"sha256:{hashlib.sha256(blob).hexdigest()}" == layer["digest"]
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            for member in tar:
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    found[member.name.removeprefix("models/")] = extracted.read()
    assert found == files


def test_basic_auth_is_needed_and_checked(registry_with_auth, tmp_path):
    write_model(tmp_path / "m")
    reference = registry_with_auth.reference("models/private", "v1")
    trust = ["--ca-file", str(registry_with_auth.ca_file)]

    anonymous = run_pack(registry_with_auth, tmp_path / "m", reference, *trust)
    assert anonymous.returncode == 1
    assert "requires credentials: pass --username and the password" in anonymous.stderr

    wrong = run_pack(registry_with_auth, tmp_path / "m", reference, *registry_with_auth.pack_args(), password="nope")
    assert wrong.returncode == 1
    assert "refused the credentials" in wrong.stderr

    right = run_pack(
        registry_with_auth,
        tmp_path / "m",
        reference,
        *registry_with_auth.pack_args(),
        password=registry_with_auth.password,
    )
    assert right.returncode == 0, right.stderr
    assert json.loads(right.stdout)["event"] == "pushed"


def test_a_registry_whose_certificate_is_not_trusted_is_refused(registry, tmp_path):
    write_model(tmp_path / "m")
    result = run_pack(registry, tmp_path / "m", registry.reference("models/untrusted", "v1"))
    assert result.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr
