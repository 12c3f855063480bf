"""docker/Dockerfile.*: each step replayed, on paper, as the user the base image runs it as. No Docker engine here,
so the walk knows each base image's runtime user (facts from the images' docs and /work/shared/FIELD_NOTES.md) and
fails on a step that user cannot do: removing or chowning what root owns, writing outside its own folders, apt-get,
a pip install that builds in a read-only bind mount. Every install ends with ``pip check``; the build context keeps
out what a build must not send (.dockerignore)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"


@dataclass(frozen=True)
class RuntimeUser:
    name: str
    uid: int
    gid: int
    #: Folders the user owns in the base image (it may create, remove and install under them).
    owns: tuple[str, ...]


#: Each base image's runtime user. Ray's image: user ``ray`` (uid 1000, gid 100), conda in /home/ray/anaconda3.
#: Airflow's official image: user ``airflow`` (uid 50000, gid 0), AIRFLOW_HOME /opt/airflow, pip installs into
#: /home/airflow/.local. Python's official image runs as root (the mlflow image adds a user of its own).
ROOT = RuntimeUser("root", 0, 0, ("/",))
BASE_USERS = {
    "rayproject/ray": RuntimeUser("ray", 1000, 100, ("/home/ray", "/tmp")),
    "apache/airflow": RuntimeUser("airflow", 50000, 0, ("/home/airflow", "/opt/airflow", "/tmp")),
    "python": ROOT,
}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction, continuation lines joined, comments dropped."""
    steps: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            word, _, rest = pending.strip().partition(" ")
            steps.append((word.upper(), rest.strip()))
        pending = ""
    return steps


@dataclass
class Walk:
    user: RuntimeUser = ROOT
    args: dict[str, str] = field(default_factory=dict)
    #: Paths left in the image by COPY/ADD, with their owner's name.
    copied: dict[str, str] = field(default_factory=dict)
    #: Users a step created (``useradd``), by name: a later USER may switch to one.
    created: dict[str, RuntimeUser] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def under(self, path: str, roots: tuple[str, ...]) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def may_write(self, path: str) -> bool:
        if self.user.uid == 0:
            return True
        owner = next((o for p, o in self.copied.items() if self.under(path, (p,))), None)
        if owner is not None:
            return owner == self.user.name
        return self.under(path, self.user.owns)


def _users_base(image: str) -> RuntimeUser:
    repo = image.split(":", 1)[0]
    if repo not in BASE_USERS:
        raise AssertionError(f"unknown base image {image}: add its runtime user to BASE_USERS")
    return BASE_USERS[repo]


def _copy(walk: Walk, step: int, rest: str) -> None:
    words = shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    dest = paths[-1]
    chown = next((f.split("=", 1)[1] for f in flags if f.startswith("--chown=")), None)
    owner = chown.split(":")[0] if chown else "root"
    if chown and walk.user.uid != 0 and owner != walk.user.name:
        walk.problems.append(f"step {step}: COPY --chown={chown} as {walk.user.name} (only root may give files away)")
    # The builder writes COPY's files (and the folders it creates) itself, owned by root or by --chown's user.
    for src in paths[:-1]:
        target = dest if not dest.endswith("/") else dest + Path(src).name
        walk.copied[dest.rstrip("/") if dest.endswith("/") else target] = owner


def _bind_mounts(rest: str) -> tuple[dict[str, bool], str]:
    """``RUN --mount=type=bind,...`` targets (and whether each is writable), and the command after the flags."""
    mounts: dict[str, bool] = {}
    while rest.startswith("--mount="):
        flag, _, rest = rest.partition(" ")
        opts = dict(o.partition("=")[::2] for o in flag[len("--mount=") :].split(","))
        if opts.get("type") == "bind":
            mounts[opts["target"]] = "rw" in opts or opts.get("readwrite") == "true"
        rest = rest.lstrip()
    return mounts, rest


def _run(walk: Walk, step: int, rest: str) -> None:
    mounts, command = _bind_mounts(rest)
    parts = [p.strip() for p in re.split(r"&&|;|\|\|", command) if p.strip()]
    installs = [i for i, p in enumerate(parts) if re.match(r"(python -m )?pip install\b", p)]
    if installs and not any(re.match(r"(python -m )?pip check$", p) for p in parts[installs[-1] + 1 :]):
        walk.problems.append(f"step {step}: a pip install not followed by pip check in the same RUN")
    for part in parts:
        words = shlex.split(part)
        if not words:
            continue
        tool, targets = words[0], [w for w in words[1:] if w.startswith("/")]
        if tool in ("apt-get", "apt", "apk", "yum", "dnf", "useradd", "usermod") and walk.user.uid != 0:
            walk.problems.append(f"step {step}: {tool} as {walk.user.name} (needs USER root)")
        if tool == "useradd" and walk.user.uid == 0:
            options = dict(zip(words[1:-1:2], words[2:-1:2], strict=False))
            home = options.get("--home-dir", f"/home/{words[-1]}")
            uid, gid = int(options.get("--uid", "1000")), int(options.get("--gid", "100"))
            walk.created[words[-1]] = RuntimeUser(words[-1], uid, gid, (home, "/tmp"))
        if tool in ("chown", "chgrp") and walk.user.uid != 0:
            walk.problems.append(f"step {step}: {tool} as {walk.user.name} (only root may give files away)")
        if tool in ("rm", "mkdir", "touch", "chmod", "mv"):
            for target in targets:
                if target in mounts or any(walk.under(target, (m,)) for m in mounts):
                    continue  # a bind mount is gone after its RUN; nothing of it stays to remove
                if not walk.may_write(target):
                    walk.problems.append(f"step {step}: {walk.user.name} cannot {tool} {target} (owned by root)")
                elif tool == "rm":
                    walk.copied = {p: o for p, o in walk.copied.items() if not walk.under(p, (target,))}
        if tool == "pip" and words[1:2] == ["install"]:
            for arg in words[2:]:
                local = arg.split("[", 1)[0]
                if local.startswith("/") and not local.endswith((".txt", ".whl")):
                    # pip builds a source folder in place: setuptools writes build/ and *.egg-info into it.
                    readonly = next((not rw for m, rw in mounts.items() if walk.under(local, (m,))), None)
                    if readonly or (readonly is None and not walk.may_write(local)):
                        who = walk.user.name
                        walk.problems.append(f"step {step}: pip builds {local} in place; {who} cannot write it")


def walk_dockerfile(text: str) -> Walk:
    walk = Walk()
    for step, (word, rest) in enumerate(instructions(text), 1):
        if word == "ARG":
            name, _, value = rest.partition("=")
            walk.args[name] = value
        elif word == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: walk.args[m.group(1)], rest.split()[0])
            walk.user, walk.copied = _users_base(image), {}
        elif word == "USER":
            name = rest.split(":")[0]
            known = {**{u.name: u for u in BASE_USERS.values()}, **walk.created}
            walk.user = ROOT if name in ("root", "0") else known[name]
        elif word in ("COPY", "ADD"):
            _copy(walk, step, rest)
        elif word == "RUN":
            _run(walk, step, rest)
    return walk


@pytest.mark.parametrize("dockerfile", ["Dockerfile.ray", "Dockerfile.airflow", "Dockerfile.mlflow"])
def test_every_step_is_one_the_images_user_can_do(dockerfile):
    walk = walk_dockerfile((DOCKER / dockerfile).read_text())
    assert walk.problems == []
    assert walk.user.uid != 0, f"{dockerfile} must end as the image's own user, not root"


def test_the_ray_image_leaves_no_build_inputs_and_its_tag_is_an_arg():
    text = (DOCKER / "Dockerfile.ray").read_text()
    walk = walk_dockerfile(text)
    assert walk.copied == {}, f"left in the image: {walk.copied}"
    assert "ARG RAY_IMAGE_TAG=" in text and "FROM rayproject/ray:${RAY_IMAGE_TAG}" in text
    readme = (DOCKER / "README.md").read_text()
    default = re.search(r"ARG RAY_IMAGE_TAG=(\S+)", text).group(1)
    assert f"RAY_IMAGE_TAG={default}-aarch64" in readme, "docker/README.md says how to build on arm64"


OLD_RAY = """FROM rayproject/ray:2.60.0-py311-cpu
COPY docker/requirements-ray.txt constraints.txt /tmp/airflow-tune/
RUN pip install --no-cache-dir -c /tmp/airflow-tune/constraints.txt -r /tmp/airflow-tune/requirements-ray.txt \\
    && rm -rf /tmp/airflow-tune
"""


@pytest.mark.parametrize(
    ("dockerfile", "problem"),
    [
        # The defect of issue 23: root-owned build inputs removed as ray (Permission denied), and no pip check.
        (OLD_RAY, "ray cannot rm /tmp/airflow-tune (owned by root)"),
        (OLD_RAY, "a pip install not followed by pip check"),
        ("FROM rayproject/ray:2.60.0-py311-cpu\nRUN apt-get update\n", "apt-get as ray (needs USER root)"),
        ("FROM apache/airflow:slim-3.3.2-python3.11\nRUN chown -R airflow /opt\n", "chown as airflow"),
        ("FROM apache/airflow:slim-3.3.2-python3.11\nRUN mkdir -p /srv/x\n", "airflow cannot mkdir /srv/x"),
        # A user the image creates owns its home only.
        (
            "FROM python:3.11.13-slim-bookworm\nRUN useradd --uid 1000 --gid 0 --home-dir /srv/m m\nUSER m\n"
            "RUN mkdir -p /srv/m/a && mkdir -p /opt/x\n",
            "m cannot mkdir /opt/x",
        ),
        (
            "FROM apache/airflow:slim-3.3.2-python3.11\nCOPY . /opt/p\nRUN pip install /opt/p && pip check\n",
            "pip builds /opt/p in place; airflow cannot write it",
        ),
        (
            "FROM apache/airflow:slim-3.3.2-python3.11\nRUN --mount=type=bind,source=.,target=/src "
            "pip install /src && pip check\n",
            "pip builds /src in place; airflow cannot write it",
        ),
    ],
)
def test_the_walk_fails_on_a_step_the_user_cannot_do(dockerfile, problem):
    problems = walk_dockerfile(dockerfile).problems
    assert any(problem in p for p in problems), problems


def test_the_walk_accepts_what_root_or_the_owner_may_do():
    ok = """FROM rayproject/ray:2.60.0-py311-cpu
USER root
RUN apt-get update && chown ray /srv
USER ray
COPY --chown=ray:users a.txt /home/ray/a.txt
RUN rm -rf /home/ray/a.txt && pip install x && pip check
"""
    walk = walk_dockerfile(ok)
    assert walk.problems == [] and walk.copied == {}


def test_the_build_context_keeps_out_virtualenvs_state_git_and_caches():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()}
    for pattern in (
        "**/.venv",
        "**/.cluster-venv",
        "**/.mlflow-venv",
        ".compat",
        ".stack",
        ".git",
        "**/__pycache__",
        "docker/.env",
    ):
        assert pattern in ignored, pattern
    # What the Dockerfiles read from the context is not ignored.
    needed_files = ("constraints.txt", "pyproject.toml", "README.md", "airflow_tune", "docker/requirements-ray.txt")
    for needed in (*needed_files, "docker/requirements-mlflow.txt"):
        assert needed not in ignored and (REPO / needed).exists(), needed
