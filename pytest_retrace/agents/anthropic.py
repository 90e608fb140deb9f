"""Claude computer use through the official ``anthropic`` SDK (Messages API).

Tool versions (``tool_version``):
- ``computer_20250124`` and ``computer_20251124``: the classic ``computer`` tool, one ``tool_use`` with
  ``input.action``, through ``client.beta.messages.create`` with the matching beta flag
  (``computer-use-2025-01-24`` / ``computer-use-2025-11-24``); the tool declares the screenshot size.
- ``computer_toolset_20260801`` (GA, no beta): a toolset entry; each action is its own ``tool_use`` whose
  ``name`` is the action, carrying ``toolset_name: computer``, which every ``tool_result`` echoes.

The default is ``computer_20251124``, the version of the paper's Claude Sonnet 4.6. Screenshots are scaled to
the configured limits (Anthropic's: 1568 px long edge, ~1.15 MP) and coordinates scaled back exactly
(:mod:`.images`). Several ``tool_use`` blocks in one reply run in order; when one cannot be completed the
rest are answered ``is_error`` and not run. A reply with no ``tool_use`` means Claude has finished. The
system prompt and the newest message carry ``cache_control`` (prompt caching).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from pytest_retrace.actions import Action, ActionError
from pytest_retrace.agents import AgentTurn, ModelConfig, Observation, Usage, parse_options
from pytest_retrace.agents.images import b64, crop_zoom, encode_png
from pytest_retrace.agents.llm import (
    Endpoint,
    ImageOptions,
    ModelAgent,
    ModelOptions,
    keys_of,
    redacted_errors,
    text_placeholder,
)
from pytest_retrace.agents.prompts import Image, Part, Text
from pytest_retrace.agents.secrets import redact

TOOL_BETAS = {
    "computer_20250124": "computer-use-2025-01-24",
    "computer_20251124": "computer-use-2025-11-24",
    "computer_toolset_20260801": None,
}
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicOptions(ModelOptions):
    model: str = "claude-sonnet-4-6"
    api_key_env: str | None = "ANTHROPIC_API_KEY"
    tool_version: Literal["computer_20250124", "computer_20251124", "computer_toolset_20260801"] = "computer_20251124"
    enable_zoom: bool = False  # computer_20251124 and the toolset: offer the zoom action
    thinking: Literal["enabled", "adaptive", "disabled"] = "disabled"
    thinking_budget: int = Field(4096, ge=1024, description="budget_tokens when thinking is enabled")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # output_config.effort
    max_tokens: int = Field(16384, ge=1)
    cache: bool = True  # prompt caching: cache_control on the system prompt and the newest message

    @field_validator("temperature")
    @classmethod
    def _no_temperature(cls, value: float | None) -> None:
        if value is not None:
            raise ValueError("the Messages API takes no temperature since anthropic SDK 2 (sampling is the "
                             "model's own; thinking and effort are its settings): remove it")
        return None
    # Anthropic's limits before Opus 4.7 (later models take 2576 px): the API would scale a bigger image
    # itself, and the model's coordinates would then be in a size this harness never saw
    image: ImageOptions = ImageOptions(max_long_edge=1568, max_pixels=1_150_000)


def _sdk() -> Any:
    import anthropic

    return anthropic


def _endpoint(config: ModelConfig, opts: ModelOptions) -> tuple[Endpoint, Any]:
    sdk = _sdk()
    endpoint = Endpoint(config, opts, "anthropic", "https://api.anthropic.com", "ANTHROPIC_BASE_URL",
                        (sdk.APIConnectionError, sdk.APITimeoutError), (sdk.APIError,))
    # the SDK's retries stay off: the transport retries without holding a concurrency slot
    client = sdk.Anthropic(api_key=endpoint.api_key, base_url=endpoint.base_url, max_retries=0,
                           timeout=opts.transport.timeout)
    return endpoint, client


def _content(parts: list[Part], png: Any, track: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, Text):
            out.append({"type": "text", "text": part.text})
        else:
            block = _image(png(part.pixels))
            out.append(block)
            if part.past or part is parts[-1]:  # history and the current screen; never the target
                track(block)
    return out


def _image(png: bytes) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png)}}


@dataclass
class _Pending:
    """A tool_use of the last reply, waiting for its tool_result."""

    id: str
    toolset: bool
    action_index: int | None  # its place in the turn's actions; None for a request to look
    look: tuple[str, Any] | None = None  # ("screenshot" | "cursor" | "zoom", region)
    error: str | None = None  # the reply was invalid: every tool_use is answered with this


class AnthropicAgent(ModelAgent):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, AnthropicOptions)
        self.opts: AnthropicOptions
        self.endpoint, self.client = _endpoint(config, self.opts)
        self._system: list[dict[str, Any]] = []
        self._messages: list[dict[str, Any]] = []
        self._pending: list[_Pending] = []

    # -- steps ---------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        assert self.ctx is not None
        system = {"type": "text", "text": self.prompts.system(self.ctx, **self.prompt_values())}
        if self.opts.cache:
            system["cache_control"] = _EPHEMERAL
        self._system, self._messages, self._pending = [system], [], []

    def _observe(self, obs: Observation) -> None:
        assert self.ctx is not None and self.scaler is not None
        if not self._messages:
            parts = self.prompts.opening(self.ctx, obs.screenshot, self.describe, **self.prompt_values())
            self._messages.append({"role": "user", "content": _content(parts, self.scaler.png, self._track)})
            return
        self._messages.append({"role": "user", "content": self._answers(obs)})

    def _answers(self, obs: Observation | None) -> list[dict[str, Any]]:
        """tool_results for every pending tool_use; the last one carries the current screen."""
        results = []
        for p in self._pending:
            content: list[dict[str, Any]] = []
            error = p.error
            if error is None and p.action_index is not None and obs is not None and obs.executed is not None:
                if p.action_index == obs.executed and obs.failure:
                    error = obs.failure
                elif p.action_index > obs.executed:
                    error = "not run: an earlier action of this turn could not be completed"
            if error is None and p.look and obs is not None:
                content = self._look(p.look, obs)
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": p.id,
                                      "content": [{"type": "text", "text": error or "done"}] + content}
            if error:
                result["is_error"] = True
            if p.toolset:
                result["toolset_name"] = "computer"
            results.append(result)
        if results and obs is not None:
            shot = _image(self.scaler.png(obs.screenshot))  # type: ignore[union-attr]
            results[-1]["content"].append(shot)
            self._track(shot)
        self._pending = []
        return results or [{"type": "text", "text": "Continue."}]

    def _look(self, look: tuple[str, Any], obs: Observation) -> list[dict[str, Any]]:
        assert self.scaler is not None
        kind, region = look
        if kind == "cursor" and obs.cursor is not None:
            x, y = self.scaler.to_model(*obs.cursor)
            return [{"type": "text", "text": f"X={x},Y={y}"}]
        if kind == "zoom":
            (x0, y0), (x1, y1) = region  # screen pixels
            crop = crop_zoom(obs.screenshot, (x0, y0, x1 + 1, y1 + 1), self.scaler.image)
            return [_image(encode_png(crop))]
        return []  # a screenshot: the current screen goes with the last result anyway

    def _ask(self, usage: Usage) -> Any:
        opts = self.opts
        if opts.cache:  # one moving breakpoint on the newest block, besides the system prompt's
            for message in self._messages:
                for block in message["content"]:
                    block.pop("cache_control", None)
            self._messages[-1]["content"][-1]["cache_control"] = _EPHEMERAL
        kwargs: dict[str, Any] = {"model": opts.model, "max_tokens": opts.max_tokens, "system": self._system,
                                  "messages": self._messages, "tools": [self._tool()]}
        if opts.thinking == "enabled":
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": opts.thinking_budget}
        elif opts.thinking == "adaptive":
            kwargs["thinking"] = {"type": "adaptive"}
        if opts.effort:
            kwargs["output_config"] = {"effort": opts.effort}
        beta = TOOL_BETAS[opts.tool_version]
        if beta:
            response = self.endpoint.call(lambda: self.client.beta.messages.create(betas=[beta], **kwargs), usage)
        else:
            response = self.endpoint.call(lambda: self.client.messages.create(**kwargs), usage)
        u = response.usage
        usage.input_tokens += u.input_tokens or 0
        usage.output_tokens += u.output_tokens or 0
        usage.cache_read_tokens += getattr(u, "cache_read_input_tokens", None) or 0
        usage.cache_write_tokens += getattr(u, "cache_creation_input_tokens", None) or 0
        self._messages.append({"role": "assistant",
                               "content": [b.model_dump(mode="json", exclude_none=True) for b in response.content]})
        return response

    def _tool(self) -> dict[str, Any]:
        assert self.scaler is not None
        version = self.opts.tool_version
        if version == "computer_toolset_20260801":
            tool: dict[str, Any] = {"type": version}
            if not self.opts.enable_zoom:
                tool["configs"] = {"zoom": {"enabled": False}}
            return tool
        w, h = self.scaler.image
        tool = {"type": version, "name": "computer", "display_width_px": w, "display_height_px": h}
        if version == "computer_20251124" and self.opts.enable_zoom:
            tool["enable_zoom"] = True
        return tool

    def _read(self, response: Any) -> AgentTurn:
        uses = [b for b in response.content if getattr(b, "type", None) == "tool_use"]
        rationale = self._rationale(response)
        self._pending = [_Pending(u.id, getattr(u, "toolset_name", None) is not None, None) for u in uses]
        if not uses:
            if response.stop_reason == "max_tokens":
                raise ActionError("the reply was cut off at max_tokens before any action")
            return AgentTurn([Action("done")], rationale)
        actions: list[Action] = []
        for use, pending in zip(uses, self._pending):
            name, data = self._name_and_input(use)
            try:
                got = self._map(name, data)
            except ActionError as exc:
                raise ActionError(f"tool_use {use.id} ({name}): {exc}") from None
            if isinstance(got, Action):
                pending.action_index = len(actions)
                actions.append(got)
            else:
                pending.look = got
        return AgentTurn(actions, rationale)

    def _complain(self, response: Any, message: str) -> None:
        for p in self._pending:
            p.error = f"invalid: {message}"
        content = self._answers(None) if self._pending else [{"type": "text", "text": f"Your reply could not be "
                                                                                        f"used: {message}"}]
        self._messages.append({"role": "user", "content": content})

    def _invalid(self, reply: Any, message: str, usage: Usage) -> AgentTurn:
        for p in self._pending:  # answered at the next observation, with the screen
            p.error = f"invalid: {message}"
        return super()._invalid(reply, message, usage)

    def _rationale(self, response: Any) -> str:
        texts = [b.text for b in response.content if getattr(b, "type", None) == "text"]
        if not texts:
            texts = [b.thinking for b in response.content if getattr(b, "type", None) == "thinking" and b.thinking]
        return "\n".join(texts).strip()[:4000]

    def _track(self, block: dict[str, Any]) -> None:
        self.track_image(block, text_placeholder)

    # -- one action -----------------------------------------------------------------------------------------
    def _name_and_input(self, use: Any) -> tuple[str, dict[str, Any]]:
        data = use.input if isinstance(use.input, dict) else getattr(use.input, "model_dump", lambda **_: None)(
            exclude_none=True)
        if not isinstance(data, dict):
            raise ActionError(f"a tool_use input must be an object, got {use.input!r}")
        if getattr(use, "toolset_name", None) is not None:  # toolset: the tool's name is the action
            return use.name, data
        if use.name != "computer":
            raise ActionError(f"unknown tool {use.name!r}")
        action = data.get("action")
        if not isinstance(action, str):
            raise ActionError("the computer tool needs an `action`")
        return action, {k: v for k, v in data.items() if k != "action"}

    def _point(self, value: Any, what: str = "coordinate") -> tuple[int, int]:
        assert self.scaler is not None
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ActionError(f"{what} must be [x, y], got {value!r}")
        return self.scaler.to_screen(value[0], value[1])

    def _map(self, name: str, d: dict[str, Any]) -> Action | tuple[str, Any]:
        """One Claude action -> an Action in screen coordinates, or a request to look."""
        point = self._point(d["coordinate"]) if d.get("coordinate") is not None else (None, None)
        hold = keys_of(d["text"]) if name not in ("type", "key", "hold_key") and d.get("text") else ()
        clicks = {"left_click": ("left", 1), "right_click": ("right", 1), "middle_click": ("middle", 1),
                  "double_click": ("left", 2), "triple_click": ("left", 3)}
        if name in clicks:
            button, n = clicks[name]
            return Action("click", *point, button=button, clicks=n, hold=hold)
        if name == "mouse_move":
            if point[0] is None:
                raise ActionError("mouse_move needs a coordinate")
            return Action("move", *point, hold=hold)
        if name == "left_click_drag":
            x2, y2 = self._point(d.get("coordinate"))
            start = self._point(d["start_coordinate"], "start_coordinate") if d.get("start_coordinate") else (None, None)
            return Action("drag", *start, x2=x2, y2=y2, hold=hold)
        if name in ("left_mouse_down", "left_mouse_up"):
            return Action("mouse_down" if name.endswith("down") else "mouse_up", *point, hold=hold)
        if name == "scroll":
            amount, direction = d.get("scroll_amount"), d.get("scroll_direction")
            if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
                raise ActionError(f"scroll_amount must be a positive integer, got {amount!r}")
            # (a list or a mapping from the model is no key of this table: dict.get would raise, not miss)
            sign = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}.get(direction) \
                if isinstance(direction, str) else None
            if sign is None:
                raise ActionError(f"scroll_direction must be up, down, left or right, got {direction!r}")
            return Action("scroll", *point, dx=sign[0] * amount, dy=sign[1] * amount, hold=hold)
        if name == "type":
            return Action("type", text=_str(d.get("text"), "text"))
        if name == "key":
            repeat = d.get("repeat") or 1
            chords = [keys_of(c) for c in _str(d.get("text"), "text").split()]
            if not chords:
                raise ActionError("key needs a key name")
            if len(chords) == 1 and len(chords[0]) > 1:
                return Action("hotkey", keys=chords[0], presses=repeat)
            if all(len(c) == 1 for c in chords):
                return Action("key", keys=tuple(c[0] for c in chords), presses=repeat)
            raise ActionError(f"several chords in one key action: {d.get('text')!r}; send one per action")
        if name == "hold_key":
            return Action("hotkey", keys=keys_of(_str(d.get("text"), "text")), seconds=_seconds(d.get("duration")))
        if name == "wait":
            return Action("wait", seconds=_seconds(d.get("duration")))
        if name == "screenshot":
            return ("screenshot", None)
        if name == "cursor_position":
            return ("cursor", None)
        if name == "zoom":
            region = d.get("region")
            if not isinstance(region, (list, tuple)) or len(region) != 4:
                raise ActionError(f"zoom needs region [x0, y0, x1, y1], got {region!r}")
            corners = self._point(region[:2], "region"), self._point(region[2:], "region")  # bounds checked
            if not (corners[0][0] < corners[1][0] and corners[0][1] < corners[1][1]):
                raise ActionError(f"zoom region {list(region)} is empty")
            return ("zoom", corners)
        raise ActionError(f"unknown action {name!r}")


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{what} must be a string, got {value!r}")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ActionError(f"duration must be a non-negative number of seconds, got {value!r}")
    return float(value)


class AnthropicChat:
    """One question about screenshots (the contextualizer, the state verifier) through the Messages API."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.opts = parse_options(AnthropicOptions, config)
        self.endpoint, self.client = _endpoint(config, self.opts)

    def complete(self, system: str, parts: list[Part]) -> tuple[str, Usage]:
        from pytest_retrace.agents.images import Scaler

        usage = Usage()
        content = []
        for part in parts:
            if isinstance(part, Image):
                scaler = Scaler.build((part.pixels.shape[1], part.pixels.shape[0]),
                                      max_long_edge=self.opts.image.max_long_edge, max_pixels=self.opts.image.max_pixels)
                content.append(_image(scaler.png(part.pixels)))
            else:
                content.append({"type": "text", "text": part.text})
        kwargs: dict[str, Any] = {"model": self.opts.model, "max_tokens": self.opts.max_tokens,
                                  "system": system, "messages": [{"role": "user", "content": content}]}
        with redacted_errors():  # what the API answers may quote the key: see .secrets
            response = self.endpoint.call(lambda: self.client.messages.create(**kwargs), usage)
        usage.input_tokens += response.usage.input_tokens or 0
        usage.output_tokens += response.usage.output_tokens or 0
        from pytest_retrace.agents.transport import price

        usage.cost = price(usage, self.opts.prices)
        return redact("\n".join(b.text for b in response.content if getattr(b, "type", None) == "text").strip()), usage

    def close(self) -> None:
        self.client.close()
