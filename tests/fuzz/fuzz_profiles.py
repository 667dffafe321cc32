"""Hypothesis profiles of the differential fuzzer (tests/fuzz/test_fuzz.py), registered when
that module imports this one (not a ``conftest.py``: a second module named ``conftest`` would
shadow ``tests/conftest.py`` for the suite's ``from conftest import ...``).

* ``fuzz-ci`` (the default here): the bounded run of ``make test``; derandomized, so the suite
  is reproducible and a find shows up in a fuzzing run, not as a flaky CI failure.
* ``fuzz``: ``make fuzz``, many more examples from a fresh seed (printed by the Makefile), the
  failing examples kept in the example database (``.hypothesis/fuzz``) and replayed first on
  the next run.

``FUZZ_EXAMPLES`` overrides the number of examples per emitter mode of either.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_DB = DirectoryBasedExampleDatabase(str(Path(__file__).resolve().parents[2] / ".hypothesis" / "fuzz"))
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture]


def _examples(default: int) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES", default))


settings.register_profile("fuzz-ci", deadline=None, max_examples=_examples(20), derandomize=True,
                          database=None, suppress_health_check=_SLOW_OK, print_blob=True,
                          phases=[Phase.explicit, Phase.generate])  # no shrinking: bounded
settings.register_profile("fuzz", deadline=None, max_examples=_examples(300), database=_DB,
                          suppress_health_check=_SLOW_OK, print_blob=True, report_multiple_bugs=True)
