import pytest

from engine.config import GIB, EngineSettings
from engine.errors import ConfigError
from engine.model_config import FULL, LINEAR, parse_config

TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
    "eos_token_id": 7,
}


def test_nested_and_flat_forms_agree():
    nested = parse_config({"model_type": "qwen3_5", "text_config": TEXT, "eos_token_id": 9})
    flat = parse_config({"model_type": "qwen3_5_text", **TEXT})
    assert nested.hidden_size == flat.hidden_size == 64
    assert nested.layer_types == flat.layer_types
    assert nested.eos_token_ids == (7, 9) and flat.eos_token_ids == (7,)


def test_layer_schedule_from_interval_is_every_fourth():
    cfg = parse_config({"model_type": "qwen3_5_text", **TEXT})
    assert cfg.full_layers == (3, 7)
    assert cfg.layer_types[:4] == (LINEAR, LINEAR, LINEAR, FULL)
    assert cfg.conv_dim == 2 * 2 * 16 + 4 * 16 and cfg.rotary_dim == 8


def test_explicit_layer_types_win():
    types = [FULL] + [LINEAR] * 7
    cfg = parse_config({"model_type": "qwen3_5_text", **TEXT, "layer_types": types})
    assert cfg.full_layers == (0,)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "num_attention_heads = 4 is not a multiple"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads = 3"),
        ({"hidden_size": 0}, "hidden_size = 0 must be a positive integer"),
        ({"layer_types": ["full_attention"]}, "layer_types has 1 entries"),
        ({"layer_types": ["mamba"] * 8}, "unknown kinds"),
    ],
)
def test_impossible_shapes_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"model_type": "qwen3_5_text", **TEXT, **change}, source="x/config.json")


def test_missing_fields_are_listed():
    text = {k: v for k, v in TEXT.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(ConfigError, match="missing hidden_size, vocab_size"):
        parse_config({"model_type": "qwen3_5", "text_config": text})


def test_settings_from_env_and_overrides():
    s = EngineSettings.from_env({"SNUG_MEMORY_RESERVE_GIB": "0.25", "SNUG_MEMORY_LIMIT_GIB": "4"})
    assert s.reserve_bytes == GIB // 4 and s.limit_bytes == 4 * GIB
    assert s.with_gib(limit=0).limit_bytes is None
    assert EngineSettings.from_env({}).limit_bytes is None


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError, match="SNUG_MEMORY_LIMIT_GIB='four'"):
        EngineSettings.from_env({"SNUG_MEMORY_LIMIT_GIB": "four"})
    with pytest.raises(ConfigError, match="SNUG_BACKEND"):
        EngineSettings.from_env({"SNUG_BACKEND": "opencl"})
    # Names as a person types them: any case, spaces around.
    typed = {"SNUG_BACKEND": " NumPy", "SNUG_COMPUTE_DTYPE": "Float32 "}
    typed["SNUG_DRAFT_TOKENS"] = "Auto"
    s = EngineSettings.from_env(typed)
    assert (s.backend, s.compute_dtype, s.draft_tokens) == ("numpy", "float32", "auto")


def test_gib_settings_past_a_pib_are_refused_by_name():
    """A size whose bytes no float holds (2e299 GiB) is refused, not an OverflowError."""
    for name in ("SNUG_MEMORY_RESERVE_GIB", "SNUG_MEMORY_LIMIT_GIB", "SNUG_PROMPT_CACHE_DISK_GIB"):
        with pytest.raises(ConfigError, match=f"{name}='2e299' must be a number of GiB from 0"):
            EngineSettings.from_env({name: "2e299"})
    assert EngineSettings.from_env({"SNUG_MEMORY_LIMIT_GIB": "1048576"}).limit_bytes == 1 << 50
    for bad in (2e299, float("nan"), -1.0):
        with pytest.raises(ConfigError, match="memory reserve .* must be from 0 to 1,048,576"):
            EngineSettings().with_gib(reserve=bad)


def test_overlap_launches_setting():
    assert EngineSettings.from_env({}).overlap_launches is True
    assert EngineSettings.from_env({"SNUG_OVERLAP_LAUNCHES": "0"}).overlap_launches is False
    assert EngineSettings.from_env({"SNUG_OVERLAP_LAUNCHES": " 1 "}).overlap_launches is True
    with pytest.raises(ConfigError, match="SNUG_OVERLAP_LAUNCHES='yes' must be 0 or 1"):
        EngineSettings.from_env({"SNUG_OVERLAP_LAUNCHES": "yes"})


def test_a_limit_under_a_byte_is_refused_by_name():
    """A limit above 0 (0 is none) whose bytes round to 0 names the setting and what to set."""
    for make in (
        lambda: EngineSettings().with_gib(limit=1e-10),
        lambda: EngineSettings.from_env({"SNUG_MEMORY_LIMIT_GIB": "1e-10"}),
    ):
        with pytest.raises(ConfigError, match=r"1e-10 GiB .*set 0 for no limit.*MEMORY_LIMIT_GIB"):
            make()
    assert EngineSettings().with_gib(limit=1e-9).limit_bytes == 1


def test_a_decimal_comma_is_refused_with_what_to_write():
    with pytest.raises(ConfigError, match=r"RESERVE_GIB='0,5' .*a point, not a comma.*3\.5"):
        EngineSettings.from_env({"SNUG_MEMORY_RESERVE_GIB": "0,5"})
    with pytest.raises(ConfigError, match=r"LIMIT_GIB='4GiB' is not a number .*such as 4"):
        EngineSettings.from_env({"SNUG_MEMORY_LIMIT_GIB": "4GiB"})
