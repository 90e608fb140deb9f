"""What every model adapter shares: options, the API key and base URL, the transport, the screenshot
budget of the conversation, and the turn loop with its one re-ask.

A provider implements four steps over its own wire format — ``_observe`` (put the new screen, and the
outcome of the last turn, into the conversation), ``_ask`` (one API call, its reply appended), ``_read``
(the reply as an :class:`AgentTurn` in screen coordinates, or :class:`ActionError`) and ``_complain`` (tell
the model what was wrong with its reply) — and :meth:`ModelAgent.act` runs them: a reply that does not
parse is answered once with the parser's message; a second bad reply is an invalid step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_retrace.actions import Action, ActionError
from pytest_retrace.actions.pyautogui_render import to_pyautogui
from pytest_retrace.agents import (
    AgentConfigError,
    AgentContext,
    AgentInfraError,
    AgentTurn,
    ModelConfig,
    Observation,
    Usage,
    parse_options,
)
from pytest_retrace.agents.images import CoordinateSpace, Scaler
from pytest_retrace.agents.prompts import PLACEHOLDER, Prompts
from pytest_retrace.agents.secrets import install_log_filter, redact, register_secret, scrub_exception
from pytest_retrace.agents.transport import CallStats, Transport, TransportOptions, price


class ImageOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_long_edge: int | None = Field(None, ge=64, description="scale screenshots down to this long edge")
    max_pixels: int | None = Field(None, ge=4096, description="...and to at most this many pixels")
    coordinates: CoordinateSpace = "image"  # the space the model's coordinates are in


class ModelOptions(BaseModel):
    """Options every model adapter takes (the ``options:`` of ``agents/NAME.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    api_key_env: str | None = Field(None, description="environment variable holding the API key")
    base_url: str | None = Field(None, description="None: the SDK's own *_BASE_URL variable, else its default")
    base_url_env: str | None = Field(None, description="a variable that, when set, overrides base_url")
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int = Field(4096, ge=1)
    max_screenshots: int = Field(3, ge=0, description="past screenshots kept in the conversation (newest)")
    image: ImageOptions = ImageOptions()
    prices: dict[Literal["input", "output", "cache_read", "cache_write"], float] | None = Field(
        None, description="USD per million tokens, for the estimated cost in every record")
    transport: TransportOptions = TransportOptions()
    prompts_dir: str = "prompts"
    prompts: dict[str, str] = {}
    reask: bool = True  # answer an unparsable reply once with the parser's message before counting it invalid


def _config_dir(config: ModelConfig) -> Path:
    return config.path.parent if config.path is not None else Path.cwd()


class Endpoint:
    """A provider endpoint as a config describes it: key, base URL, transport (retries and the shared
    concurrency limit). Keys are read from the environment only and never leave the SDK client: the key is
    registered with :mod:`.secrets`, so no message, reply text or SDK log record of this process quotes it."""

    def __init__(self, config: ModelConfig, opts: ModelOptions, provider: str, default_url: str,
                 url_variable: str | None, transient: tuple[type[BaseException], ...],
                 api_errors: tuple[type[BaseException], ...], key_required: bool = True) -> None:
        self.api_key: str | None = None
        if opts.api_key_env:
            self.api_key = os.environ.get(opts.api_key_env)
            if not self.api_key and key_required:
                raise AgentConfigError(f"{config.where}: options.api_key_env: the environment variable "
                                       f"{opts.api_key_env} is not set (keys are read from the environment only)")
        register_secret(self.api_key)
        install_log_filter()  # the SDK is imported by now, and with it its loggers
        override = os.environ.get(opts.base_url_env) if opts.base_url_env else None
        # None lets the SDK read its own variable (ANTHROPIC_BASE_URL, OPENAI_BASE_URL) exactly as it would
        self.base_url = override or opts.base_url
        effective = self.base_url or (os.environ.get(url_variable) if url_variable else None) or default_url
        self.transport = Transport(f"{provider} {effective}", opts.transport, transient, api_errors)

    def call(self, fn: Callable[[], Any], usage: Usage) -> Any:
        stats = CallStats()
        try:
            return self.transport.call(fn, stats)
        finally:
            usage.calls += 1
            usage.retries += stats.retries
            usage.latency += stats.latency


class ModelAgent:
    """Base of the model adapters (see the module docstring)."""

    privileged = False
    calls_per_turn = 2  # one reply, and one re-ask when it does not parse

    def __init__(self, config: ModelConfig, schema: type[ModelOptions]) -> None:
        self.name = config.name
        self.opts = parse_options(schema, config)
        try:
            self.prompts = Prompts(_config_dir(config), self.opts.prompts_dir, self.opts.prompts)
            self.prompts.check()
        except AgentConfigError as exc:
            raise AgentConfigError(f"{config.where}: {exc}") from None
        self.ctx: AgentContext | None = None
        self.scaler: Scaler | None = None
        self.observation: Observation | None = None  # the one act() is answering
        self.client: Any = None  # the provider's SDK client, set by the subclass
        self._images: list[tuple[dict[str, Any], Callable[[dict[str, Any]], None]]] = []

    # -- the protocol ----------------------------------------------------------------------------------
    def start(self, context: AgentContext) -> None:
        with redacted_errors():  # as act(): a provider's _reset may be anything
            self.ctx = context
            img = self.opts.image
            self.scaler = Scaler.build(context.screen, max_long_edge=img.max_long_edge,
                                       max_pixels=img.max_pixels, coordinates=img.coordinates)
            self._images = []
            self._reset()

    def act(self, observation: Observation) -> AgentTurn:
        """One turn; what it returns or raises quotes no credential (see :mod:`.secrets`): a rationale and an
        invalid reply's message are the model's words, which a server may fill with the key it was sent."""
        with redacted_errors():
            turn = self._act(observation)
        turn.rationale = redact(turn.rationale)
        turn.invalid = None if turn.invalid is None else redact(turn.invalid)
        return turn

    def _act(self, observation: Observation) -> AgentTurn:
        usage = Usage()
        self.observation = observation
        self._observe(observation)
        reply = self._ask_trimmed(usage)
        try:
            turn = self._read_reply(reply)
        except ActionError as first:
            if not self.opts.reask:
                return self._invalid(reply, str(first), usage)
            self._complain(reply, str(first))
            reply = self._ask_trimmed(usage)
            try:
                turn = self._read_reply(reply)
            except ActionError as second:
                return self._invalid(reply, str(second), usage)
        usage.cost = price(usage, self.opts.prices)
        turn.usage = usage
        return turn

    def _read_reply(self, reply: Any) -> AgentTurn:
        """What the model said is the model's responsibility: a reply the reader cannot handle, whatever
        the exception, is an unusable reply (re-asked, then an invalid step), never a crash of the run."""
        try:
            return self._read(reply)
        except ActionError:
            raise
        except Exception as exc:
            raise ActionError(f"the reply could not be read ({type(exc).__name__}: {exc})") from exc

    def close(self) -> None:
        if self.client is not None:
            self.client.close()  # its HTTP connection pool

    # -- for providers -----------------------------------------------------------------------------------
    def describe(self, action: Action) -> str:
        """A past action as the model would have written it: pyautogui code in its own coordinates."""
        assert self.scaler is not None
        return to_pyautogui(self.scaler.action_to_model(action))

    def prompt_values(self) -> dict[str, object]:
        assert self.scaler is not None
        w, h = self.scaler.space
        return {"image_width": w, "image_height": h}

    def track_image(self, block: dict[str, Any], replace: Callable[[dict[str, Any]], None]) -> None:
        """Register a past-or-current screenshot in the conversation; beyond the newest max_screenshots + 1
        (the current one) they are replaced by a placeholder, in place, before the next call."""
        self._images.append((block, replace))

    def to_screen(self, action: Action) -> Action:
        assert self.scaler is not None
        return self.scaler.action_to_screen(action)

    def _ask_trimmed(self, usage: Usage) -> Any:
        keep = self.opts.max_screenshots + 1
        while len(self._images) > keep:
            block, replace = self._images.pop(0)
            replace(block)
        return self._ask(usage)

    def _invalid(self, reply: Any, message: str, usage: Usage) -> AgentTurn:
        usage.cost = price(usage, self.opts.prices)
        return AgentTurn([], self._rationale(reply), usage, invalid=message)

    # -- provider steps ----------------------------------------------------------------------------------
    def _reset(self) -> None:
        raise NotImplementedError

    def _observe(self, observation: Observation) -> None:
        raise NotImplementedError

    def _ask(self, usage: Usage) -> Any:
        raise NotImplementedError

    def _read(self, reply: Any) -> AgentTurn:
        raise NotImplementedError

    def _complain(self, reply: Any, message: str) -> None:
        raise NotImplementedError

    def _rationale(self, reply: Any) -> str:
        return ""


@contextmanager
def redacted_errors() -> Iterator[None]:
    """Whatever escapes the block leaves it with no credential in its text, nor in that of the exceptions
    chained to it: an AgentInfraError is redacted when made; anything else (a bug, an SDK error the
    transport passes through) keeps its type where it can (the run calls it an agent bug by its type)."""
    try:
        yield
    except AgentInfraError:
        raise
    except Exception as exc:
        scrubbed = scrub_exception(exc)
        if scrubbed is exc:
            raise
        raise scrubbed from None


def text_placeholder(block: dict[str, Any]) -> None:
    """Replace an image block by the placeholder text block (Anthropic and chat formats alike)."""
    block.clear()
    block.update({"type": "text", "text": PLACEHOLDER})


def keys_of(chord: Any) -> tuple[str, ...]:
    """'ctrl+shift+Escape' -> ('ctrl', 'shift', 'Escape'); a lone '+' is the plus key."""
    if not isinstance(chord, str):
        raise ActionError(f"keys must be a string such as 'ctrl+s', got {chord!r}")
    return (chord,) if chord == "+" else tuple(k for k in chord.split("+") if k)
