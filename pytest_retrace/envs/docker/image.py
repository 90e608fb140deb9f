"""The docker provider's desktop image, built on the engine from the recipe in ``envs/docker/desktop-image/``.

No registry is assumed reachable, so the base is made here too, in two content-addressed layers:

1. **base** ``pytest-retrace-base:<hash>``: ``mmdebstrap`` makes a Debian bookworm root filesystem with
   ``packages.txt`` from this machine's apt sources, a user ``user`` (uid 1000) and the ``/opt/retrace`` venv
   with ``requirements.txt`` (wheels made on this machine with pip, installed offline in the root filesystem);
   the tar is kept in the cache directory and ``docker import``-ed into each engine that lacks it.
2. **desktop** ``pytest-retrace-desktop:<hash>``: the ``Dockerfile`` adds this package's code and the task's
   home template (envs/home-template) on top.

A tag names its inputs' hash (the recipe files, and for the desktop the package's source), so an image that
exists is the image these files describe and is reused, and a changed recipe or source builds a new one.
Builds take a file lock per engine: sixteen xdist workers starting at once build once.

**Variants** add Debian packages to the base (``VARIANTS``): ``osworld`` is ``packages.txt`` plus
``packages-osworld.txt`` (OSWorld's apps: GIMP, Impress, Thunderbird, VLC), as ``pytest-retrace-base-osworld``
and ``pytest-retrace-desktop-osworld``. The default variant's inputs, and so its tags, are what they were before
variants existed: choosing another one never rebuilds or replaces the default image.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_retrace import cachedir
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.desktop import TEMPLATE

RECIPE = Path(__file__).with_name("desktop-image")
PACKAGE = Path(__file__).resolve().parents[2]  # the pytest_retrace package copied into the image
BASE_REPO = "pytest-retrace-base"
DESKTOP_REPO = "pytest-retrace-desktop"
SUITE = "bookworm"
BUILD_TIMEOUT = 1800.0
# A variant's extra package lists, read after packages.txt (the docker provider's `variant` option).
VARIANTS: dict[str, tuple[str, ...]] = {"default": (), "osworld": ("packages-osworld.txt",)}


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {', '.join(VARIANTS)} (the package lists in {RECIPE})")
    return variant


def _repository(repo: str, variant: str) -> str:
    return repo if variant == "default" else f"{repo}-{check_variant(variant)}"


def cache_dir() -> Path:
    path = cachedir.root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _lines(name: str) -> list[str]:
    text = (RECIPE / name).read_text(encoding="utf-8")
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _source_files() -> Iterator[tuple[str, Path]]:
    """(name in the build context, file): the package without caches, and the home template."""
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            yield f"pytest_retrace/{path.relative_to(PACKAGE).as_posix()}", path
    for path in sorted(TEMPLATE.rglob("*")):
        if path.is_file():
            yield f"home/{path.relative_to(TEMPLATE).as_posix()}", path


def _package_lists(variant: str) -> tuple[str, ...]:
    return ("packages.txt", *VARIANTS[check_variant(variant)])


def base_tag(variant: str = "default") -> str:
    # the default's inputs exactly as before variants: its existing base and desktop images stay valid
    recipe = [(RECIPE / n).read_bytes() for n in ("packages.txt", "requirements.txt", *VARIANTS[check_variant(variant)])]
    return f"{_repository(BASE_REPO, variant)}:{_digest(SUITE.encode(), *recipe, *(h.encode() for h in _HOOKS))}"


def desktop_tag(variant: str = "default") -> str:
    parts = [base_tag(variant).encode(), (RECIPE / "Dockerfile").read_bytes()]
    for name, path in _source_files():
        parts += [name.encode(), path.read_bytes()]
    return f"{_repository(DESKTOP_REPO, variant)}:{_digest(*parts)}"


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    with open(cache_dir() / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel however this process ends
        yield


def _has(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(client: Any, engine: str = "local", variant: str = "default") -> str:
    """The desktop image's tag on `client`'s engine, built first if it is not there (EnvError if it cannot be)."""
    tag = desktop_tag(variant)
    if _has(client, tag):
        return tag
    with _locked("build-" + hashlib.sha256(engine.encode()).hexdigest()[:12]):
        if _has(client, tag):  # another worker built it while we waited
            return tag
        base = base_tag(variant)
        if not _has(client, base):
            tar = _base_tar(base, variant)
            repository, _, version = base.partition(":")
            client.api.import_image_from_file(str(tar), repository=repository, tag=version)
            if not _has(client, base):
                raise EnvError(f"docker import of {tar} did not give {base}")
        _build_desktop(client, base, tag)
    return tag


def _base_tar(tag: str, variant: str = "default") -> Path:
    """The base root filesystem as a tar in the cache (made with mmdebstrap when missing)."""
    out = cache_dir() / f"{tag.replace(':', '-')}.tar"
    with _locked("base"):
        if out.exists():
            return out
        if shutil.which("mmdebstrap") is None:
            raise EnvError("the docker provider's base image is missing and mmdebstrap is not installed to make it "
                           "(apt install mmdebstrap, as root), or give the option image=NAME of a desktop image "
                           f"built from {RECIPE}")
        with tempfile.TemporaryDirectory(prefix="retrace-image-") as tmp:
            wheels = Path(tmp) / "wheels"
            _wheels(wheels)
            partial = out.with_suffix(".partial")
            argv = ["mmdebstrap", "--variant=apt", "--quiet", "--format=tar",
                    "--include=" + ",".join(p for name in _package_lists(variant) for p in _lines(name)),
                    f"--customize-hook=copy-in {wheels} /tmp", *(f"--customize-hook={h}" for h in _HOOKS),
                    SUITE, str(partial)]
            res = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
            if res.returncode != 0:
                partial.unlink(missing_ok=True)
                raise EnvError(f"mmdebstrap exited {res.returncode}: {res.stderr.strip()[-1500:]}")
            partial.rename(out)
        repository = tag.partition(":")[0]
        for old in out.parent.glob(f"{repository}-*.tar"):
            # an earlier recipe's of this variant (0.8 GB and more each); another variant's tar is not one
            if old != out and re.fullmatch(rf"{re.escape(repository)}-[0-9a-f]{{16}}\.tar", old.name):
                old.unlink(missing_ok=True)
    return out


# Run in the root filesystem after the packages (mmdebstrap --customize-hook; "$1" is its path), with the
# wheels copied to /tmp/wheels. Part of the base's hash: changing them makes a new base.
_HOOKS = (
    'chroot "$1" useradd --uid 1000 --user-group --no-create-home --home-dir /home/user --shell /bin/bash user',
    'mkdir -p "$1/home/user" && chown 1000:1000 "$1/home/user"',
    'chroot "$1" python3 -m venv --system-site-packages /opt/retrace',
    'chroot "$1" /opt/retrace/bin/pip install --quiet --no-index --disable-pip-version-check --find-links '
    '/tmp/wheels -r /tmp/wheels/requirements.txt',
    'chroot "$1" /opt/retrace/bin/pip install --quiet --no-index --disable-pip-version-check --find-links '
    '/tmp/wheels --no-deps -r /tmp/wheels/no-deps.txt',
    'rm -rf "$1/tmp/wheels" "$1/root/.cache"',
)


def _requirement_groups() -> list[tuple[str, list[str]]]:
    """requirements.txt as (pip flags, requirements): those resolved with their dependencies, then --no-deps."""
    with_deps = [r for r in _lines("requirements.txt") if not r.endswith("--no-deps")]
    no_deps = [r.removesuffix("--no-deps").strip() for r in _lines("requirements.txt") if r.endswith("--no-deps")]
    return [("", with_deps), ("--no-deps", no_deps)]


def _wheels(out: Path) -> None:
    """Wheels of requirements.txt for the image's Python (bookworm's 3.11, as the harness requires) made here,
    where pip's index is reachable: the root filesystem never needs the network."""
    import sys

    out.mkdir()
    for (flags, reqs), name in zip(_requirement_groups(), ("requirements.txt", "no-deps.txt"), strict=True):
        (out / name).write_text("\n".join(reqs) + "\n")
        argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--wheel-dir",
                str(out), *flags.split(), "-r", str(out / name)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
        if res.returncode != 0:
            raise EnvError(f"pip wheel for the desktop image failed: {res.stderr.strip()[-1500:]}")


def _build_desktop(client: Any, base: str, tag: str) -> None:
    import docker.errors

    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        tar.add(RECIPE / "Dockerfile", arcname="Dockerfile")
        for name, path in _source_files():
            tar.add(path, arcname=name)
    context.seek(0)
    try:
        client.images.build(fileobj=context, custom_context=True, tag=tag, buildargs={"BASE": base}, rm=True,
                            forcerm=True, pull=False, network_mode="none", labels={"pytest-retrace": "desktop"})
    except docker.errors.BuildError as exc:
        log = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log)
        raise EnvError(f"building {tag} failed: {exc.msg}\n{log[-1500:]}") from None
