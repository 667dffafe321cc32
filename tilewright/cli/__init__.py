"""Command line: ``tilewright demo / templates / config / explain / cache / warm / bench``."""
