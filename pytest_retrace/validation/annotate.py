"""The annotation page's app (``retrace annotate STUDY``): people answer the paper's two questions (B.3) about the
samples of a study's plan, blind to the oracle's verdict.

A :class:`Study` holds the plan, the samples it names (built by validation.samples) and every answer given so
far, read back from <study>/annotations/<who>.jsonl at start: a restarted server resumes where each annotator
stopped. An answer is acknowledged only once its line is on disk (one write, flush, fsync, under a lock), so a
closed tab or a killed server loses nothing acknowledged. Bad input changes nothing: an unknown annotator or
sample, or a sample not assigned to that annotator, is a 404; a second answer to the same sample a 409; a body
that is not an answer a 422.

What the page gets of a sample is Sample.shown() less what would hint at the verdict or point into the machine:
no oracle, no model, strategy or test id (they name the agent: "oracle", "noop"), no file paths. Images are
served by sample id and one of five fixed names; the two computed ones (the differences and the SSIM map of
the recovered screen against the target) are cached in <study>/cache/.
"""

from __future__ import annotations

import hmac
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from pytest_retrace.validation.files import ANNOTATIONS, Annotation, Plan, annotations_file
from pytest_retrace.validation.samples import Sample, SampleError, load_samples
from pytest_retrace.validation.verdicts import VerdictError, read_annotations

PAGE = Path(__file__).with_name("annotate_page")
STATIC = {"page.js": "text/javascript", "page.css": "text/css"}
GUIDELINE = PAGE / "guideline.md"
CACHE = "cache"
IMAGES = ("target", "error", "recovered", "diff", "heatmap")
_HIDDEN = {"target", "error", "recovered", "model", "strategy", "budget", "run", "run_index", "nodeid", "case"}


class StudyError(ValueError):
    """A study that cannot be served; the message names the file."""


class Answer(BaseModel):
    """The body of POST /api/answers: strict, so that "yes" or 1 is a 422, not a guess."""

    model_config = ConfigDict(extra="forbid")
    annotator: str
    sample: str
    recovered: StrictBool
    environmental_only: StrictBool | None
    note: str = Field(default="", max_length=2000)


class Study:
    def __init__(self, study: Path) -> None:
        self.root = study
        try:
            self.plan = Plan.read(study)
        except ValueError as exc:
            raise StudyError(str(exc)) from None
        self.samples: dict[str, Sample] = {}
        for run in self.plan.runs:
            try:
                self.samples.update((s.id, s) for s in load_samples(Path(run)))
            except SampleError as exc:
                raise StudyError(f"{study / 'plan.json'}: run {run}: {exc}") from None
        missing = [p.sample for p in self.plan.samples if p.sample not in self.samples]
        if missing:
            raise StudyError(f"{study / 'plan.json'}: sample(s) {', '.join(missing)} not among its runs' finished tests")
        self.assigned = {who: [p.sample for p in self.plan.for_annotator(who)] for who in self.plan.annotators}
        self.answered = self._read_answers()
        self.lock = threading.Lock()

    def _read_answers(self) -> dict[str, set[str]]:
        """Per annotator, the samples answered (verdicts.read_annotations: every line checked against the plan).
        A last line without its newline was cut by a kill mid-write: it was never acknowledged, so it is cut off
        the file first, for the next answer's line to start clean."""
        for who in self.plan.annotators:
            path = annotations_file(self.root, who)
            data = path.read_bytes() if path.is_file() else b""
            if data and not data.endswith(b"\n"):
                with path.open("r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
                    os.fsync(f.fileno())
        try:
            given = read_annotations(self.root, self.plan)
        except VerdictError as exc:
            raise StudyError(str(exc)) from None
        return {who: {s for s, by in given.items() if who in by} for who in self.plan.annotators}

    # -- what the page reads
    def next_for(self, who: str) -> dict[str, Any]:
        todo = [s for s in self.assigned[who] if s not in self.answered[who]]
        return {"annotator": who, "sample": todo[0] if todo else None, "done": len(self.answered[who]),
                "total": len(self.assigned[who])}

    def view(self, sample_id: str) -> dict[str, Any]:
        sample = self.samples[sample_id]
        shown = {k: v for k, v in sample.shown().items() if k not in _HIDDEN}
        shown["images"] = {name: self.image_available(sample, name) for name in IMAGES}
        return shown

    # -- images
    def image_available(self, sample: Sample, name: str) -> bool:
        return sample.recovered is not None if name in ("recovered", "diff", "heatmap") else True

    def image(self, sample_id: str, name: str) -> Path:
        """The PNG of one of IMAGES for a sample; the computed ones made once, atomically, into the cache."""
        sample = self.samples[sample_id]
        if name in ("target", "error"):
            return getattr(sample, name)
        if sample.recovered is None:
            raise FileNotFoundError(f"sample {sample_id}: the run kept no image of the recovered screen")
        if name == "recovered":
            return sample.recovered
        out = self.root / CACHE / sample_id / f"{name}.png"
        if not out.is_file():
            _write_png(out, _computed(name, sample.target, sample.recovered))
        return out

    # -- answers
    def add(self, answer: Answer) -> Annotation:
        """Append the answer's line, flushed and fsynced, before it counts; KeyError / ValueError: nothing written."""
        if answer.sample not in self.assigned[answer.annotator]:
            raise KeyError(f"sample {answer.sample!r} is not assigned to {answer.annotator!r}")
        record = Annotation(sample=answer.sample, annotator=answer.annotator, recovered=answer.recovered,
                            environmental_only=answer.environmental_only, note=answer.note)
        with self.lock:
            if answer.sample in self.answered[answer.annotator]:
                raise ValueError(f"{answer.annotator} has already answered sample {answer.sample}; answers are final")
            path = annotations_file(self.root, answer.annotator)
            new = not path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as f:
                f.write((record.model_dump_json() + "\n").encode("utf-8"))  # one write: a line is whole or cut
                f.flush()
                os.fsync(f.fileno())
            if new:  # the file's name in its directory is durable too
                fd = os.open(self.root / ANNOTATIONS, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self.answered[answer.annotator].add(answer.sample)
        return record


def _computed(name: str, target: Path, recovered: Path) -> np.ndarray:
    from PIL import Image

    from pytest_retrace.screen.similarity import diff_image, ssim_heatmap

    a = np.asarray(Image.open(target).convert("RGB"))
    b = np.asarray(Image.open(recovered).convert("RGB"))
    if a.shape != b.shape:
        raise FileNotFoundError(f"the target ({a.shape[1]}x{a.shape[0]}) and the recovered screen "
                                f"({b.shape[1]}x{b.shape[0]}) differ in size: no {name} image")
    # no masks: a person judges every difference, a clock's included (that is the environmental question)
    return diff_image(a, b) if name == "diff" else ssim_heatmap(a, b)


def _write_png(out: Path, pixels: np.ndarray) -> None:
    from PIL import Image

    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(out)  # two requests computing it at once both write whole files; either wins


def create_app(study: Study, token: str | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def annotator(request: Request) -> str | None:
        who = request.query_params.get("annotator", "")
        return who if who in study.assigned else None

    def page(request: Request) -> Response:
        return HTMLResponse((PAGE / "index.html").read_text(encoding="utf-8"))

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return error(404, f"no static file {name!r}")
        return FileResponse(PAGE / name, media_type=STATIC[name])

    def guideline(request: Request) -> Response:
        return PlainTextResponse(GUIDELINE.read_text(encoding="utf-8"), media_type="text/markdown")

    def about(request: Request) -> Response:
        return JSONResponse({"annotators": study.plan.annotators, "samples": len(study.plan.samples)})

    def next_sample(request: Request) -> Response:
        who = annotator(request)
        if who is None:
            return error(404, f"unknown annotator {request.query_params.get('annotator', '')!r}; the plan has "
                              f"{', '.join(study.plan.annotators)}")
        return JSONResponse(study.next_for(who))

    def sample(request: Request) -> Response:
        sid = request.path_params["sample"]
        if sid not in study.samples:
            return error(404, f"unknown sample {sid!r}")
        return JSONResponse(study.view(sid))

    def image(request: Request) -> Response:
        sid, name = request.path_params["sample"], request.path_params["name"]
        if sid not in study.samples:
            return error(404, f"unknown sample {sid!r}")
        if name not in IMAGES:
            return error(404, f"unknown image {name!r}: one of {', '.join(IMAGES)}")
        try:
            path = study.image(sid, name)
        except (FileNotFoundError, OSError) as exc:
            return error(404, str(exc))
        return FileResponse(path, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})

    async def answer(request: Request) -> Response:
        body = await request.body()
        try:
            parsed = Answer.model_validate_json(body)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            return error(422, f"not an answer ({problems}); expected JSON {{annotator, sample, recovered: true|false, "
                              "environmental_only: true|false|null, note}")
        if parsed.annotator not in study.assigned:
            return error(404, f"unknown annotator {parsed.annotator!r}")
        if parsed.sample not in study.samples:
            return error(404, f"unknown sample {parsed.sample!r}")
        from starlette.concurrency import run_in_threadpool

        try:
            await run_in_threadpool(study.add, parsed)  # the fsync off the event loop
        except KeyError as exc:
            return error(404, str(exc.args[0]))
        except ValueError as exc:
            return error(409, str(exc))
        return JSONResponse(study.next_for(parsed.annotator), status_code=201)

    routes = [
        Route("/", page), Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/static/{name}", static), Route("/api/guideline", guideline),
        Route("/api/study", about), Route("/api/next", next_sample), Route("/api/samples/{sample}", sample),
        Route("/api/samples/{sample}/images/{name}", image), Route("/api/answers", answer, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    return TokenCheck(app, token) if token else app


class TokenCheck:
    """Every request needs the token when one is set (a non-loopback host): header ``X-Retrace-Token`` or
    query parameter ``token`` (the page's first URL carries it; its script passes it on)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from urllib.parse import parse_qs

        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-retrace-token") or \
            (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token") or [""])[0].encode()
        if given and hmac.compare_digest(given, self.token):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": "a token is required: header X-Retrace-Token or ?token=..."}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
