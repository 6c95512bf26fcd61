"""The one table of settings."""
import pytest

from tarantella import config


def test_defaults_without_environment():
    settings = config.load_config({})
    assert settings.fusion_threshold_kb == 32 and settings.fusion_threshold_bytes == 32 * 1024
    assert settings.allreduce_algorithm == "auto" and settings.output_on_all_devices is False


def test_environment_overrides_and_parses():
    settings = config.load_config({"TNT_FUSION_THRESHOLD_KB": "0", "TNT_OUTPUT_ON_ALL_DEVICES": "yes",
                                   "TNT_ALLREDUCE_ALGORITHM": "Ring", "TNT_LOG_LEVEL": "debug"})
    assert (settings.fusion_threshold_kb, settings.output_on_all_devices) == (0, True)
    assert (settings.allreduce_algorithm, settings.log_level) == ("ring", "DEBUG")


@pytest.mark.parametrize("env, value", [("TNT_FUSION_THRESHOLD_KB", "-1"), ("TNT_TIMEOUT_SECONDS", "0"),
                                        ("TNT_ALLREDUCE_ALGORITHM", "tree"), ("TNT_NO_GPU", "maybe")])
def test_bad_values_name_the_variable_and_the_flag(env, value):
    with pytest.raises(config.ConfigError) as error:
        config.load_config({env: value})
    setting = config.setting_for_env(env)
    assert env in str(error.value) and setting.flag in str(error.value)


def test_every_setting_is_a_config_field_with_a_unique_flag_and_variable():
    names = [s.name for s in config.SETTINGS]
    assert sorted(names) == sorted(config.Config.__dataclass_fields__)
    assert len({s.env for s in config.SETTINGS}) == len(names) == len({s.flag for s in config.SETTINGS})
