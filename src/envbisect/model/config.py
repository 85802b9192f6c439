"""``envbisect.yaml``: discovery and validation.

The file is found by walking up from the working directory (or named with ``--config``).
Every key is optional. Relative paths and globs are resolved against the directory that
holds the file (``Config.root``); without a file, against the working directory. A wrong
type or an unknown key is one ConfigError naming the file and the field.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbisect.model.errors import ConfigError
from envbisect.model.sources import INDEX_STRATEGIES, Pin

CONFIG_NAME = "envbisect.yaml"

# keep_blobs: true stores files up to this many bytes each.
DEFAULT_BLOB_LIMIT = 1 << 20
# keep_caches: compile caches' content kept up to this many bytes (default on with keep_blobs).
DEFAULT_CACHE_CAP = 512 << 20
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """``512MiB``, ``2GiB``, ``1.5G``, ``300000`` → bytes (powers of 1024); None if not a
    size."""
    m = _SIZE.match(text)
    if m is None:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class Target:
    """A named layer chain under ``targets:``; ``via`` holds layer strings, outermost first."""

    via: tuple[str, ...] = ()
    python: str | None = None


@dataclass(frozen=True)
class WorkerConfig:
    """One entry of ``workers:``: a slot of this host (``env``, ``cpus``), a named target
    (``target``) or Slurm jobs (``slurm``: partition, gres, time, count, mode, args)."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None
    cpus: tuple[int, ...] = ()
    slurm: Mapping[str, Any] | None = None


_SLURM_FIELDS = ("partition", "gres", "time", "count", "mode", "args")


@dataclass(frozen=True)
class Config:
    """The validated contents of envbisect.yaml (all fields optional)."""

    root: Path
    path: Path | None = None
    label: str | None = None
    repos: tuple[Path, ...] = ()
    files: tuple[str, ...] = ()  # absolute glob patterns
    data: tuple[Path, ...] = ()
    caches: Mapping[str, Path] = field(default_factory=dict)
    probes: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    keep_blobs: int | None = None  # max bytes per stored file; None: store nothing
    keep_caches: int | None = None  # max bytes of a kept cache; None: keep none
    manifests_dir: Path = Path("manifests")
    targets: Mapping[str, Target] = field(default_factory=dict)
    good: Path | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    indexes: tuple[str, ...] = ()  # searched in this order, before the default index
    default_index: str | None = None  # the entry of indexes marked default: true
    index_strategy: str | None = None  # uv's --index-strategy
    offline: bool = False
    pins: Mapping[str, Pin] = field(default_factory=dict)  # canonical name -> Pin
    data_map: Mapping[str, str] = field(default_factory=dict)
    smoke: tuple[str, ...] | None = None  # one argv
    threshold: Any = None  # metric.Threshold (source "envbisect.yaml threshold") or None
    metric_regex: str | None = None  # validated like --metric-regex
    repeats: int | None = None  # samples per state to start with (run, check)
    workers: tuple[WorkerConfig, ...] = ()

    @classmethod
    def load(cls, path: Path | None = None, cwd: Path | None = None) -> Config:
        """Read ``path``, or the first envbisect.yaml from ``cwd`` upwards, or defaults."""
        here = (cwd or Path.cwd()).absolute()
        if path is None:
            found = find_config(here)
            if found is None:
                return cls(root=here, manifests_dir=here / "manifests")
            path = found
        else:
            # ``--config ../x.yaml``: root ``ws``, not ``ws/repo/..`` (paths are compared as text)
            path = Path(os.path.normpath(here / Path(path).expanduser()))
            if not path.is_file():
                raise ConfigError(f"{path}: no such config file")
        return cls.from_mapping(_read_yaml(path), path)

    @classmethod
    def from_mapping(cls, data: Any, path: Path) -> Config:
        """Validate a parsed envbisect.yaml that lives at ``path``."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping of settings")
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            hint = difflib.get_close_matches(unknown[0], _FIELDS, n=1)
            tip = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise ConfigError(f"{path}: unknown field '{unknown[0]}'{tip}")
        v = _Validator(path, path.parent.absolute())
        return cls(
            root=v.root,
            path=path,
            label=v.opt_str(data, "label", numbers=True),
            repos=tuple(v.path(p) for p in v.str_list(data, "repos")),
            files=tuple(v.glob(p) for p in v.str_list(data, "files")),
            data=tuple(v.path(p) for p in v.str_list(data, "data")),
            caches={k: v.path(p) for k, p in sorted(v.str_map(data, "caches").items())},
            probes=tuple(v.str_list(data, "probes")),
            env=tuple(v.str_list(data, "env")),
            keep_blobs=v.keep_blobs(data),
            keep_caches=v.keep_caches(data),
            manifests_dir=v.path(v.opt_str(data, "manifests_dir") or "manifests"),
            targets=v.targets(data),
            good=v.path(good) if (good := v.opt_str(data, "good")) else None,
            index_url=v.opt_str(data, "index_url"),
            extra_index_urls=tuple(v.str_list(data, "extra_index_urls")),
            find_links=tuple(v.location(p) for p in v.str_list(data, "find_links")),
            **v.sources(data),
            data_map={
                str(v.path(k)): str(v.path(p))
                for k, p in sorted(v.str_map(data, "data_map").items())
            },
            smoke=v.argv(data, "smoke"),
            threshold=v.threshold(data),
            metric_regex=v.metric_regex(data),
            repeats=v.positive_int(data, "repeats"),
            workers=v.workers(data),
        )

    def with_overrides(self, **values: Any) -> Config:
        """A copy with CLI additions: list fields are extended, scalars replaced.

        Relative paths given on the command line are taken against the working directory.
        ``None`` and empty values leave the field as it is.
        """
        cwd = Path.cwd()
        changes: dict[str, Any] = {}
        for name, value in values.items():
            if name not in _FIELDS:
                raise TypeError(f"Config has no field {name!r}")
            if value is None or (isinstance(value, (list, tuple)) and not value):
                continue
            current = getattr(self, name)
            if name in ("repos", "data"):
                changes[name] = current + tuple(_absolute(Path(p), cwd) for p in value)
            elif name == "files":
                changes[name] = current + tuple(str(_absolute(Path(p), cwd)) for p in value)
            elif isinstance(current, tuple):
                changes[name] = current + tuple(str(p) for p in value)
            elif name in ("manifests_dir", "good"):
                changes[name] = _absolute(Path(value), cwd)
            else:
                changes[name] = value
        return replace(self, **changes)

    @property
    def blobs_dir(self) -> Path:
        """Where file contents are stored, content-addressed."""
        return self.manifests_dir / "blobs"


_FIELDS = (
    "label",
    "repos",
    "files",
    "data",
    "caches",
    "probes",
    "env",
    "keep_blobs",
    "keep_caches",
    "manifests_dir",
    "targets",
    "good",
    "index_url",
    "extra_index_urls",
    "find_links",
    "indexes",
    "index_strategy",
    "offline",
    "pins",
    "data_map",
    "smoke",
    "threshold",
    "metric_regex",
    "repeats",
    "workers",
)


def find_config(start: Path) -> Path | None:
    """The nearest envbisect.yaml in ``start`` or one of its parents."""
    for directory in (start, *start.parents):
        candidate = directory / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


def _read_yaml(path: Path) -> Any:
    """The parsed file: a regular file of bounded size, strict YAML (no aliases, no duplicate
    keys), the same rules as manifests (see ``manifest.read_bounded`` and ``parse_yaml``)."""
    from envbisect.model.manifest import CONFIG_MAX_BYTES, YamlRefused, parse_yaml, read_bounded

    try:
        text = read_bounded(path, CONFIG_MAX_BYTES, "config file").decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None
    except YamlRefused as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return parse_yaml(text)
    except YamlRefused as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _absolute(p: Path, base: Path) -> Path:
    p = p.expanduser()
    return Path(os.path.normpath(p if p.is_absolute() else base / p))


_PACKAGE_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


def _is_url(text: str) -> bool:
    return "://" in text


class _Validator:
    """Type checks that raise one ConfigError naming the file and the field."""

    def __init__(self, path: Path, root: Path) -> None:
        self.file = path
        self.root = root

    def fail(self, name: str, expected: str, got: Any) -> ConfigError:
        return ConfigError(f"{self.file}: field '{name}' must be {expected}, got {got!r}")

    def path(self, text: str) -> Path:
        return _absolute(Path(text), self.root)

    def glob(self, text: str) -> str:
        return str(self.path(text))

    def location(self, text: str) -> str:
        return text if _is_url(text) else str(self.path(text))

    def opt_str(self, data: dict[str, Any], name: str, numbers: bool = False) -> str | None:
        """A string field; ``numbers``: a bare number is taken as its text (labels)."""
        value = data.get(name)
        if value is None:
            return None
        allowed = (str, int, float) if numbers else (str,)
        if isinstance(value, bool) or not isinstance(value, allowed) or value == "":
            raise self.fail(name, "a string", value)
        return str(value)

    def str_list(self, data: dict[str, Any], name: str, where: str | None = None) -> list[str]:
        value = data.get(name)
        where = where or name
        if value is None:
            return []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(where, "a list of strings", value)
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.fail(f"{where}[{i}]", "a non-empty string", item)
        return list(value)

    def str_map(self, data: dict[str, Any], name: str) -> dict[str, str]:
        value = data.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(name, "a mapping of name: path", value)
        for key, item in value.items():
            if not isinstance(key, str) or not isinstance(item, str) or not item:
                raise self.fail(f"{name}.{key}", "a string", item)
        return dict(value)

    def keep_blobs(self, data: dict[str, Any]) -> int | None:
        value = data.get("keep_blobs")
        if value is None or value is False:
            return None
        if value is True:
            return DEFAULT_BLOB_LIMIT
        if isinstance(value, int) and value > 0:
            return value
        raise self.fail("keep_blobs", "true, false or a positive byte count", value)

    def keep_caches(self, data: dict[str, Any]) -> int | None:
        # Unset: on (with the default cap) where file contents are kept, else off: a
        # snapshot never writes compile caches' gigabytes where nobody asked for contents.
        value = data.get("keep_caches", bool(data.get("keep_blobs")))
        if value is False:
            return None
        if value is True:
            return DEFAULT_CACHE_CAP
        size = value if isinstance(value, int) else parse_size(str(value))
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
        raise self.fail("keep_caches", "true, false or a size (512MiB, 2GiB)", value)

    def sources(self, data: dict[str, Any]) -> dict[str, Any]:
        """``indexes`` (URLs or {url, default}), ``index_strategy``, ``offline``, ``pins``."""
        indexes: list[str] = []
        default: str | None = None
        raw = data.get("indexes")
        if raw is not None and not isinstance(raw, list):
            raise self.fail("indexes", "a list of index URLs or {url, default}", raw)
        for i, item in enumerate(raw or ()):
            where = f"indexes[{i}]"
            is_default = False
            if isinstance(item, dict):
                extra = sorted(str(k) for k in item if k not in ("url", "default"))
                if extra:
                    raise ConfigError(f"{self.file}: unknown field '{where}.{extra[0]}'")
                is_default = item.get("default", False)
                if not isinstance(is_default, bool):
                    raise self.fail(f"{where}.default", "true or false", is_default)
                item = item.get("url")
                where += ".url"
            url = self.index_location(item, where)
            if not is_default:
                indexes.append(url)
            elif default is not None or data.get("index_url"):
                other = "another entry" if default is not None else "'index_url'"
                raise ConfigError(
                    f"{self.file}: field '{where}': default: true, but {other} "
                    "already names the default index"
                )
            else:
                default = url
        strategy = data.get("index_strategy")
        if strategy is not None and strategy not in INDEX_STRATEGIES:
            raise self.fail("index_strategy", " or ".join(INDEX_STRATEGIES), strategy)
        offline = data.get("offline", False)
        if not isinstance(offline, bool):
            raise self.fail("offline", "true or false", offline)
        index_url = self.opt_str(data, "index_url")
        return {
            "indexes": tuple(indexes),
            "default_index": default
            or (self.index_location(index_url, "index_url") if index_url else None),
            "index_strategy": strategy,
            "offline": offline,
            "pins": self.pins(data),
        }

    def index_location(self, value: Any, where: str) -> str:
        """An index URL (file://, http(s)://), or a local directory as its file:// URL."""
        if not isinstance(value, str) or not value:
            raise self.fail(where, "an index URL or directory", value)
        if _is_url(value):
            scheme = value.split("://", 1)[0].lower()
            if scheme not in ("file", "http", "https"):
                raise self.fail(where, "a file://, http:// or https:// URL", value)
            return value
        return self.path(value).as_uri()

    def pins(self, data: dict[str, Any]) -> dict[str, Pin]:
        """``pins:``: package -> version range, or {version, index} (index: the one index
        the package comes from)."""
        from packaging.utils import canonicalize_name

        value = data.get("pins")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(
                "pins", "a mapping of package: version range or {version, index}", value
            )
        out: dict[str, Pin] = {}
        for name, spec in value.items():
            if not isinstance(name, str) or not _PACKAGE_NAME.match(name):
                raise self.fail("pins", "keyed by package names", name)
            canon = canonicalize_name(name)
            if canon in out:
                raise ConfigError(f"{self.file}: field 'pins.{name}': {name!r} is pinned twice")
            out[canon] = self._pin(spec, f"pins.{name}")
        return out

    def _pin(self, spec: Any, where: str) -> Pin:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        index = None
        if isinstance(spec, dict):
            extra = sorted(str(k) for k in spec if k not in ("version", "index"))
            if extra:
                raise ConfigError(f"{self.file}: unknown field '{where}.{extra[0]}'")
            if spec.get("index") is not None:
                index = self.index_location(spec["index"], f"{where}.index")
            spec = spec.get("version", "")
            where += ".version"
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = str(spec)  # pins: {einops: 0.7} reads as ==0.7
        expected = "a version range such as '==0.7.0' or '>=1,<2'"
        if not isinstance(spec, str):
            raise self.fail(where, expected, spec)
        text = spec.strip()
        if text and text[0].isdigit():
            text = "==" + text  # a bare version is an exact pin
        try:
            SpecifierSet(text)
        except InvalidSpecifier:
            raise self.fail(where, expected, spec) from None
        return Pin(specifier=text, index=index)

    def threshold(self, data: dict[str, Any]) -> Any:
        from envbisect.model.errors import UsageError
        from envbisect.model.metric import Threshold

        value = data.get("threshold")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail("threshold", "a throughput such as 12k or 12000, or 70%", value)
        try:
            return Threshold.parse(value, f"{self.file.name} threshold", "threshold")
        except UsageError as exc:
            raise ConfigError(f"{self.file}: field {exc}") from None

    def metric_regex(self, data: dict[str, Any]) -> str | None:
        from envbisect.model.errors import UsageError
        from envbisect.model.metric import MetricSpec

        value = data.get("metric_regex")
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail("metric_regex", "a regular expression string", value)
        try:
            MetricSpec.parse(value)
        except UsageError as exc:
            raise ConfigError(
                f"{self.file}: field 'metric_regex': {str(exc).split(': ', 1)[-1]}"
            ) from None
        return value

    def positive_int(self, data: dict[str, Any], name: str) -> int | None:
        value = data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(name, "a positive whole number", value)
        return value

    def argv(self, data: dict[str, Any], name: str) -> tuple[str, ...] | None:
        value = data.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                parts = shlex.split(value)
            except ValueError as exc:
                raise self.fail(name, f"a command line ({exc})", value) from None
        elif isinstance(value, list) and all(isinstance(x, (str, int, float)) for x in value):
            parts = [str(x) for x in value]
        else:
            raise self.fail(name, "an argv list or a command string", value)
        if not parts:
            raise self.fail(name, "a non-empty command", value)
        return tuple(parts)

    def targets(self, data: dict[str, Any]) -> dict[str, Target]:
        value = data.get("targets")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail("targets", "a mapping of name: {via, python}", value)
        out: dict[str, Target] = {}
        for name, spec in sorted(value.items(), key=lambda kv: str(kv[0])):
            where = f"targets.{name}"
            if not isinstance(spec, dict):
                raise self.fail(where, "a mapping with 'via' and/or 'python'", spec)
            extra = sorted(str(k) for k in spec if k not in ("via", "python"))
            if extra:
                raise ConfigError(f"{self.file}: unknown field '{where}.{extra[0]}'")
            via = self.str_list(spec, "via", f"{where}.via")
            python = spec.get("python")
            if python is not None and not isinstance(python, str):
                raise self.fail(f"{where}.python", "a string", python)
            out[str(name)] = Target(via=tuple(via), python=python)
        return out

    def workers(self, data: dict[str, Any]) -> tuple[WorkerConfig, ...]:
        value = data.get("workers")
        if value is None:
            return ()
        if not isinstance(value, list) or not value:
            raise self.fail("workers", "a non-empty list of {name, env | target | slurm}", value)
        raw_targets = data.get("targets")
        targets: dict[Any, Any] = raw_targets if isinstance(raw_targets, dict) else {}
        out: list[WorkerConfig] = []
        for i, spec in enumerate(value):
            out.append(self._worker(spec, f"workers[{i}]", targets, {w.name for w in out}))
        return tuple(out)

    def _worker(
        self, spec: Any, where: str, targets: dict[Any, Any], taken: set[str]
    ) -> WorkerConfig:
        """One entry of ``workers:``; ``taken``: the names of the entries before it."""
        if not isinstance(spec, dict):
            raise self.fail(where, "a mapping with 'name'", spec)
        extra = sorted(str(k) for k in spec if k not in ("name", "env", "target", "cpus", "slurm"))
        if extra:
            raise ConfigError(f"{self.file}: unknown field '{where}.{extra[0]}'")
        name = spec.get("name")
        if (
            not isinstance(name, str)
            or not name
            or not name.replace("-", "").replace("_", "").isalnum()
        ):
            raise self.fail(f"{where}.name", "a name of letters, digits, - and _", name)
        if name in taken:
            raise ConfigError(f"{self.file}: field '{where}.name': {name!r} is used twice")
        env = spec.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(x, (str, int)) and not isinstance(x, bool)
            for k, x in env.items()
        ):
            raise self.fail(f"{where}.env", "a mapping of NAME: value", env)
        target = spec.get("target")
        if target is not None and (not isinstance(target, str) or target not in targets):
            known = ", ".join(sorted(str(t) for t in targets)) or "none defined"
            raise ConfigError(
                f"{self.file}: field '{where}.target': no target named {target!r} "
                f"under 'targets:' ({known})"
            )
        cpus = spec.get("cpus") or []
        if not isinstance(cpus, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus
        ):
            raise self.fail(f"{where}.cpus", "a list of core numbers", cpus)
        slurm = spec.get("slurm")
        if slurm is not None:
            slurm = self._slurm(slurm, f"{where}.slurm")
            if target is not None:
                raise ConfigError(
                    f"{self.file}: field '{where}': give 'target' or 'slurm', not both"
                )
        return WorkerConfig(
            name=name,
            env={str(k): str(x) for k, x in env.items()},
            target=target,
            cpus=tuple(cpus),
            slurm=slurm,
        )

    def _slurm(self, spec: Any, where: str) -> dict[str, Any]:
        if not isinstance(spec, dict):
            raise self.fail(where, "a mapping of partition, gres, time, count, mode, args", spec)
        extra = sorted(str(k) for k in spec if k not in _SLURM_FIELDS)
        if extra:
            raise ConfigError(f"{self.file}: unknown field '{where}.{extra[0]}'")
        out: dict[str, Any] = {}
        for key in ("partition", "gres", "time"):
            if spec.get(key) is not None:
                if not isinstance(spec[key], (str, int)) or isinstance(spec[key], bool):
                    raise self.fail(f"{where}.{key}", "a string", spec[key])
                out[key] = str(spec[key])
        count = spec.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise self.fail(f"{where}.count", "a positive number", count)
        out["count"] = count
        mode = spec.get("mode", "salloc")
        if mode not in ("salloc", "srun"):
            raise self.fail(f"{where}.mode", "'salloc' or 'srun'", mode)
        out["mode"] = mode
        out["args"] = tuple(self.str_list(spec, "args", f"{where}.args"))
        return out
