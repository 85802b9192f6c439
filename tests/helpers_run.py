"""Builders for run/check tests: tiny real wheels, a real git repo, manifests, a workload.

The workload (``WORKLOAD``) does real arithmetic per "token"; how much depends on the state:
the installed version of the ``ebwork`` package (``ebwork.WORK``; ``$EB_WORK_MODULES``
names other modules whose ``WORK`` multiplies it), the env var
``EB_SLOW``, and the file ``knob.txt`` next to the script. It prints ``N tok/s`` and an
``ENVBISECT_RESULT`` line, so both metric paths are exercised.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

from envbisect.model.manifest import SCHEMA

SLOWDOWN = 8  # work factor of a "slow" change; thresholds sit between 1x and this

WORKLOAD = r"""
import json, os, sys, time
work = 1
for name in os.environ.get("EB_WORK_MODULES", "ebwork").split(","):
    try:
        work *= __import__(name).WORK
    except ModuleNotFoundError as exc:
        if exc.name != name:  # absent is fine; a module that fails to import is a crash
            raise
here = os.path.dirname(os.path.abspath(__file__))
knob = os.path.join(here, "knob.txt")
if os.path.exists(knob):
    with open(knob) as fh:
        work *= int(fh.read().strip() or 1)
if os.environ.get("EB_CRASH"):
    raise SystemExit("EB_CRASH is set: simulated training crash")
if os.environ.get("EB_SLOW"):
    work *= int(os.environ["EB_SLOW"])
tokens = int(os.environ.get("EB_TOKENS", "8000"))
acc = 0
start = time.perf_counter()
for t in range(tokens):
    for i in range(40 * work):
        acc = (acc + i * t) % 1000003
elapsed = time.perf_counter() - start
rate = tokens / elapsed
print("step done acc=%d" % acc)
print("%.1f tok/s" % rate)
print("ENVBISECT_RESULT " + json.dumps({"ok": True, "tok_per_s": rate}))
"""


def build_wheel(
    dest: Path,
    name: str,
    version: str,
    body: str,
    requires: tuple[str, ...] = (),
    *,
    package: bool = False,
) -> Path:
    """A real, installable pure-Python wheel with one module ``<name>.py`` (``-`` in the
    name becomes ``_``; ``package``: a package ``<name>/__init__.py`` with a submodule
    ``<name>/sub/more.py``), with ``requires`` as its ``Requires-Dist`` lines."""
    dest.mkdir(parents=True, exist_ok=True)
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    modules = (
        {f"{module}/__init__.py": body.encode(), f"{module}/sub/more.py": b"MORE = 1\n"}
        if package
        else {f"{module}.py": body.encode()}
    )
    files = {
        **modules,
        f"{dist}/METADATA": metadata.encode(),
        f"{dist}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: envbisect-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record_lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    wheel = dest / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def simple_index(
    root: Path,
    wheels: dict[str, list[tuple[Path, float | None]]],
    attrs: dict[str, str] | None = None,
) -> Path:
    """A local PEP 503 simple index (file://) at ``root``: per project a page linking its
    files, with PEP 700 upload times where given; ``attrs``: file name → extra anchor
    attributes (``data-yanked``, ``data-requires-python``)."""
    from envbisect.snapshot.when import iso

    for name, files in wheels.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel, uploaded in files:
            shutil.copy2(wheel, d / wheel.name)
            extra = (attrs or {}).get(wheel.name, "")
            if uploaded is not None:
                extra += f' data-upload-time="{iso(uploaded)}"'
            links.append(f'<a href="{wheel.name}"{extra}>{wheel.name}</a>')
        (d / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>\n")
    return root


def uv() -> str:
    return str(Path(sys.executable).parent / "uv")


def make_venv(path: Path, wheels: Path, *reqs: str, bytecode: bool = True) -> Path:
    """A real uv venv at ``path`` with ``reqs`` installed from ``wheels`` only."""
    subprocess.run([uv(), "venv", "-q", "--python", sys.executable, str(path)], check=True)
    if reqs:
        install(path, wheels, *reqs, bytecode=bytecode)
    return path


def install(venv: Path, wheels: Path, *reqs: str, bytecode: bool = True) -> None:
    """``uv pip install`` into ``venv`` from ``wheels``, offline, with bytecode (like pip;
    ``bytecode=False``: like uv's default, none)."""
    subprocess.run(
        [
            uv(),
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--offline",
            "--no-index",
            *(["--compile-bytecode"] if bytecode else []),
            "--find-links",
            str(wheels),
            "--python",
            str(venv / "bin" / "python"),
            *reqs,
        ],
        check=True,
    )


def freeze(venv: Path) -> str:
    out = subprocess.run(
        [uv(), "pip", "freeze", "--python", str(venv / "bin" / "python")],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def tree_hashes(root: Path) -> dict[str, str]:
    """relative path → sha256 of every file under ``root`` (symlinks by target)."""
    out: dict[str, str] = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def init_repo(repo: Path) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    return repo


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def manifest(path: Path, *, own: bool = True, **sections: Any) -> Path:
    """Write a manifest with the given sections (and a meta label), signed as this user's
    own as ``envbisect snapshot`` signs it (``own=False``: a foreign one, reviewed by
    envbisect.model.trust before a run realizes it)."""
    from envbisect.model.manifest import Manifest
    from envbisect.model.trust import sign

    data: dict[str, Any] = {"schema": SCHEMA, "meta": {"label": path.stem}}
    data.update(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(data, sort_keys=False)
    if own:
        text = sign(Manifest(sections=yaml.safe_load(text))).to_yaml()
    path.write_text(text, encoding="utf-8")
    return path


def resign(*paths: Path) -> None:
    """Sign manifests a test edited by hand, as this user's own again."""
    from envbisect.model.manifest import Manifest
    from envbisect.model.trust import sign

    for path in paths:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        path.write_text(sign(Manifest(sections=data)).to_yaml(), encoding="utf-8")


def make_foreign(*paths: Path) -> None:
    """Drop the signature of manifests: as if another user or machine made them."""
    for path in paths:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data.get("meta", {}).pop("signature", None)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def store_blob(manifests_dir: Path, content: bytes) -> dict[str, Any]:
    """Store ``content`` under blobs/ and return its files-section entry."""
    sha = hashlib.sha256(content).hexdigest()
    blobs = manifests_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / sha).write_bytes(content)
    return {"sha256": sha, "size": len(content), "blob": sha}


def file_entry(content: bytes) -> dict[str, Any]:
    sha = hashlib.sha256(content).hexdigest()
    return {"sha256": sha, "size": len(content), "blob": None}


def pkg(version: str) -> dict[str, Any]:
    return {"version": version, "installer": "uv", "editable": False, "direct_url": None}


def run_workload(python: str, script: Path, env: dict[str, str] | None = None) -> float:
    """tok/s of one direct run of the workload (used to place thresholds)."""
    out = subprocess.run(
        [python, str(script)], capture_output=True, text=True, check=True, env=env
    ).stdout
    for line in out.splitlines():
        if line.startswith("ENVBISECT_RESULT "):
            return float(json.loads(line.split(" ", 1)[1])["tok_per_s"])
    raise AssertionError(out)


class Scenario:
    """A user's world in ``tmp``: a target uv venv (bad state), a repo with the workload,
    a loose file, good/bad manifests and an envbisect.yaml. Culprits are chosen per test.
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.wheels = tmp / "wheels"
        build_wheel(self.wheels, "ebwork", "1.0", "WORK = 1\n")
        build_wheel(self.wheels, "ebwork", "2.0", "WORK = 1  # same speed\n")
        # Sizes differ on purpose: zip entries carry a 2-second timestamp, and a source of the
        # same size and mtime as the replaced one would let Python reuse the stale .pyc.
        build_wheel(self.wheels, "ebwork", "3.0", f"WORK = {SLOWDOWN}  # slow build\n")
        build_wheel(self.wheels, "ebonly", "1.0", "X = 1\n")
        self.index = tmp / "empty-index"
        self.index.mkdir()
        self.repo = init_repo(tmp / "repo")
        (self.repo / "train.py").write_text(WORKLOAD)
        (self.repo / "knob.txt").write_text("1\n")
        self.commits = [commit_all(self.repo, "workload")]
        self.loose = tmp / "etc" / "train.cfg"
        self.loose.parent.mkdir()
        self.mdir = tmp / "manifests"
        self.config = tmp / "envbisect.yaml"
        self.inductor = tmp / "inductor-cache"
        (self.inductor / "fx").mkdir(parents=True)
        (self.inductor / "fx" / "entry").write_text("compiled\n")

    def commit(self, message: str, knob: str | None = None, readme: str | None = None) -> str:
        if knob is not None:
            (self.repo / "knob.txt").write_text(knob)
        (self.repo / "README").write_text(readme or message)
        self.commits.append(commit_all(self.repo, message))
        return self.commits[-1]

    def venv(self, *reqs: str) -> Path:
        self.target = make_venv(self.tmp / "target", self.wheels, *reqs)
        self.python = str(self.target / "bin" / "python")
        return self.target

    def write(
        self,
        *,
        good: dict[str, Any],
        bad: dict[str, Any],
        loose_good: bytes,
        loose_bad: bytes,
    ) -> tuple[Path, Path]:
        """Manifests; the loose file is left in its bad content (the user's current state)."""
        self.loose.write_bytes(loose_bad)
        g_files = {str(self.loose): store_blob(self.mdir, loose_good)}
        b_files = {str(self.loose): store_blob(self.mdir, loose_bad)}
        caches = {"inductor": {"path": str(self.inductor), "exists": True, "files": 1, "bytes": 9}}
        self.good = manifest(self.mdir / "good.yaml", files=g_files, caches=caches, **good)
        self.bad = manifest(self.mdir / "bad.yaml", files=b_files, caches=caches, **bad)
        self.config.write_text(
            yaml.safe_dump(
                {
                    "good": str(self.good),
                    "repos": [str(self.repo)],
                    # What the run may touch: the loose file and the cache (envbisect.model.scope).
                    "files": [str(self.loose)],
                    "caches": {"inductor": str(self.inductor)},
                    "index_url": self.index.as_uri(),
                    "find_links": [str(self.wheels)],
                }
            )
        )
        return self.good, self.bad

    def git_entry(self, sha: str) -> dict[str, Any]:
        return {str(self.repo): {"head": sha, "branch": "main", "dirty": False, "untracked": 0}}

    def fingerprint(self) -> dict[str, Any]:
        """Everything the guarantee covers: repo status + files, loose file, venv, caches."""
        return {
            "git_status": git(self.repo, "status", "--porcelain", "--untracked-files=all"),
            "git_head": git(self.repo, "rev-parse", "HEAD"),
            "worktrees": git(self.repo, "worktree", "list", "--porcelain"),
            "repo": tree_hashes(self.repo),
            "loose": hashlib.sha256(self.loose.read_bytes()).hexdigest(),
            "freeze": freeze(self.target),
            "venv": tree_hashes(self.target),
            "cache": tree_hashes(self.inductor),
        }


def cli_snapshot(config: Path, python: str, label: str, out: Path) -> Path:
    """``envbisect snapshot --config CONFIG --label LABEL -o OUT`` through the CLI; OUT."""
    from click.testing import CliRunner

    from envbisect.cli import cli

    argv = ["snapshot", "--config", str(config), "--python", python, "--label", label]
    res = CliRunner().invoke(cli, [*argv, "-o", str(out)], standalone_mode=False)
    assert res.exception is None and res.return_value == 0, res.output
    return out


def env_scenario(tmp: Path, program: str, bad_env: dict[str, str]) -> tuple[Scenario, Path]:
    """A user's world whose only change is the environment (good: ``A1=x``; bad:
    ``bad_env``); ``program`` is the command's script, ``train_threads.py``."""
    sc = Scenario(tmp)
    sc.venv("ebwork==1.0")
    script = tmp / "train_threads.py"
    script.write_text(program)
    git = sc.git_entry(sc.commits[0])
    good = {"packages": {"ebwork": pkg("1.0")}, "env": {"A1": "x"}, "git": git}
    bad = {"packages": {"ebwork": pkg("1.0")}, "env": bad_env, "git": git}
    sc.write(good=good, bad=bad, loose_good=b"lr = 0.2\n", loose_bad=b"lr = 0.2\n")
    return sc, script
