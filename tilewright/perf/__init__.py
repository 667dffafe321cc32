"""The performance gate: benchmark suites (``run``), regression comparison (``compare``) and
reports (``report``) behind ``tilewright bench``. Baselines live per arch under
``bench/baselines/<arch>/<suite>.json``."""
