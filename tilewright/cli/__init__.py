"""Command line: ``tilewright demo / templates / config / explain``."""
