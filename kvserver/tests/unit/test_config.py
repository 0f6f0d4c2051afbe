"""The config model is the contract with the operator: sizes, defaults, YAML round trip, validation."""

import pytest
from pydantic import ValidationError
from strata_kv.config import CONFIG_FILE_NAME, EvictionPolicyName, KVServerConfig, L1Config


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1GiB", 1024**3), ("512Mi", 512 * 1024**2), ("1500M", 1_500_000_000), ("4096", 4096), (" 2 KiB ", 2048)],
)
def test_sizes_accept_binary_decimal_and_kubernetes_units(text: str, expected: int) -> None:
    size = L1Config(size=text).size
    assert size == expected and L1Config(size=size).size is size


@pytest.mark.parametrize("bad", ["1 gigabyte", "-5", "GiB", "", True, "1.5G", "1.5Gi", "500m", "1g", -1, 1.0])
def test_unreadable_sizes_are_rejected_with_a_hint(bad: object) -> None:
    with pytest.raises(ValueError):
        L1Config(size=bad)


def test_yaml_round_trip_keeps_every_field() -> None:
    cfg = KVServerConfig.model_validate(
        {
            "l1": {"size": "2GiB", "eviction_policy": "lru"},
            "l2": {"fs": {"root_dir": "/cache", "capacity": "10Gi"}, "s3": {"bucket": "kv", "prefix": "p/"}},
            "namespace": {"model": "meta/llama", "layout": {"block_size": 16}},
        }
    )
    again = KVServerConfig.from_yaml(cfg.to_yaml())
    assert again == cfg
    assert again.l1.size == 2 * 1024**3
    assert again.l1.eviction_policy is EvictionPolicyName.LRU


def test_defaults_are_scan_resistant_and_start_without_a_file() -> None:
    cfg = KVServerConfig()
    assert cfg.l1.eviction_policy is EvictionPolicyName.PREFIX_LIRS
    assert CONFIG_FILE_NAME.endswith(".yaml")


def test_watermarks_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="low_watermark"):
        KVServerConfig.model_validate({"l2": {"fs": {"root_dir": "/c", "high_watermark": 0.5, "low_watermark": 0.6}}})


def test_unknown_fields_are_refused_so_typos_surface() -> None:
    with pytest.raises(ValidationError):
        KVServerConfig.model_validate({"l1": {"sise": "1GiB"}})


def test_namespace_digest_changes_with_hash_seed() -> None:
    a = KVServerConfig.model_validate({"namespace": {"model": "m/x", "hash_seed": "1"}}).namespace
    b = KVServerConfig.model_validate({"namespace": {"model": "m/x", "hash_seed": "2"}}).namespace
    assert a.digest != b.digest
    assert a.directory_name.startswith("m_x_") and len(a.digest) == 12


def test_the_output_limit_must_leave_room_for_the_largest_value() -> None:
    with pytest.raises(ValidationError, match="a GET of the largest value would close the connection"):
        KVServerConfig.model_validate({"limits": {"max_output_buffer": "1MiB", "max_value_size": "2MiB"}})
    assert KVServerConfig.model_validate({"limits": {"max_output_buffer": 0}}).limits.max_output_buffer == 0
    older = KVServerConfig.model_validate({"limits": {"max_value_size": "2GiB"}})  # written before the limit
    assert older.limits.max_output_buffer == 4 * 1024**3
    assert KVServerConfig.from_yaml(older.to_yaml()) == older


def test_a_standalone_server_listens_on_loopback_unless_told_otherwise() -> None:
    cfg = KVServerConfig()
    assert (cfg.listen.bind, cfg.metrics.bind) == ("127.0.0.1", "127.0.0.1")
    cfg = KVServerConfig.model_validate({"listen": {"bind": "0.0.0.0"}, "metrics": {"bind": "0.0.0.0"}})
    assert (cfg.listen.bind, cfg.metrics.bind) == ("0.0.0.0", "0.0.0.0")


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o661, 0o770, 0o4660])
def test_a_unix_socket_mode_granting_others_or_execute_is_refused(mode: int) -> None:
    with pytest.raises(ValidationError, match="0660"):
        KVServerConfig.model_validate({"listen": {"unix_socket": "/run/kv.sock", "unix_socket_mode": mode}})


@pytest.mark.parametrize("mode", [0o660, 0o600, 0o640])
def test_owner_and_group_socket_modes_are_accepted(mode: int) -> None:
    assert KVServerConfig.model_validate({"listen": {"unix_socket_mode": mode}}).listen.unix_socket_mode == mode


def test_the_inflight_budget_defaults_to_a_share_of_l1_with_a_floor() -> None:
    assert KVServerConfig.model_validate({"l1": {"size": "4GiB"}}).inflight_budget == 4 * 1024**3 // 20
    assert KVServerConfig.model_validate({"l1": {"size": "64MiB"}}).inflight_budget == 64 * 1024**2
    cfg = KVServerConfig.model_validate({"limits": {"max_inflight_bytes": "1GiB"}})
    assert cfg.inflight_budget == 1024**3


def test_shared_memory_needs_the_unix_socket_it_is_handed_over() -> None:
    with pytest.raises(ValueError, match=r"listen\.unix_socket"):
        KVServerConfig.model_validate({"listen": {"shared_memory": True}})
    cfg = KVServerConfig.model_validate({"listen": {"shared_memory": True, "unix_socket": "/run/kv.sock"}})
    assert cfg.listen.shared_memory and not KVServerConfig().listen.shared_memory, "off unless asked for"


def test_sizes_are_byte_sizes_with_their_bounds_and_written_compactly() -> None:
    from strata_units import ByteSize

    cfg = KVServerConfig.model_validate({"limits": {"max_value_size": "64Mi"}})
    assert isinstance(cfg.limits.max_value_size, ByteSize) and isinstance(cfg.l1.size, ByteSize)
    assert isinstance(cfg.limits.max_output_buffer, ByteSize)  # derived from max_value_size, still one type
    assert cfg.model_dump(mode="json")["limits"]["max_value_size"] == "64MiB"
    with pytest.raises(ValidationError, match="above 0"):
        KVServerConfig.model_validate({"limits": {"max_unauthenticated_bulk": 0}})
