"""Configuration: pydantic models filled from defaults, a TOML file, the environment and flags.

Sources in increasing precedence:
1. the defaults below;
2. a TOML file: ``--config PATH``, else ``$FORGE_CONFIG``, else ``./forge.toml`` if present;
3. environment variables ``FORGE_<KEY>`` for top-level keys (``FORGE_BACKEND``, ``FORGE_DEVICE``,
   ``FORGE_N_CTX``, ...) and ``FORGE_<TABLE>_<KEY>`` for table keys (``FORGE_SERVER_PORT``,
   ``FORGE_SAMPLING_TEMPERATURE``); an empty value unsets an optional key;
4. command-line flags (``cli_overrides``, keyed by dotted config key).

Unknown keys and wrong types raise `ConfigError` naming the key and the source that set it.
`load_config` also returns where each effective value came from (shown by ``forge config``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from forge.errors import ConfigError
from forge.sampling.params import SamplingParams

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
KvType = Literal["auto", "f32", "f16", "bf16", "q8_0", "q4_0"]


# The config's sampling table takes SamplingParams' own fields (types, ranges, defaults), less
# the ones that only make sense per request.
_PER_REQUEST_SAMPLING = {"logit_bias", "constraint"}
SamplingConfig = create_model(
    "SamplingConfig",
    __config__=ConfigDict(extra="forbid"),
    __doc__="Default sampling parameters (llama.cpp's defaults); requests and flags override them.",
    **{
        name: (field.annotation, field)
        for name, field in SamplingParams.model_fields.items()
        if name not in _PER_REQUEST_SAMPLING
    },
)


class ServerConfig(BaseModel):
    """The OpenAI-compatible HTTP server (``forge serve``)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"  # loopback by default: exposing it is a deliberate choice
    port: int = Field(8080, ge=0, le=65535)
    api_key: str | None = None  # when set, requests need "Authorization: Bearer <key>"
    api_key_file: str | None = None  # a file holding the key (kept out of `ps` and configs)
    max_body_bytes: int = Field(4 << 20, ge=1024)  # larger request bodies get HTTP 413
    metrics_public: bool = False  # /metrics without the API key
    drain_timeout: float = Field(30.0, ge=0)  # at a stop, seconds running requests may finish
    max_queue: int = Field(64, ge=1)  # requests waiting beyond this are refused (HTTP 503)
    max_batch: int = Field(8, ge=1)  # sequences decoded together


class Config(BaseModel):
    """The effective forge configuration."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "auto"  # "auto" (best available by probe score) or a backend name
    fallback: str | None = None  # backend (or "auto") to use when `backend` is unavailable
    device: int = Field(0, ge=0)  # device index within the backend
    # devices one model is split over (Megatron-style tensor parallelism), from `device` on
    tensor_parallel: int = Field(1, ge=1)
    model: str | None = None  # GGUF path; None = the default model (Gemma 3 270M Q4_K_M)
    n_ctx: int = Field(4096, ge=16)  # context window in tokens (capped by the model's)
    threads: int | None = Field(None, ge=1)  # CPU threads; None = all cores
    # "auto": each (backend, op, weight type) runs the kernel of highest priority (`forge
    # kernels`); "builtin": only the kernels of the backend's own plugin (on cpu_simd: NumPy, not
    # the compiled kernels of forge_cpu_jit)
    kernels: Literal["auto", "builtin"] = "auto"
    # true: ops that have a batch-invariant kernel (a row's result independent of the other rows
    # of its step; on cpu_simd the compiled attention of forge_cpu_jit) run it, and hip fixes its
    # launch plan's per-row reduction orders (forge_hip.invariance), so a request's tokens do not
    # depend on what else the server runs. Off by default: on the default model it moves the
    # logits within llama.cpp's rounding noise but past the golden bound (cpu_simd), and on hip
    # it slows one-sequence decode by a third to a half.
    batch_invariant: bool = False
    # tokens generated when a request, flag or call does not say (CLI, Python API and server
    # alike); -1 = until an end-of-generation token or the context is full
    max_tokens: int = Field(256, ge=-1)
    # how the KV cache stores keys and values, as llama.cpp's --cache-type-k/-v; "auto": the
    # backend's choice (cpu_simd float32; hip float16, or float32 for all-F32 weights)
    kv_cache_type_k: KvType = "auto"
    kv_cache_type_v: KvType = "auto"
    # cpu_simd, a mixture of experts: MiB of prepared (float32) experts kept over all layers
    # (the others stay in the mapped file until tokens are routed to them again)
    cpu_expert_cache_mb: int = Field(2048, ge=0)
    log_level: LogLevel = "info"
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @field_validator("max_tokens")
    @classmethod
    def _some_tokens(cls, value: int) -> int:
        if value == 0:
            raise ValueError("0 tokens would generate nothing; use -1 for no limit")
        return value


TABLES = {"sampling": SamplingConfig, "server": ServerConfig}


def config_keys() -> list[str]:
    """Every dotted key, e.g. "backend", "server.port"."""
    keys = []
    for name in Config.model_fields:
        table = TABLES.get(name)
        keys += [f"{name}.{k}" for k in table.model_fields] if table else [name]
    return keys


def env_var(key: str) -> str:
    """The environment variable of a dotted key: "server.port" -> "FORGE_SERVER_PORT"."""
    return "FORGE_" + key.replace(".", "_").upper()


def flag_name(key: str) -> str:
    """The conventional flag of a dotted key: "n_ctx" -> "--n-ctx", "server.port" -> "--port"."""
    return "--" + key.rsplit(".", 1)[-1].replace("_", "-")


def _optional(key: str) -> bool:
    table, _, field = key.rpartition(".")
    info = (TABLES[table] if table else Config).model_fields[field]
    return not info.is_required() and info.default is None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and (prefix or key in TABLES):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        head, _, tail = key.partition(".")
        if tail and isinstance(nested.setdefault(head, {}), dict):
            nested[head][tail] = value
        elif not tail:
            nested[head] = value
    return nested


def find_config_file(config_path: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """The TOML file to read and how it was named ("--config", "FORGE_CONFIG", "./forge.toml")."""
    if config_path is not None:
        path, how = Path(config_path), "--config"
    elif os.environ.get("FORGE_CONFIG"):
        path, how = Path(os.environ["FORGE_CONFIG"]), "FORGE_CONFIG"
    elif Path("forge.toml").is_file():
        return Path("forge.toml").resolve(), "./forge.toml"
    else:
        return None, ""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} (from {how}) does not exist")
    return path, how


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from None


# Never shown: `forge config` says whether it is set, error messages leave its value out.
SECRET_KEYS = frozenset({"server.api_key"})
# Other variables that set a key, below FORGE_<KEY> in precedence.
ENV_ALIASES = {"FORGE_API_KEY": "server.api_key"}


def _from_env(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    found: dict[str, tuple[Any, str]] = {}
    for var, key in ENV_ALIASES.items():
        if environ.get(var):
            found[key] = (environ[var], f"env {var}")
    for key in config_keys():
        var = env_var(key)
        if var in environ:
            value: Any = environ[var]
            if value == "" and _optional(key):
                value = None
            found[key] = (value, f"env {var}")
    return found


def load_config(
    cli_overrides: Mapping[str, Any] | None = None,
    config_path: str | os.PathLike | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> tuple[Config, dict[str, str]]:
    """Build the effective config; returns it and {dotted key: source} for every key.

    :param cli_overrides: values from flags by dotted key ("backend", "sampling.top_k") or as
        nested tables; None values mean "flag not given". Strings are parsed like env values.
    :param config_path: the ``--config`` file (takes precedence over FORGE_CONFIG/forge.toml).
    :param environ: the environment to read (default ``os.environ``).
    :param flag_names: the flag that set each key, for messages (default `flag_name(key)`).
    Sources read "default", "file <path>", "env FORGE_X" or "flag --x".
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    path, _ = find_config_file(config_path)
    if path is not None:
        for key, value in _flatten(_read_toml(path)).items():
            values[key], sources[key] = value, f"file {path}"
    for key, (value, source) in _from_env(environ).items():
        values[key], sources[key] = value, source
    for key, value in _flatten(cli_overrides or {}).items():
        if value is not None:
            flag = (flag_names or {}).get(key) or flag_name(key)
            values[key], sources[key] = value, f"flag {flag}"

    try:
        config = Config.model_validate(_nest(values))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None
    for key in config_keys():
        sources.setdefault(key, "default")
    return config, {k: sources[k] for k in config_keys()}


def _describe(exc: ValidationError, sources: Mapping[str, str]) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc)
        # the source of the longest prefix that was set ("server" when a table is not a table)
        prefixes = (".".join(loc[:n]) for n in range(len(loc), 0, -1))
        source = next((sources[p] for p in prefixes if p in sources), "default")
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r} (from {source})")
        elif key in SECRET_KEYS:
            parts.append(f"{key}: {err['msg']} (from {source})")
        else:
            parts.append(f"{key}: {err['msg']}, got {err.get('input')!r} (from {source})")
    return "invalid configuration: " + "; ".join(parts)


def effective_items(config: Config) -> dict[str, Any]:
    """{dotted key: value} of a config, in declaration order."""
    flat = _flatten(config.model_dump())
    return {k: flat[k] for k in config_keys()}
