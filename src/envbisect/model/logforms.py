"""Training logs read without a --metric-regex: the forms most trainers print, and the
probe's own step timing when a log prints none of them. Pure functions, no I/O.

The rule, tried in this order on a run's stdout and stderr (the first form with a match is
the run's figure, every matched line after the first third one sample, as with a regex):

1. a token rate: ``12.8 Ktok/s``, ``950 tokens/s``;
2. Hugging Face Trainer's summary: ``train_samples_per_second``, else
   ``train_steps_per_second``;
3. tqdm and Lightning's bar: ``3.21it/s``, or ``1.42s/it`` once it runs slower than one
   iteration a second (both read, as iterations per second);
4. nanoGPT's iteration line: ``iter 10: loss 3.21, time 120.33ms`` (time per iteration,
   lower is better), and any ``step``/``iter`` line that prints ``time`` in ms or s.

When none matches, a Python command whose optimizer steps the probe timed gets their rate as
its figure (``steps/s``, from ``model.steps``): never "no metric" for a torch program whose
steps were seen. Once a run of a command was read one way, every later run of it is read the
same way (``Choice``): a state that prints another form is not compared across units.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from envbisect.model.metric import MetricSpec
from envbisect.model.units import Unit


@dataclass(frozen=True)
class LogForm:
    """One recognized form: its name (said in the trial log), the regex, its unit."""

    name: str
    regex: str
    unit: Unit

    def spec(self) -> MetricSpec:
        return MetricSpec(re.compile(self.regex), self.unit, label=self.name)


FORMS: tuple[LogForm, ...] = (
    LogForm(
        "a token rate",
        r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?([KkMm]?tok(?:en)?s?/s(?:ec)?)(?![A-Za-z])",
        Unit("tok/s"),
    ),
    LogForm(
        "Hugging Face Trainer's train_samples_per_second",
        r"""['"]?train_samples_per_second['"]?\s*[:=]\s*([0-9.]+(?:[eE][+-]?\d+)?)""",
        Unit("samples/s"),
    ),
    LogForm(
        "Hugging Face Trainer's train_steps_per_second",
        r"""['"]?train_steps_per_second['"]?\s*[:=]\s*([0-9.]+(?:[eE][+-]?\d+)?)""",
        Unit("steps/s"),
    ),
    LogForm(
        "a progress bar's it/s (tqdm, Lightning)",
        r"(?<![\w.])(\d+(?:\.\d+)?)\s?(it/s|s/it)\b",
        Unit("it/s"),
    ),
    LogForm(
        "an iteration's time (nanoGPT's 'iter N: … time Xms')",
        r"(?i)\b(?:iter|iteration|step)\b[^\n]*?\btime\W{0,3}(\d+(?:\.\d+)?)\s?(ms|s)\b",
        Unit("ms", 1e-3, lower_is_better=True),
    ),
)


def recognize(text: str) -> MetricSpec | None:
    """The spec of the first form ``text`` matches (``FORMS`` order), or None."""
    for form in FORMS:
        spec = form.spec()
        if spec.values(text):
            return spec
    return None


@dataclass
class Choice:
    """How one command's runs are read once the first was (``recognize`` or the probe's
    steps): every run of a bisection in the same form, so no two states are compared across
    units. Shared by the threads that measure at once."""

    spec: MetricSpec | None = None
    steps: bool = False  # read from the probe's timed steps (no form matched)
    result: bool = False  # read from its own ENVBISECT_RESULT (runs must reach their end)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def take(self, spec: MetricSpec | None, steps: bool, result: bool = False) -> None:
        with self.lock:
            if not self.made:
                self.spec, self.steps, self.result = spec, steps, result

    @property
    def made(self) -> bool:
        return self.spec is not None or self.steps or self.result
