from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from envbisect.model.errors import UsageError
from envbisect.model.metric import (
    FIGURE_SEEN,
    MetricSpec,
    Threshold,
    format_ktok,
    format_tok,
    measure,
    parse_ktoks,
    suggested_regex,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12000", 12000.0),
        ("12k", 12000.0),
        ("12.8k", 12800.0),
        ("12.8K", 12800.0),
        ("1,500", 1500.0),
        ("12.8 Ktok/s", 12800.0),
        ("12.8Ktok/s", 12800.0),
        ("15tok/s", 15.0),
        ("1.5M", 1.5e6),
    ],
)
def test_parse_ktoks(text: str, value: float) -> None:
    assert parse_ktoks(text) == value


@pytest.mark.parametrize("text", ["fast", "-3", "0", "k", "inf", "1e400", "nan", "-inf"])
def test_parse_ktoks_rejects_nonsense_in_one_line(text: str) -> None:
    with pytest.raises(UsageError, match="--until-ktoks"):
        parse_ktoks(text)


def test_format_tok_matches_the_start_line() -> None:
    assert format_tok(12000) == "12,000 tok/s (12.0 Ktok/s)"
    assert format_tok(17690.4) == "17,690 tok/s (17.7 Ktok/s)"  # never 1.769e+04
    assert format_ktok(125.0) == "0.125" and format_ktok(4321.0) == "4.3"


@pytest.mark.parametrize("text", ["15", "12.8", "999"])
def test_a_bare_number_below_1000_is_refused_and_the_line_says_how_to_write_it(
    text: str,
) -> None:
    """Found 5: --until-ktoks 15 meant 15 tok/s and was accepted while the good state ran
    at 18,000; every state was "good"."""
    with pytest.raises(UsageError) as info:
        parse_ktoks(text)
    value = float(text) * 1000
    assert str(info.value) == (
        f"--until-ktoks {text!r}: a bare number below 1,000 is ambiguous — write {text}k for "
        f"{value:,.0f} tok/s ({value / 1000:.1f} Ktok/s), or {text}tok/s if you mean {text} "
        "tokens per second"
    )


def test_threshold_forms_and_where_they_came_from() -> None:
    pct = Threshold.parse("70%", "--until 70%", "--until")
    assert pct.fraction == pytest.approx(0.7) and pct.value is None
    assert pct.describe() == "good means ≥ 70% of the good state's measured speed, from --until 70%"
    abs_ = Threshold.parse("12.8k", "envbisect.yaml threshold", "threshold")
    assert abs_.value == 12800.0
    assert abs_.describe() == (
        "good means ≥ 12,800 tok/s (12.8 Ktok/s), from envbisect.yaml threshold"
    )
    assert Threshold.parse(12000, "x", "threshold").value == 12000.0
    with pytest.raises(UsageError, match="between 0% and 100%"):
        Threshold.parse("140%", "x", "--until")
    with pytest.raises(UsageError, match=r"'60%%': not a percentage: a number then one %"):
        Threshold.parse("60%%", "x", "--until")  # as a shell script's printf escape leaves it
    with pytest.raises(UsageError, match="ambiguous"):
        Threshold.parse(15, "x", "threshold")


def test_metric_regex_unit_scales_and_last_match_wins() -> None:
    spec = MetricSpec.parse(r"([0-9.]+) Ktok/s")
    assert spec.scale == 1000
    log = "step 1: 3.1 Ktok/s\nstep 2: 12.8 Ktok/s\n"
    assert spec.read(log) == pytest.approx(12800.0)
    assert MetricSpec.parse(r"throughput=([0-9.]+)\s*tok/s").read("throughput=950 tok/s") == 950


@pytest.mark.parametrize("regex", [r"[0-9.]+ Ktok/s", r"([0-9.]+)", r"(["])
def test_metric_regex_errors_name_the_option(regex: str) -> None:
    with pytest.raises(UsageError, match="--metric-regex"):
        MetricSpec.parse(regex)


def test_sources_in_order_file_then_frame_then_line(tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"ok": True, "tok_per_s": 100.0}))
    line = b'noise\nENVBISECT_RESULT {"ok": true, "tok_per_s": 300.0}\n'
    frame = {"ok": True, "tok_per_s": 200.0}
    kw = {"stderr": b"", "returncode": 0, "timed_out": False}
    assert measure(stdout=line, result_file=f, frame=frame, **kw).tok_per_s == 100.0
    assert measure(stdout=line, result_file=tmp_path / "none", frame=frame, **kw).source == "frame"
    m = measure(stdout=line, result_file=tmp_path / "none", **kw)
    assert (m.tok_per_s, m.source) == (300.0, "line")


def test_failures_are_named() -> None:
    ok_line = b'ENVBISECT_RESULT {"ok": true, "tok_per_s": 5.0}\n'
    assert (
        measure(stdout=ok_line, stderr=b"", returncode=None, timed_out=True, timeout_s=30).failure
        == "timeout after 30s"
    )
    crashed = measure(
        stdout=ok_line, stderr=b"Traceback\nRuntimeError: boom\n", returncode=1, timed_out=False
    )
    assert crashed.failure == "crash: exit 1: RuntimeError: boom"
    oom = measure(
        stdout=b"",
        stderr=b"torch.OutOfMemoryError: CUDA out of memory\n",
        returncode=1,
        timed_out=False,
    )
    assert oom.failure is not None and oom.failure.startswith("oom:")
    bad_result = (
        b'ENVBISECT_RESULT {"ok": false, "tok_per_s": null, '
        b'"error": {"class": "RuntimeError", "message": "is_fx_symbolic_tracing"}}\n'
    )
    m = measure(stdout=bad_result, stderr=b"", returncode=0, timed_out=False)
    assert m.failure == "crash: RuntimeError: is_fx_symbolic_tracing"
    none = measure(stdout=b"hello\n", stderr=b"", returncode=0, timed_out=False)
    assert none.failure is not None and none.failure.startswith("no metric:")
    spec = MetricSpec.parse(r"([0-9.]+) tok/s")
    assert (
        measure(
            stdout=b"7.5 tok/s\n", stderr=b"", returncode=0, timed_out=False, spec=spec
        ).tok_per_s
        == 7.5
    )


@pytest.mark.parametrize("raw", ["Infinity", "1e999", "NaN", "-Infinity"])
def test_a_non_finite_throughput_is_a_crash_not_a_sample(tmp_path: Path, raw: str) -> None:
    line = b'ENVBISECT_RESULT {"ok": true, "tok_per_s": ' + raw.encode() + b"}\n"
    m = measure(stdout=line, stderr=b"", returncode=0, timed_out=False)
    assert m.tok_per_s is None
    assert m.failure is not None and m.failure.startswith("crash: non-finite throughput")
    result_file = tmp_path / "result.json"
    result_file.write_text(f'{{"ok": true, "tok_per_s": {raw}}}')
    m = measure(stdout=b"", stderr=b"", returncode=0, timed_out=False, result_file=result_file)
    assert m.failure is not None and "non-finite throughput" in m.failure


def test_a_non_finite_regex_match_is_a_crash_too() -> None:
    spec = MetricSpec.parse(r"([0-9.e+]+) tok/s")
    m = measure(
        stdout=b"step 9: 1e999 tok/s\n", stderr=b"", returncode=0, timed_out=False, spec=spec
    )
    assert m.tok_per_s is None and m.failure == "crash: non-finite throughput (inf tok/s)"


def test_a_long_sample_list_shows_its_first_its_last_and_the_count() -> None:
    # A threaded user script's step windows: 133 samples made the trial line and the table
    # row hundreds of columns wide (seen on CPU, a user's own three-thread trainer).
    from envbisect.model.metric import ktok_list

    samples = [1000.0 * (i + 1) for i in range(133)]
    assert ktok_list(samples) == "1.0, 2.0, 3.0, 4.0, 5.0, 6.0, …, 133.0 (133 samples)"
    assert ktok_list([12600.0, 12400.0], [False, True]) == "12.6, 12.4*"
    assert ktok_list([], sep=" ") == "-"


@pytest.mark.parametrize(
    ("line", "regex", "tok_per_s"),
    [
        ("throughput: 7.2 Ktok/s", "throughput: ([0-9.]+) Ktok/s", 7200.0),
        ("step 9 | loss 0.51 | tok/s 1,234 | 3.4 Ktok/s", r"\| ([0-9.]+) Ktok/s", 3400.0),
        ("[train] speed=12,345tok/s", r"\[train\] speed=([0-9.,]+)tok/s", 12345.0),
        ("rank0: 812.5 tokens/sec", ": ([0-9.]+) tokens/sec", 812.5),
    ],
)
def test_a_printed_figure_gets_a_regex_that_reads_it(
    line: str, regex: str, tok_per_s: float
) -> None:
    assert suggested_regex(f"loading\n{line}\nbye\n") == shlex.quote(regex)
    assert MetricSpec.parse(regex).read(line) == pytest.approx(tok_per_s)


def test_no_regex_is_made_up_without_a_figure_in_tokens_per_second() -> None:
    assert suggested_regex("step 3 loss 0.5\n12.5 it/s\ntokens/s: 55\n") is None
    failure = measure(stdout=b"12.5 it/s\n", stderr=b"", returncode=0, timed_out=False).failure
    assert FIGURE_SEEN not in str(failure)
    seen = measure(stdout=b"done: 9.5 tok/s\n", stderr=b"", returncode=0, timed_out=False)
    assert "read with --metric-regex 'done: ([0-9.]+) tok/s'" in str(seen.failure)


@pytest.mark.parametrize(
    ("regex", "unit", "lower"),
    [
        (r"(?m)^([0-9.]+) tok/s$", "tok/s", False),  # an inline flag is no group
        (r"(?:step \d+ )?([0-9.]+)\s*Ktok/s", "Ktok/s", False),
        (r"time ([0-9.]+)ms", "ms", True),  # nanoGPT
        (r"([0-9.]+)s/it", "s/it", True),  # tqdm, slower than 1 it/s
        (r"(?P<rate>[0-9.]+)it/s", "it/s", False),
        (r"([0-9.]+)\s+samples/sec\b", "samples/sec", False),
        (r"train_samples_per_second': ([0-9.]+)", "samples/s", False),  # named before it
        (r"mfu ([0-9.]+)%", "%", False),
    ],
)
def test_the_unit_after_the_group_says_which_way_is_better(
    regex: str, unit: str, lower: bool
) -> None:
    spec = MetricSpec.parse(regex)
    assert (spec.unit.name, spec.unit.lower_is_better) == (unit, lower)


def test_a_figure_of_no_known_unit_needs_its_way_said() -> None:
    with pytest.raises(UsageError, match="--higher-is-better or --lower-is-better"):
        MetricSpec.parse(r"loss ([0-9.]+)")
    spec = MetricSpec.parse(r"loss ([0-9.]+)", "lower")
    assert spec.unit.lower_is_better and spec.samples("loss 2.0\nloss 4.0\n") == [0.5, 0.25]
    # A time is read the right way round: 120 ms a step is a rate of 1/0.120 s.
    assert MetricSpec.parse(r"time ([0-9.]+)ms").read("iter 3: time 120ms") == pytest.approx(
        1 / 0.120
    )


def test_until_takes_the_figures_own_unit() -> None:
    from envbisect.model.units import Unit

    ms = Unit("ms", 1e-3, lower_is_better=True)
    t = Threshold.parse("150ms", "--until 150ms", "--until")
    assert t.unit == ms and t.value == pytest.approx(1 / 0.150)
    assert t.describe() == "good means ≤ 150 ms, from --until 150ms"
    bare = Threshold.parse("150", "--until 150", "--until", ms).in_unit(ms, "--until")
    assert bare.value == pytest.approx(1 / 0.150) and bare.unit == ms
    with pytest.raises(UsageError, match="a token rate, but the command's figure is read in ms"):
        Threshold.parse("12k", "--until 12k", "--until").in_unit(ms, "--until")
    with pytest.raises(UsageError, match="a figure in ms, but the command's figure is read in"):
        t.in_unit(Unit("tok/s"), "--until")
