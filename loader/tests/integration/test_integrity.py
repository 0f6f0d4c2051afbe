"""F8: damage to DEST after a fetch completed is seen: `verify` checks what the manifest recorded (sizes always,
checksums when recorded, sizes only with --fast), and a re-run of `fetch` confirms every file before it trusts
the manifest, fetching again what is missing or the wrong size (or, with --verify checksums, altered)."""

import json
from pathlib import Path

import pytest
from strata_loader.contract import MANIFEST_NAME, FetchRequest, VerifyMode
from strata_loader.fetch.run import fetch

from .test_fetch_local import make_model, run_cli, tree

pytestmark = pytest.mark.integration

BIG = "original/consolidated.pth"
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def fetched(tmp_path):
    """A model fetched with checksums recorded; returns (request, source files, DEST)."""
    files = make_model(tmp_path / "src", big=2**20)
    req = FetchRequest(source=str(tmp_path / "src"), dest=str(tmp_path / "dst"), verify=VerifyMode.CHECKSUMS)
    fetch(req, progress_mode="none")
    return req, files, tmp_path / "dst"


def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def assert_one_line_failure(r, *needles: str) -> None:
    assert r.returncode == 1, r.stdout
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


# --- verify ---------------------------------------------------------------------------------------------------


def test_verify_passes_on_an_intact_copy_in_both_modes(fetched):
    _, _, dst = fetched
    for extra in ([], ["--fast"]):
        r = run_cli("verify", *extra, str(dst))
        assert r.returncode == 0, r.stderr
        assert "4 file(s) match their manifest" in r.stdout


@pytest.mark.parametrize("victim", [BIG, SHARD])
def test_verify_sees_one_flipped_data_byte_but_fast_only_checks_sizes(fetched, victim):
    _, _, dst = fetched
    flip_byte(dst / victim)  # the last byte: tensor data, the safetensors header stays valid
    assert_one_line_failure(run_cli("verify", str(dst)), f"{dst / victim}: content differs: sha256 ")
    r = run_cli("verify", "--fast", str(dst))
    assert r.returncode == 0 and "(sizes)" in r.stdout, r.stderr


def test_verify_sees_a_deleted_file_even_when_fast(fetched):
    _, _, dst = fetched
    (dst / "config.json").unlink()
    for extra in ([], ["--fast"]):
        assert_one_line_failure(run_cli("verify", *extra, str(dst)), f"{dst / 'config.json'}: missing")


def test_verify_sees_a_wrong_size_and_counts_the_other_damage(fetched):
    _, files, dst = fetched
    with open(dst / "config.json", "ab") as f:
        f.write(b"\0")
    (dst / BIG).unlink()
    n = len(files["config.json"])
    r = run_cli("verify", "--fast", str(dst))
    assert_one_line_failure(
        r, f"config.json: {n + 1} bytes, the manifest says {n} (and 1 more file(s) differ)", "re-run fetch"
    )


def test_verify_sees_a_file_replaced_by_a_link(fetched):
    _, _, dst = fetched
    (dst / "config.json").rename(dst / "elsewhere.json")
    (dst / "config.json").symlink_to("elsewhere.json")
    assert_one_line_failure(run_cli("verify", "--fast", str(dst)), "config.json: a symlink")


def test_verify_refuses_a_manifest_with_a_dirty_path(fetched):
    _, _, dst = fetched
    m = json.loads((dst / MANIFEST_NAME).read_text())
    m["files"][0]["path"] = "../../etc/passwd"
    (dst / MANIFEST_NAME).write_text(json.dumps(m))
    assert_one_line_failure(run_cli("verify", str(dst)), "not a valid manifest", "'..' segment")


# --- fetch re-runs --------------------------------------------------------------------------------------------


def test_rerun_fetches_a_deleted_file_again_and_rewrites_the_manifest(fetched):
    req, files, dst = fetched
    (dst / BIG).unlink()
    res = fetch(req, progress_mode="none")
    got = tree(dst)
    got.pop(MANIFEST_NAME)
    assert got == files
    assert res.bytes_resumed == res.bytes - len(files[BIG])
    assert run_cli("verify", str(dst)).returncode == 0


def test_rerun_fetches_a_truncated_or_grown_file_again(fetched):
    req, files, dst = fetched
    (dst / BIG).write_bytes(files[BIG][:1000])
    with open(dst / "config.json", "ab") as f:
        f.write(b" ")
    res = fetch(req.model_copy(update={"verify": VerifyMode.SIZES}), progress_mode="none")
    assert (dst / BIG).read_bytes() == files[BIG] and (dst / "config.json").read_bytes() == files["config.json"]
    assert res.bytes_resumed == res.bytes - len(files[BIG]) - len(files["config.json"])


def test_rerun_with_checksums_repairs_a_flipped_byte(fetched):
    req, files, dst = fetched
    flip_byte(dst / BIG, 12345)
    res = fetch(req, progress_mode="none")
    assert (dst / BIG).read_bytes() == files[BIG]
    assert res.bytes_resumed == res.bytes - len(files[BIG])
    assert run_cli("verify", str(dst)).returncode == 0


def test_rerun_with_sizes_trusts_an_intact_looking_copy_without_hashing(fetched):
    """Sizes are the cheap check a re-run always makes; content damage needs --verify checksums (or verify)."""
    req, _, dst = fetched
    flip_byte(dst / BIG)
    before = (dst / MANIFEST_NAME).stat().st_mtime_ns
    res = fetch(req.model_copy(update={"verify": VerifyMode.SIZES}), progress_mode="none")
    assert res.bytes_resumed == res.bytes
    assert (dst / MANIFEST_NAME).stat().st_mtime_ns == before


def test_cli_rerun_says_what_it_repairs_and_succeeds(fetched, tmp_path):
    req, files, dst = fetched
    (dst / "config.json").unlink()
    term = tmp_path / "termination-log"
    r = run_cli(*req.to_args(), env={"STRATA_TERMINATION_MESSAGE_PATH": str(term), "STRATA_PROGRESS": "none"})
    assert r.returncode == 0, r.stderr
    assert f"{dst / 'config.json'}: missing; fetching it again" in r.stderr
    assert json.loads(term.read_text())["status"] == "Succeeded"
    assert (dst / "config.json").read_bytes() == files["config.json"]
