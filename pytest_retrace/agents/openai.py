"""OpenAI computer use through the official ``openai`` SDK and the Responses API.

Tools (``tool``):
- ``computer`` (GA, the paper's gpt-5.4): ``{"type": "computer"}``; each ``computer_call`` holds ``actions[]``.
- ``computer_use_preview`` (model ``computer-use-preview``): declares the display size and environment;
  each ``computer_call`` holds one ``action``; ``truncation: auto`` as the docs require.

The loop: ``computer_call`` → its actions run → ``computer_call_output`` with the new screenshot. The
conversation is kept here and sent whole (``store`` is off by default, reasoning items travel back
encrypted), so older screenshots can be replaced by a small placeholder image to bound the context —
``previous_response_id`` would keep every screenshot on the server. Pending safety checks follow the
configured policy: ``acknowledge`` them in the next output, or ``stop`` the agent there (a failed run,
the record says why). A response without a ``computer_call`` means the model has finished.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
from pydantic import Field

from pytest_retrace.actions import Action, ActionError, normalize_key
from pytest_retrace.agents import AgentTurn, ModelConfig, Observation, Usage, parse_options
from pytest_retrace.agents.images import data_url, encode_png
from pytest_retrace.agents.llm import Endpoint, ModelAgent, ModelOptions, redacted_errors
from pytest_retrace.agents.prompts import Image, Part, Text
from pytest_retrace.agents.secrets import redact
from pytest_retrace.agents.transport import price

_BUTTONS = {"left": "left", "right": "right", "wheel": "middle", "middle": "middle"}


class OpenAIOptions(ModelOptions):
    model: str = "gpt-5.4"
    api_key_env: str | None = "OPENAI_API_KEY"
    tool: Literal["computer", "computer_use_preview"] = "computer"
    environment: Literal["linux", "ubuntu", "windows", "mac", "browser"] = "linux"  # computer_use_preview only
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = "concise"
    safety_checks: Literal["acknowledge", "stop"] = "stop"
    store: bool = False  # stateless: the whole conversation is sent each turn (see the module docstring)
    scroll_pixels_per_click: float = Field(100.0, gt=0, description="scroll_x/y are pixels; the desktop scrolls in wheel clicks")
    wait_seconds: float = Field(1.0, ge=0, le=10, description="what a `wait` action waits")
    max_tokens: int = Field(16384, ge=1)
    prompt_cache_key: str | None = None  # groups requests for OpenAI's automatic prompt caching


def _endpoint(config: ModelConfig, opts: OpenAIOptions) -> tuple[Endpoint, Any]:
    import openai

    endpoint = Endpoint(config, opts, "openai", "https://api.openai.com/v1", "OPENAI_BASE_URL",
                        (openai.APIConnectionError, openai.APITimeoutError), (openai.APIError,))
    client = openai.OpenAI(api_key=endpoint.api_key, base_url=endpoint.base_url, max_retries=0,
                           timeout=opts.transport.timeout)
    return endpoint, client


@functools.cache
def _placeholder_url() -> str:
    """computer_call_output must carry an image: an old screenshot becomes this 64x40 grey one."""
    return data_url(encode_png(np.full((40, 64, 3), 128, dtype=np.uint8)))


def _image_placeholder(item: dict[str, Any]) -> None:
    item["image_url"] = _placeholder_url()


class OpenAIAgent(ModelAgent):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, OpenAIOptions)
        self.opts: OpenAIOptions
        self.endpoint, self.client = _endpoint(config, self.opts)
        self._input: list[dict[str, Any]] = []
        self._instructions = ""
        self._calls: list[dict[str, Any]] = []  # computer_calls of the last response, to be answered
        self._note: str | None = None  # why the last turn did nothing, said with the next screenshot

    def _reset(self) -> None:
        assert self.ctx is not None
        self._instructions = self.prompts.system(self.ctx, **self.prompt_values())
        self._input, self._calls, self._note = [], [], None

    def _observe(self, obs: Observation) -> None:
        assert self.ctx is not None and self.scaler is not None
        if not self._input:
            parts = self.prompts.opening(self.ctx, obs.screenshot, self.describe, **self.prompt_values())
            content = []
            for part in parts:
                if isinstance(part, Text):
                    content.append({"type": "input_text", "text": part.text})
                else:
                    block = {"type": "input_image", "image_url": data_url(self.scaler.png(part.pixels)),
                             "detail": "high"}
                    content.append(block)
                    if part.past or part is parts[-1]:
                        self.track_image(block, _image_placeholder)
            self._input.append({"role": "user", "content": content})
            return
        self._answer(obs, note=self._note)
        self._note = None

    def _answer(self, obs: Observation, note: str | None = None) -> None:
        """A computer_call_output per pending call (the API wants one each), with the current screen."""
        assert self.scaler is not None
        shot = data_url(self.scaler.png(obs.screenshot))
        failure = obs.failure
        for call in self._calls:
            output = {"type": "computer_screenshot", "image_url": shot}
            item: dict[str, Any] = {"type": "computer_call_output", "call_id": call["call_id"], "output": output}
            checks = call.get("pending_safety_checks") or []
            if checks:  # reached only with the acknowledge policy: `stop` ends the run first
                item["acknowledged_safety_checks"] = [{"id": c["id"], "code": c.get("code"),
                                                       "message": c.get("message")} for c in checks]
            self._input.append(item)
            self.track_image(output, _image_placeholder)
        self._calls = []
        if failure or note:
            self._input.append({"role": "user", "content": [{"type": "input_text", "text": note or failure}]})

    def _ask(self, usage: Usage) -> Any:
        opts = self.opts
        kwargs: dict[str, Any] = {"model": opts.model, "input": self._input, "instructions": self._instructions,
                                  "tools": [self._tool()], "max_output_tokens": opts.max_tokens, "store": opts.store}
        if opts.tool == "computer_use_preview":
            kwargs["truncation"] = "auto"
        if opts.reasoning_effort or opts.reasoning_summary:
            kwargs["reasoning"] = {k: v for k, v in (("effort", opts.reasoning_effort),
                                                     ("summary", opts.reasoning_summary)) if v}
        if not opts.store:
            kwargs["include"] = ["reasoning.encrypted_content"]  # reasoning items must travel back
        if opts.temperature is not None:
            kwargs["temperature"] = opts.temperature
        if opts.prompt_cache_key:
            kwargs["prompt_cache_key"] = opts.prompt_cache_key
        response = self.endpoint.call(lambda: self.client.responses.create(**kwargs), usage)
        if response.usage is not None:
            cached = getattr(getattr(response.usage, "input_tokens_details", None), "cached_tokens", 0) or 0
            usage.input_tokens += (response.usage.input_tokens or 0) - cached
            usage.cache_read_tokens += cached
            usage.output_tokens += response.usage.output_tokens or 0
        self._input += [item.model_dump(mode="json", exclude_none=True) for item in response.output]
        return response

    def _tool(self) -> dict[str, Any]:
        if self.opts.tool == "computer":
            return {"type": "computer"}
        w, h = self.scaler.image  # type: ignore[union-attr]
        return {"type": "computer_use_preview", "display_width": w, "display_height": h,
                "environment": self.opts.environment}

    def _read(self, response: Any) -> AgentTurn:
        calls = [item for item in response.output if getattr(item, "type", None) == "computer_call"]
        self._calls = [c.model_dump(mode="json", exclude_none=True) for c in calls]
        rationale = self._rationale(response)
        if not calls:
            return AgentTurn([Action("done")], rationale)
        checks = [c for call in self._calls for c in call.get("pending_safety_checks") or []]
        if checks and self.opts.safety_checks == "stop":
            what = "; ".join(f"{c.get('code')}: {c.get('message')}" for c in checks)
            return AgentTurn([Action("fail")], f"{rationale}\n[stopped at a pending safety check (policy stop): {what}]")
        actions: list[Action] = []
        for call in self._calls:
            raw = call.get("actions") if call.get("actions") is not None else [call.get("action")]
            for i, act in enumerate(raw):
                try:
                    got = self._map(act)
                except ActionError as exc:
                    raise ActionError(f"computer_call {call.get('call_id')} action {i}: {exc}") from None
                if got is not None:
                    actions.append(got)
        return AgentTurn(actions, rationale)

    def _complain(self, response: Any, message: str) -> None:
        # the calls must still be answered: with the unchanged screen and a note saying what was wrong
        assert self.observation is not None
        self._answer(self.observation, note=f"Your last action could not be run: {message}")

    def _invalid(self, reply: Any, message: str, usage: Usage) -> AgentTurn:
        # the pending calls are answered at the next observation; say then why nothing ran
        self._note = f"Your last action could not be run: {message}"
        return super()._invalid(reply, message, usage)

    def _rationale(self, response: Any) -> str:
        texts = []
        for item in response.output:
            kind = getattr(item, "type", None)
            if kind == "reasoning":
                texts += [s.text for s in getattr(item, "summary", None) or [] if getattr(s, "text", None)]
            elif kind == "message":
                texts += [c.text for c in item.content if getattr(c, "type", None) == "output_text"]
        return "\n".join(texts).strip()[:4000]

    # -- one action --------------------------------------------------------------------------------------
    def _point(self, d: Any) -> tuple[int, int]:
        assert self.scaler is not None
        if not isinstance(d, dict):
            raise ActionError(f"a point must be an object with x and y, got {d!r}")
        return self.scaler.to_screen(d.get("x"), d.get("y"))

    def _map(self, d: Any) -> Action | None:
        """One OpenAI action -> an Action in screen coordinates (None for a screenshot request)."""
        if not isinstance(d, dict):
            raise ActionError(f"an action must be an object, got {d!r}")
        kind = d.get("type")
        held = d.get("keys") or []
        if not isinstance(held, list):
            raise ActionError(f"keys must be a list of key names, got {held!r}")
        hold = tuple(_key(k) for k in held) if kind != "keypress" else ()
        if kind == "click":
            named = d.get("button", "left")
            button = _BUTTONS.get(named) if isinstance(named, str) else None  # a list is no key: a miss, not a crash
            if button is None:
                raise ActionError(f"button {d.get('button')!r} is not on this desktop's mouse (left, right, wheel)")
            return Action("click", *self._point(d), button=button, hold=hold)
        if kind == "double_click":
            return Action("click", *self._point(d), clicks=2, hold=hold)
        if kind == "move":
            return Action("move", *self._point(d), hold=hold)
        if kind == "drag":
            path = d.get("path")
            if not isinstance(path, list) or len(path) < 2:
                raise ActionError(f"drag needs a path of at least 2 points, got {path!r}")
            # the desktop drags in a straight line: intermediate points are not replayed
            (x, y), (x2, y2) = self._point(path[0]), self._point(path[-1])
            return Action("drag", x, y, x2, y2, hold=hold)
        if kind == "scroll":
            x, y = self._point(d)
            px = self.opts.scroll_pixels_per_click
            dx, dy = _clicks(d.get("scroll_x", 0), px), -_clicks(d.get("scroll_y", 0), px)  # y > 0 scrolls down
            if not (dx or dy):
                raise ActionError("scroll of 0 pixels")
            return Action("scroll", x, y, dx=dx, dy=dy, hold=hold)
        if kind == "type":
            text = d.get("text")
            if not isinstance(text, str):
                raise ActionError("type needs text")
            return Action("type", text=text)
        if kind == "keypress":
            keys = d.get("keys")
            if not isinstance(keys, list) or not keys:
                raise ActionError(f"keypress needs a list of keys, got {keys!r}")
            names = tuple(_key(k) for k in keys)
            return Action("hotkey", keys=names) if len(names) > 1 else Action("key", keys=names)
        if kind == "wait":
            return Action("wait", seconds=self.opts.wait_seconds)
        if kind == "screenshot":
            return None
        raise ActionError(f"unknown action type {kind!r}")


def _key(name: Any) -> str:
    """OpenAI names keys in capitals ("CTRL", "Z"); a letter means its key, not a shifted one (as in
    OpenAI's own reference mapping to pyautogui, which lower-cases every key)."""
    if not isinstance(name, str):
        raise ActionError(f"a key must be a string, got {name!r}")
    return normalize_key(name.lower() if len(name) == 1 else name)


def _clicks(pixels: Any, per_click: float) -> int:
    if isinstance(pixels, bool) or not isinstance(pixels, (int, float)) or pixels != pixels:
        raise ActionError(f"scroll distance must be a number, got {pixels!r}")
    if not pixels:
        return 0
    clicks = round(abs(pixels) / per_click) or 1  # any scroll moves the wheel at least one click
    return int(clicks if pixels > 0 else -clicks)


class OpenAIChat:
    """One question about screenshots (the state verifier, a contextualizer) through the Responses API."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.opts = parse_options(OpenAIOptions, config)
        self.endpoint, self.client = _endpoint(config, self.opts)

    def complete(self, system: str, parts: list[Part]) -> tuple[str, Usage]:
        usage = Usage()
        content = [{"type": "input_text", "text": p.text} if isinstance(p, Text) else
                   {"type": "input_image", "image_url": data_url(encode_png(p.pixels)), "detail": "high"}
                   for p in parts if isinstance(p, (Text, Image))]
        kwargs: dict[str, Any] = {"model": self.opts.model, "instructions": system, "store": False,
                                  "input": [{"role": "user", "content": content}],
                                  "max_output_tokens": self.opts.max_tokens}
        if self.opts.temperature is not None:
            kwargs["temperature"] = self.opts.temperature
        if self.opts.reasoning_effort:
            kwargs["reasoning"] = {"effort": self.opts.reasoning_effort}
        with redacted_errors():  # what the API answers may quote the key: see .secrets
            response = self.endpoint.call(lambda: self.client.responses.create(**kwargs), usage)
        if response.usage is not None:
            usage.input_tokens += response.usage.input_tokens or 0
            usage.output_tokens += response.usage.output_tokens or 0
        usage.cost = price(usage, self.opts.prices)
        return redact((response.output_text or "").strip()), usage

    def close(self) -> None:
        self.client.close()
