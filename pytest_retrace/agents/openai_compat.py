"""Open models behind any OpenAI-compatible chat endpoint (vLLM, llama.cpp's server, SGLang...), through the
official ``openai`` SDK's chat completions.

The model answers in text, read by the configured ``parser`` (all in :mod:`pytest_retrace.actions`, all
ending in the same whitelisted :class:`Action`, none executing anything):
- ``uitars``: UI-TARS-1.5's ``Thought: ... / Action: click(start_box='(x,y)')``;
- ``qwen``: Qwen-VL's ``computer_use`` function calls (``<tool_call>{...}</tool_call>``);
- ``pyautogui``: EvoCUA / OSWorld-style pyautogui code blocks (``WAIT`` / ``DONE`` / ``FAIL``).
Coordinates are in the space the config names (``image.coordinates``: the image, Qwen2.5-VL's smart-resize
of it, or a 0–1000 grid) and are scaled to the screen exactly. Each turn is one user message with the
new screenshot; older screenshots beyond ``max_screenshots`` become a placeholder text.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pytest_retrace.actions import Action, ParsedReply
from pytest_retrace.agents import AgentTurn, ModelConfig, Observation, Usage, parse_options
from pytest_retrace.agents.images import data_url, encode_png
from pytest_retrace.agents.llm import Endpoint, ModelAgent, ModelOptions, redacted_errors, text_placeholder
from pytest_retrace.agents.prompts import Image, Part, Text
from pytest_retrace.agents.secrets import redact
from pytest_retrace.agents.transport import price


class CompatOptions(ModelOptions):
    parser: Literal["uitars", "qwen", "pyautogui"] = "pyautogui"
    base_url: str | None = "http://127.0.0.1:8000/v1"
    top_p: float | None = Field(None, gt=0, le=1)
    extra_body: dict[str, Any] = {}  # server-specific sampling fields (vLLM's top_k, repetition_penalty...)
    scroll_clicks: int = Field(5, ge=1, le=100, description="uitars: wheel clicks per scroll")
    wait_seconds: float = Field(5.0, ge=0, le=60, description="uitars: what wait() waits")
    pixels_per_click: float = Field(1.0, gt=0, description="qwen: the `pixels` of a scroll per wheel click")


def _endpoint(config: ModelConfig, opts: CompatOptions) -> tuple[Endpoint, Any]:
    import openai

    # a local server usually takes any key: a missing variable is not an error here
    endpoint = Endpoint(config, opts, "openai-compat", "http://127.0.0.1:8000/v1", None,
                        (openai.APIConnectionError, openai.APITimeoutError), (openai.APIError,), key_required=False)
    client = openai.OpenAI(api_key=endpoint.api_key or "EMPTY", base_url=endpoint.base_url, max_retries=0,
                           timeout=opts.transport.timeout)
    return endpoint, client


def _usage(response: Any, usage: Usage) -> None:
    u = getattr(response, "usage", None)
    if u is None:
        return
    cached = getattr(getattr(u, "prompt_tokens_details", None), "cached_tokens", 0) or 0
    usage.input_tokens += (u.prompt_tokens or 0) - cached
    usage.cache_read_tokens += cached
    usage.output_tokens += u.completion_tokens or 0


class CompatAgent(ModelAgent):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, CompatOptions)
        self.opts: CompatOptions
        self.endpoint, self.client = _endpoint(config, self.opts)
        self._messages: list[dict[str, Any]] = []
        self._note: str | None = None

    def _reset(self) -> None:
        assert self.ctx is not None
        self._messages = [{"role": "system", "content": self.prompts.system(self.ctx, **self.prompt_values())}]
        self._note = None

    def _observe(self, obs: Observation) -> None:
        assert self.ctx is not None and self.scaler is not None
        if len(self._messages) == 1:
            parts = self.prompts.opening(self.ctx, obs.screenshot, self.describe, **self.prompt_values())
        else:
            notes = [n for n in (self._note, obs.failure and f"That did not work: {obs.failure}") if n]
            parts = [Text(n) for n in notes] + [Text("The current screen:"), Image(obs.screenshot)]
        self._note = None
        content: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, Text):
                content.append({"type": "text", "text": part.text})
            else:
                block = {"type": "image_url", "image_url": {"url": data_url(self.scaler.png(part.pixels))}}
                content.append(block)
                if part.past or part is parts[-1]:  # history and the current screen; never the target
                    self.track_image(block, text_placeholder)
        self._messages.append({"role": "user", "content": content})

    def _ask(self, usage: Usage) -> Any:
        opts = self.opts
        kwargs: dict[str, Any] = {"model": opts.model, "messages": self._messages, "max_tokens": opts.max_tokens}
        if opts.temperature is not None:
            kwargs["temperature"] = opts.temperature
        if opts.top_p is not None:
            kwargs["top_p"] = opts.top_p
        if opts.extra_body:
            kwargs["extra_body"] = opts.extra_body
        response = self.endpoint.call(lambda: self.client.chat.completions.create(**kwargs), usage)
        _usage(response, usage)
        message = response.choices[0].message if response.choices else None
        text = (getattr(message, "content", None) or "") if message is not None else ""
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in (getattr(message, "tool_calls", None) or []) if getattr(c, "function", None)]
        # what the model said, as text (a server-parsed tool call goes back in Qwen's own tag form)
        echo = text + "".join(f'\n<tool_call>\n{{"name": "{c["name"]}", "arguments": {c["arguments"]}}}\n</tool_call>'
                              for c in calls)
        self._messages.append({"role": "assistant", "content": echo})
        return text, calls

    def _read(self, reply: tuple[str, list[dict[str, Any]]]) -> AgentTurn:
        parsed = self._parse(reply)
        if not parsed.actions:
            return AgentTurn([Action("done")], parsed.rationale)  # qwen: a reply without a call ends the run
        return AgentTurn([self.to_screen(a) for a in parsed.actions], parsed.rationale)

    def _parse(self, reply: tuple[str, list[dict[str, Any]]]) -> ParsedReply:
        text, calls = reply
        opts = self.opts
        if opts.parser == "uitars":
            from pytest_retrace.actions.uitars import parse_uitars

            return parse_uitars(text, scroll_clicks=opts.scroll_clicks, wait_seconds=opts.wait_seconds)
        if opts.parser == "qwen":
            from pytest_retrace.actions.qwen import parse_qwen

            return parse_qwen(text, calls or None, pixels_per_click=opts.pixels_per_click)
        from pytest_retrace.actions.pyautogui_reply import parse_pyautogui_reply

        return parse_pyautogui_reply(text)

    def _complain(self, reply: Any, message: str) -> None:
        self._messages.append({"role": "user", "content": [{"type": "text", "text": (
            f"Your reply could not be used: {message}. Answer again in the required format.")}]})

    def _invalid(self, reply: Any, message: str, usage: Usage) -> AgentTurn:
        self._note = f"Your last reply could not be used, so nothing was done: {message}"
        return super()._invalid(reply, message, usage)

    def _rationale(self, reply: Any) -> str:
        return str(reply[0]).strip()[:4000]


class CompatChat:
    """One question about screenshots through an OpenAI-compatible chat endpoint."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.opts = parse_options(CompatOptions, config)
        self.endpoint, self.client = _endpoint(config, self.opts)

    def complete(self, system: str, parts: list[Part]) -> tuple[str, Usage]:
        usage = Usage()
        content = [{"type": "text", "text": p.text} if isinstance(p, Text) else
                   {"type": "image_url", "image_url": {"url": data_url(encode_png(p.pixels))}} for p in parts]
        kwargs: dict[str, Any] = {"model": self.opts.model, "max_tokens": self.opts.max_tokens,
                                  "messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": content}]}
        if self.opts.temperature is not None:
            kwargs["temperature"] = self.opts.temperature
        with redacted_errors():  # what the API answers may quote the key: see .secrets
            response = self.endpoint.call(lambda: self.client.chat.completions.create(**kwargs), usage)
        _usage(response, usage)
        usage.cost = price(usage, self.opts.prices)
        message = response.choices[0].message if response.choices else None
        return redact(((message.content if message is not None else None) or "").strip()), usage

    def close(self) -> None:
        self.client.close()
