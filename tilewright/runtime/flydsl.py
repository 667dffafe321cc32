"""Moved to :mod:`tilewright.templates.flydsl.runtime`.

FlyDSL's compile-only driver and toolchain checks belong to the language's folder; this path is
kept for one release (a DeprecationWarning). ``python -m tilewright.runtime.flydsl SOURCE``, the
child an older driver spawned, still compiles one rendered module.
"""

if __name__ == "__main__":
    import importlib
    import sys

    # by name, as the alias below: the runtime layer imports no template module
    importlib.import_module("tilewright.templates.flydsl.runtime")._child_main(sys.argv[1])
else:
    from tilewright._moved import alias

    alias(__name__, "tilewright.templates.flydsl.runtime")
