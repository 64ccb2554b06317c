"""Configuration: defaults < TOML file < environment < flags, errors naming key and source."""

from __future__ import annotations

import os

import pytest

from forge.config import Config, config_keys, env_var, load_config
from forge.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in [v for v in os.environ if v.startswith("FORGE_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)


def write(path, text):
    path.write_text(text)
    return path


def test_defaults_and_their_sources():
    config, sources = load_config()
    assert config == Config()
    assert (config.backend, config.fallback, config.device, config.model) == ("auto", None, 0, None)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8080)
    assert config.sampling.temperature == 0.8 and config.sampling.top_k == 40
    assert set(sources) == set(config_keys()) and set(sources.values()) == {"default"}


def test_sampling_defaults_are_valid_sampling_params():
    from forge.sampling import SamplingParams

    sampling = Config().sampling.model_dump()
    assert SamplingParams(**sampling).model_dump(include=set(sampling)) == sampling


def test_sampling_table_follows_sampling_params():
    from forge.sampling import SamplingParams

    fields = set(Config().sampling.model_dump())
    assert fields == set(SamplingParams.model_fields) - {"logit_bias", "constraint"}
    config, sources = load_config(environ={"FORGE_SAMPLING_PRESENCE_PENALTY": "1.5"})
    assert config.sampling.presence_penalty == 1.5
    with pytest.raises(ConfigError, match="presence_penalty"):
        load_config(environ={"FORGE_SAMPLING_PRESENCE_PENALTY": "3"})  # SamplingParams: <= 2
    with pytest.raises(ConfigError, match="top_p"):
        load_config({"sampling.top_p": "nan"})


def test_precedence_file_env_flag(tmp_path):
    path = write(tmp_path / "c.toml", 'backend = "hip"\ndevice = 1\nn_ctx = 512\n'
                                      '[server]\nport = 9000\nhost = "0.0.0.0"\n')  # fmt: skip
    env = {"FORGE_DEVICE": "2", "FORGE_SERVER_PORT": "9001", "FORGE_N_CTX": "1024"}
    config, sources = load_config({"n_ctx": "2048"}, path, environ=env)
    assert config.backend == "hip" and sources["backend"] == f"file {path}"
    assert config.device == 2 and sources["device"] == "env FORGE_DEVICE"
    assert config.server.port == 9001 and sources["server.port"] == "env FORGE_SERVER_PORT"
    assert config.server.host == "0.0.0.0" and sources["server.host"] == f"file {path}"
    assert config.n_ctx == 2048 and sources["n_ctx"] == "flag --n-ctx"
    assert sources["model"] == "default"


def test_config_file_from_forge_config_env(tmp_path, monkeypatch):
    path = write(tmp_path / "elsewhere.toml", 'fallback = "cpu_simd"\n')
    monkeypatch.setenv("FORGE_CONFIG", str(path))
    config, sources = load_config()
    assert config.fallback == "cpu_simd" and sources["fallback"] == f"file {path}"


def test_forge_toml_in_the_working_directory(tmp_path):
    write(tmp_path / "forge.toml", "[sampling]\ntop_k = 7\n")
    config, sources = load_config()
    assert config.sampling.top_k == 7
    assert sources["sampling.top_k"] == f"file {(tmp_path / 'forge.toml').resolve()}"


def test_explicit_config_beats_forge_config_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_CONFIG", str(write(tmp_path / "a.toml", "device = 1\n")))
    config, _ = load_config(config_path=write(tmp_path / "b.toml", "device = 2\n"))
    assert config.device == 2


def test_nested_and_dotted_flag_overrides():
    config, sources = load_config({"sampling": {"top_p": "0.5"}, "server.max_batch": 3})
    assert config.sampling.top_p == 0.5 and sources["sampling.top_p"] == "flag --top-p"
    assert config.server.max_batch == 3 and sources["server.max_batch"] == "flag --max-batch"


def test_flag_names_are_used_in_sources():
    _, sources = load_config({"sampling.temperature": "0"}, flag_names={"sampling.temperature":
                                                                       "--temp"})  # fmt: skip
    assert sources["sampling.temperature"] == "flag --temp"


def test_none_flag_values_mean_not_given():
    config, sources = load_config({"backend": None}, environ={"FORGE_BACKEND": "cpu_simd"})
    assert config.backend == "cpu_simd" and sources["backend"] == "env FORGE_BACKEND"


def test_empty_env_value_unsets_an_optional_key(tmp_path):
    path = write(tmp_path / "c.toml", 'fallback = "cpu_simd"\n')
    config, sources = load_config(config_path=path, environ={"FORGE_FALLBACK": ""})
    assert config.fallback is None and sources["fallback"] == "env FORGE_FALLBACK"


def test_every_key_has_an_env_var():
    assert env_var("server.api_key") == "FORGE_SERVER_API_KEY"
    env = {env_var(k): "" for k in config_keys()}
    assert {"FORGE_BACKEND", "FORGE_DEVICE", "FORGE_FALLBACK", "FORGE_MODEL", "FORGE_N_CTX",
            "FORGE_LOG_LEVEL", "FORGE_SAMPLING_SEED"} <= set(env)  # fmt: skip


# --- errors --------------------------------------------------------------------------------------
def test_unknown_key_in_file_names_key_and_file(tmp_path):
    path = write(tmp_path / "c.toml", 'backnd = "hip"\n')
    with pytest.raises(ConfigError) as info:
        load_config(config_path=path)
    assert "unknown key 'backnd'" in str(info.value) and str(path) in str(info.value)
    assert info.value.exit_code == 2


def test_unknown_key_inside_a_table_and_unknown_table(tmp_path):
    path = write(tmp_path / "c.toml", "[server]\nprot = 1\n[gpu]\nx = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(config_path=path)
    assert "unknown key 'server.prot'" in str(info.value) and "unknown key 'gpu'" in str(info.value)


def test_wrong_type_in_file(tmp_path):
    path = write(tmp_path / "c.toml", 'device = "first"\n')
    with pytest.raises(ConfigError, match=rf"device: .*'first' \(from file {path}\)"):
        load_config(config_path=path)


def test_table_that_is_not_a_table(tmp_path):
    path = write(tmp_path / "c.toml", "sampling = 3\n")
    with pytest.raises(ConfigError, match=rf"sampling: .*\(from file {path}\)"):
        load_config(config_path=path)


def test_wrong_type_from_env():
    with pytest.raises(ConfigError, match=r"server\.port: .*'http' \(from env FORGE_SERVER_PORT\)"):
        load_config(environ={"FORGE_SERVER_PORT": "http"})


def test_wrong_type_from_flag():
    with pytest.raises(ConfigError, match=r"n_ctx: .*'lots' \(from flag --n-ctx\)"):
        load_config({"n_ctx": "lots"})


@pytest.mark.parametrize(
    "overrides",
    [{"server.port": 70000}, {"device": -1}, {"log_level": "loud"}, {"sampling.top_p": 0}],
)
def test_out_of_range_values(overrides):
    key = next(iter(overrides))
    with pytest.raises(ConfigError, match=rf"{key}: .*\(from flag "):
        load_config(overrides)


def test_error_names_every_bad_key_with_its_own_source(tmp_path):
    path = write(tmp_path / "c.toml", 'n_ctx = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_config({"device": "y"}, path)
    text = str(info.value)
    assert "n_ctx: " in text and f"(from file {path})" in text and "(from flag --device)" in text


def test_missing_config_files_name_their_source(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"missing\.toml.*--config.*does not exist"):
        load_config(config_path=tmp_path / "missing.toml")
    monkeypatch.setenv("FORGE_CONFIG", str(tmp_path / "gone.toml"))
    with pytest.raises(ConfigError, match=r"gone\.toml.*FORGE_CONFIG"):
        load_config()


def test_invalid_toml(tmp_path):
    path = write(tmp_path / "c.toml", "backend = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(config_path=path)


def test_api_key_from_forge_api_key_below_its_own_variable():
    config, sources = load_config(environ={"FORGE_API_KEY": "a"})
    assert config.server.api_key == "a" and sources["server.api_key"] == "env FORGE_API_KEY"
    config, sources = load_config(environ={"FORGE_API_KEY": "a", "FORGE_SERVER_API_KEY": "b"})
    assert config.server.api_key == "b" and sources["server.api_key"] == "env FORGE_SERVER_API_KEY"


def test_a_bad_api_key_value_is_not_echoed(tmp_path):
    path = write(tmp_path / "f.toml", "[server]\napi_key = 123456789\nport = 'p0rt'\n")
    with pytest.raises(ConfigError) as e:
        load_config(config_path=path)
    assert "server.api_key" in str(e.value) and "123456789" not in str(e.value)
    assert "'p0rt'" in str(e.value)  # other values are still shown


def test_max_tokens_and_chain_keys(tmp_path):
    """max_tokens is one key for CLI, API and server (-1: no limit, 0 refused); the sampler
    chain takes llama.cpp's "a;b" spelling from the environment and files too."""
    env = {"FORGE_MAX_TOKENS": "-1", "FORGE_SAMPLING_CHAIN": "top_k;temperature"}
    config, sources = load_config(environ=env)
    assert config.max_tokens == -1 and config.sampling.chain == ["top_k", "temperature"]
    assert sources["max_tokens"] == "env FORGE_MAX_TOKENS"
    with pytest.raises(ConfigError, match="max_tokens.*use -1 for no limit"):
        load_config({"max_tokens": 0}, environ={})
