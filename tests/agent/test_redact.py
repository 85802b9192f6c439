"""The redaction rules (envbisect.agent.redact): secret names, token shapes, harmless values.

Many examples at the function level; a few end to end (real ``snapshot``, ``diff`` and
``run`` writing real files, every one of which is then searched for the planted secrets).
"""

from __future__ import annotations

import base64
import json
import os
import string
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from envbisect.agent.collector import ENV_PREFIXES
from envbisect.agent.redact import (
    PLACEHOLDER,
    find_secrets,
    is_redacted,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_env_mapping,
    redact_text,
    redact_tree,
)

ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"


def _chars(alphabet: str, n: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=n, max_size=n)


# -- planted token formats (the real lengths and alphabets) ------------------------------

GITHUB = st.builds(lambda k, b: f"gh{k}_{b}", st.sampled_from("pousr"), _chars(ALNUM, 36))
GITHUB_PAT = st.builds(lambda a, b: f"github_pat_{a}_{b}", _chars(ALNUM, 22), _chars(ALNUM, 59))
HUGGING_FACE = st.builds(lambda b: f"hf_{b}", _chars(string.ascii_letters, 34))
OPENAI = st.builds(lambda b: f"sk-{b}", _chars(ALNUM, 48))
OPENAI_PROJECT = st.builds(lambda b: f"sk-proj-{b}", _chars(B64URL, 64))
ANTHROPIC = st.builds(lambda b: f"sk-ant-api03-{b}AA", _chars(B64URL, 93))
AWS_KEY_ID = st.builds(
    lambda p, b: p + b,
    st.sampled_from(["AKIA", "ASIA"]),
    _chars(string.ascii_uppercase + string.digits, 16),
)
SLACK = st.builds(
    lambda k, a, b, c: f"xox{k}-{a}-{b}-{c}",
    st.sampled_from("bpas"),
    _chars(string.digits, 11),
    _chars(string.digits, 12),
    _chars(ALNUM, 24),
)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


JWT = st.builds(
    lambda payload, sig: (
        _b64url(b'{"alg":"HS256","typ":"JWT"}')
        + "."
        + _b64url(json.dumps({"sub": payload}).encode())
        + "."
        + sig
    ),
    _chars(ALNUM, 12),
    _chars(B64URL, 43),
)
PEM = st.builds(
    lambda kind, body: (
        f"-----BEGIN {kind}PRIVATE KEY-----\n"
        + "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
        + f"\n-----END {kind}PRIVATE KEY-----\n"
    ),
    st.sampled_from(["", "RSA ", "EC ", "OPENSSH ", "ENCRYPTED "]),
    _chars(ALNUM + "+/", 200),
)
TOKENS = st.one_of(
    GITHUB, GITHUB_PAT, HUGGING_FACE, OPENAI, OPENAI_PROJECT, ANTHROPIC, AWS_KEY_ID, SLACK, JWT, PEM
)

# A password of no particular shape: secret only by where it sits.
# The fixed tail keeps it from being a word that a manifest holds anyway ("implementation").
PASSWORD = st.builds(lambda s: f"{s}!7Qz", _chars(ALNUM + "$%*+^~", 10))

# Harmless pieces around a secret, joined by separators a real value uses.
PIECES = st.sampled_from(
    ["/usr/bin", "/opt/conda/lib", "mlx5_0", "expandable_segments:True", "INFO", "8", "a=1", ""]
)
SEPARATORS = st.sampled_from([":", ",", ";", " ", "=", "\t", "/"])

# Names from the allowlisted prefixes that say nothing about a secret.
PLAIN_NAMES = st.builds(
    lambda prefix, rest: prefix + rest,
    st.sampled_from(ENV_PREFIXES),
    st.sampled_from(["NOTE", "X", "OPTS", "EXTRA_OPTIONS", "CONF", "IB_HCA", "DEBUG_FILE"]),
)


@st.composite
def planted(draw: st.DrawFn) -> tuple[str, str]:
    """(value, secret): a token or a credential somewhere inside a longer value."""
    how = draw(st.sampled_from(["token", "url", "pair", "option"]))
    if how == "token":
        secret = draw(TOKENS)
        inner = secret
    elif how == "url":
        secret = draw(PASSWORD)
        scheme = draw(st.sampled_from(["https", "http", "git+https", "s3", "postgres"]))
        inner = f"{scheme}://user:{secret}@host.example.invalid/path"
    elif how == "pair":
        secret = draw(PASSWORD)
        key = draw(st.sampled_from(["token", "password", "api_key", "secret", "auth", "pat"]))
        inner = f"{key}={secret}"
    else:
        secret = draw(PASSWORD.filter(lambda s: not s.startswith("-")))
        key = draw(st.sampled_from(["--token", "--password", "--api-key", "-secret"]))
        inner = f"{key} {secret}"
    before = draw(st.lists(PIECES, max_size=3))
    after = draw(st.lists(PIECES, max_size=3))
    sep = draw(SEPARATORS)
    if how == "option":
        sep = " "  # an option is a word of a command line
    value = sep.join([*before, inner, *after])
    return value, secret


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(name=PLAIN_NAMES, case=planted())
def test_no_planted_secret_survives_redaction(name: str, case: tuple[str, str]) -> None:
    value, secret = case
    entry = redact_env(name, value)
    assert is_redacted(entry), (name, value)
    assert secret not in json.dumps(entry)
    assert entry["reason"].startswith("value holds ")
    assert secret not in redact_text(value)
    assert secret not in json.dumps(redact_tree({"v": [value], value: 1}))


@settings(max_examples=200)
@given(case=planted())
def test_redacted_text_is_stable(case: tuple[str, str]) -> None:
    once = redact_text(case[0])
    assert redact_text(once) == once


@given(
    prefix=st.sampled_from(ENV_PREFIXES),
    word=st.sampled_from(["TOKEN", "PAT", "KEY", "PWD", "SECRET", "PASSWORD", "CREDENTIALS"]),
    value=st.text(min_size=1, max_size=40),
)
def test_secret_names_are_redacted_whatever_the_value(prefix: str, word: str, value: str) -> None:
    entry = redact_env(f"{prefix}{word}", value)
    assert is_redacted(entry) and set(entry) == {"redacted"}


# -- names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "github_token",
        "GH_TOKEN",
        "HFTOKEN",
        "GITHUB_PAT",
        "CUDA_PAT",
        "NCCL_IB_KEY",
        "DB_PASSWORD",
        "DB_PWD",
        "OPENAI_APIKEY",
        "WANDB_API_KEY",
        "AWS_REGION",
        "X_CREDENTIALS",
        "GCP_CREDS",
        "PRIVATE_KEY_PATH",
        "COOKIE_JAR",
        "MY_SESSION_ID",
        "TORCH_HUB_AUTH",
        "HTTP_AUTHORIZATION",
        "secretValue",
        "apiKey",
    ],
)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


HARMLESS_NAMES = [
    "PATH",
    "PWD",
    "OLDPWD",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "CUDA_PATH",
    "NCCL_IB_HCA",
    "NCCL_IB_PKEY",
    "NCCL_IB_GID_INDEX",
    "NCCL_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "KMP_AFFINITY",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUBLAS_WORKSPACE_CONFIG",
    "TORCH_CUDA_ARCH_LIST",
    "TORCH_LOGS",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "TOKENIZERS_PARALLELISM",
    "MAX_TOKENS",
    "GIT_AUTHOR_NAME",
    "KEYBOARD_LAYOUT",
    "StrictHostKeyChecking",
]


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_harmless_names(name: str) -> None:
    assert not is_secret_name(name)


# -- harmless real-world values stay readable --------------------------------------------

HARMLESS = [
    ("PATH", "/usr/local/cuda/bin:/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/bin:/bin"),
    ("LD_LIBRARY_PATH", "/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64"),
    ("PYTHONPATH", "/home/me/src/drafter:/home/me/src/tools"),
    ("PWD", "/home/me/src/drafter"),
    ("NCCL_IB_HCA", "mlx5_0,mlx5_1,mlx5_4,mlx5_5"),
    ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
    ("NCCL_SOCKET_IFNAME", "^lo,docker0"),
    ("NCCL_DEBUG_SUBSYS", "INIT,NET,GRAPH"),
    ("NCCL_TOPO_FILE", "/etc/nccl/topo-h200-sxm.xml"),
    ("NCCL_IB_PKEY", "0x8001"),
    ("OMP_NUM_THREADS", "8"),
    ("KMP_AFFINITY", "granularity=fine,compact,1,0"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:128"),
    ("PYTORCH_CUDA_ALLOC_CONF", "backend=cudaMallocAsync,garbage_collection_threshold=0.8"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"),
    ("CUDA_VISIBLE_DEVICES", "GPU-5b4c1a2e-0f6d-4e2a-9c3b-7d8e9f0a1b2c"),
    ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
    ("TORCH_CUDA_ARCH_LIST", "8.0 8.6 9.0+PTX"),
    ("TORCH_LOGS", "+dynamo,recompiles,graph_breaks"),
    ("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_me"),
    ("TRITON_CACHE_DIR", "/home/me/.triton/cache"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    ("NVIDIA_VISIBLE_DEVICES", "all"),
    ("NVIDIA_REQUIRE_CUDA", "cuda>=12.8 brand=tesla,driver>=535,driver<536"),
    ("TORCH_COMPILE_OPTIONS", "--mode max-autotune --fullgraph"),
    ("PIP_INDEX_URL", "https://mirror.example.invalid/simple"),
    ("TORCH_HOME", "/data/cache/torch-hub-sk-models"),
    ("CUDA_CACHE_PATH", "/home/me/.nv/ComputeCache"),
    ("TORCH_NOTE", "task-0123456789abcdefghijklmnop"),
    ("TORCH_NOTE", "hf_home is /data/hf_cache"),
    ("TORCH_NOTE", "git+https://example.invalid/org/repo.git@0123456789abcdef"),
    ("TORCH_NOTE", "sha256:" + "0" * 64),
]


@pytest.mark.parametrize(("name", "value"), HARMLESS)
def test_harmless_values_stay_readable(name: str, value: str) -> None:
    assert redact_env(name, value) == value
    assert redact_text(value) == value
    assert find_secrets(value) == []


# -- the entry forms -----------------------------------------------------------------------


def test_by_name_keeps_the_hash_form_only() -> None:
    assert redact_env("GITHUB_PAT", "x") == {"redacted": "2d711642"}


def test_by_shape_says_why_and_masks_the_rest() -> None:
    entry = redact_env("NCCL_NET_OPTS", "a=1,token=abc:def,b=2")
    assert entry["reason"] == "value holds a secret after token="
    assert entry["masked"] == "a=1,token=<redacted>,b=2"
    whole = redact_env("OMP_X", "sk-proj-" + "Ab3_" * 12)
    assert whole["reason"] == "value holds an API key (sk-...)"
    assert "masked" not in whole  # nothing left worth reading


def test_url_credentials_are_cut_out_everywhere_in_a_value() -> None:
    entry = redact_env("PATH", "/bin:https://u:p@a.invalid/x:git+ssh://tok@b.invalid/y")
    assert entry["masked"] == "/bin:https://a.invalid/x:git+ssh://b.invalid/y"
    assert entry["reason"] == "value holds credentials in a URL"


def test_mapping_and_unset() -> None:
    env = {"HF_TOKEN": "hf_x", "OMP_NUM_THREADS": "8", "GONE": None}
    out = redact_env_mapping(env)
    assert out["OMP_NUM_THREADS"] == "8" and out["GONE"] is None and is_redacted(out["HF_TOKEN"])


def test_text_redaction_in_prose_and_commands() -> None:
    token = "ghp_" + "a1B2" * 9
    text = f"export HF_TOKEN=abc123\ncurl -H 'Authorization: Bearer {token}' --password s3cr3t"
    out = redact_text(text)
    assert "abc123" not in out and token not in out and "s3cr3t" not in out
    assert out.count(PLACEHOLDER) == 3


def test_argv_words_after_a_secret_option_are_redacted() -> None:
    argv = ["train.py", "--token", "abc123", "--lr", "0.1", "--password=s3cr3t", "-k", "x"]
    assert redact_argv(argv) == [
        "train.py", "--token", PLACEHOLDER, "--lr", "0.1", f"--password={PLACEHOLDER}", "-k", "x"
    ]  # fmt: skip
    assert redact_tree({"smoke": argv})["smoke"][2] == PLACEHOLDER  # type: ignore[index]
    # shlex.join quotes what a shell would expand: the value still goes.
    quoted = "envbisect run -- python train.py --api-key 'ab$c9' --hf-token \"xyz987\""
    assert redact_text(quoted) == (
        "envbisect run -- python train.py --api-key '<redacted>' --hf-token \"<redacted>\""
    )


# -- end to end: real snapshot, diff and run write no planted secret anywhere --------------

PY = sys.executable
RESULT_LINE = 'print(\'ENVBISECT_RESULT {"ok": true, "tok_per_s": 5000}\')'
SECRET_NAMES = st.sampled_from(["GITHUB_PAT", "CUDA_PAT", "NCCL_IB_KEY", "HF_TOKEN", "DB_PWD"])
E2E_CASE = st.one_of(
    st.tuples(PLAIN_NAMES, planted()),
    st.tuples(SECRET_NAMES, PASSWORD.map(lambda p: (p, p))),
)


def _cli(*argv: str) -> Any:
    from click.testing import CliRunner

    from envbisect.cli import cli

    return CliRunner().invoke(cli, list(argv), standalone_mode=False, catch_exceptions=False)


@pytest.mark.slow
@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # shrinking whole CLI runs takes minutes
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(cases=st.lists(E2E_CASE, min_size=4, max_size=8, unique_by=lambda c: c[0]))
def test_no_planted_secret_reaches_any_file_the_commands_write(
    tmp_path_factory: pytest.TempPathFactory, cases: list[tuple[str, tuple[str, str]]]
) -> None:
    root = tmp_path_factory.mktemp("planted")
    planted_env = {name: value for name, (value, _secret) in cases}
    secrets = [secret for _name, (_value, secret) in cases]
    config = root / "envbisect.yaml"
    config.write_text(
        json.dumps({"env": sorted(planted_env), "manifests_dir": str(root / "manifests")})
    )
    clean = {k: v for k, v in os.environ.items() if k not in planted_env}
    with mock.patch.dict(os.environ, clean, clear=True):
        good = _cli("snapshot", "--config", str(config), "--python", PY, "--label", "good")
        assert good.return_value == 0, good.output
    with mock.patch.dict(os.environ, planted_env):
        bad = _cli("snapshot", "--config", str(config), "--python", PY, "--label", "bad")
        assert bad.return_value == 0, bad.output
        good_path, bad_path = good.stdout.strip(), bad.stdout.strip()
        for fmt in ("table", "markdown", "json", "yaml"):
            shown = _cli("diff", good_path, bad_path, "--format", fmt)
            assert shown.return_value == 1, shown.output  # different
            (root / f"diff.{fmt}").write_text(shown.output)
        ran = _cli(
            "run", "--config", str(config), "--python", PY, "--good", good_path,
            "--session", str(root / "session"), "--json", str(root / "run.json"),
            "--report", str(root / "report.md"), "--until-ktoks", "1k",
            "--", PY, "-c", RESULT_LINE, "--api-key", secrets[0],
        )  # fmt: skip
        (root / "run.out").write_text(ran.output)
        # Same speed on both sides: "not reproduced", after both endpoints ran -- and the
        # bad endpoint, which passes the added secrets through, was the state it claims to be.
        assert ran.return_value == 1, ran.output
        doc = json.loads((root / "run.json").read_text())
        assert doc["outcome"] == "not-reproduced", ran.output
        assert len(doc["trials"]) == 2
    assert (root / "session" / "bad.yaml").exists() and (root / "session" / "trials").is_dir()
    env = yaml.safe_load(Path(bad_path).read_text())["env"]
    assert all(is_redacted(env[name]) for name in planted_env)
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, (path, secret)


# ---- issue 24: more token formats; masked keeps at most 4 characters of a secret ----------

_SHAPED = {
    "npm": "npm_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG",
    "pypi": "pypi-AgEIcHlwaS5vcmcCJGE0ZjI4YjQ4LTk0ZTAtNDk2Ny1hZDc3LTM2YzY2YzVk",
    "databricks": "dapi" + "0123456789abcdef" * 2,
    "stripe": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "sendgrid": "SG." + "abcdefghijklmnopqrstuv" + "." + "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345",
    "google-oauth": "ya29." + "a0AfH6SMBx3j2kLmNoPqRsTuVwXyZ",
    "hf-org": "api_org_" + "abcdefghijklmnopqrstuvwxyzABCD",
    "docker": "dckr_pat_" + "abcdefghijklmnopqrstuvwx",
}
_EMBEDDED = {
    "sas": (
        "https://a.blob.core.windows.net/c/b?sv=2022-11-02&sig=",
        "kXp9%2BqZ7mW3rT5vY8bN1cD4fG6hJ%3D",
        "&se=2026",
    ),
    "azure": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=",
        "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA==",
        ";EndpointSuffix=core.windows.net",
    ),
    "basic": ("Basic ", "dXNlcjpodW50ZXIyLXZlcnktc2VjcmV0", ""),
    "yaml-password": ("password: ", "hunter2-correct-horse", ""),
}


def _longest_common(a: str, b: str) -> int:
    best = 0
    for i in range(len(a)):
        for j in range(i + best + 1, len(a) + 1):
            if a[i:j] in b:
                best = j - i
            else:
                break
    return best


@pytest.mark.parametrize("name", sorted(_SHAPED))
def test_more_token_formats_are_redacted_by_shape(name: str) -> None:
    secret = _SHAPED[name]
    entry = redact_env("OMP_HARMLESS_NAME", secret)
    assert is_redacted(entry), name
    assert secret not in redact_text(f"token in prose {secret} here")


@pytest.mark.parametrize("name", sorted(_EMBEDDED))
def test_masked_keeps_at_most_four_characters_of_a_secret(name: str) -> None:
    before, secret, after = _EMBEDDED[name]
    entry = redact_env("OMP_HARMLESS_NAME", before + secret + after)
    assert is_redacted(entry), name
    assert isinstance(entry, dict)
    shown = str(entry.get("masked", ""))
    assert _longest_common(secret, shown) <= 4, shown


def test_trial_output_files_are_private(tmp_path: Path) -> None:
    from envbisect.transport import Transport

    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "run.stdout").write_text("old\n")
    os.chmod(tmp_path / "log" / "run.stdout", 0o644)
    Transport().run([sys.executable, "-c", "print('tok 1')"], log_dir=tmp_path / "log")
    for suffix in ("stdout", "stderr"):
        mode = (tmp_path / "log" / f"run.{suffix}").stat().st_mode & 0o777
        assert mode == 0o600, (suffix, oct(mode))
