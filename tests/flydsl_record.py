"""Child process of tests/test_flydsl_launch.py: calls rendered FlyDSL modules' ``launch`` with
CPU tensors under FlyDSL's compile-only mode, with a recording stand-in for the launch
(:func:`tilewright.templates.flydsl.launch.record_launches`, which also traces and compiles the
recorded call through ``flyc.compile``) and a spy for the current stream, and prints what each
launch passed as JSON.

Usage: ``python tests/flydsl_record.py CASES.json`` (environment: ``compile_env(arch, dump)``).
Each case: ``{"name", "source" (a rendered module's path), "build" (Python defining tensors),
"call" (an expression calling ``mod.launch``)}``. Per recorded argument: a tensor's shape,
strides, dtype, device and which tensor of ``build`` it views (name and storage offset; None
for a buffer the launcher made), an int's value, the stream's handle as FlyDSL packs it.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

from tilewright.templates.flydsl import launch as rt


class FakeStream:
    """What ``torch.cuda.current_stream`` returns on a ROCm build: an object with a handle."""

    cuda_stream = 0xBEEF


def describe(value, named: dict[str, torch.Tensor]):
    if isinstance(value, torch.Tensor):
        of = None
        for name, t in named.items():
            if t.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():
                of = name
                break
        return {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype),
                "device": str(value.device), "of": of, "offset": value.storage_offset()}
    if isinstance(value, int):
        return value
    if isinstance(value, FakeStream):
        # FlyDSL's own packing of a stream argument: what a device launch hands HIP
        from flydsl.expr.typing import Stream

        (ctype, fill), = Stream(None).__c_abi_spec__()
        slot = ctype()
        fill(value, slot)
        return {"stream": slot.value}
    return {"other": repr(value)}


def main(path: str) -> None:
    cases = json.load(open(path))
    asked: list[str] = []

    def spy(device):
        asked.append(str(device))
        return FakeStream()

    rt.current_stream = spy  # the launcher asks for the stream of the tensors' device
    report = []
    for case in cases:
        spec = importlib.util.spec_from_file_location(f"tw_case_{case['name']}", case["source"])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        ns: dict = {"torch": torch, "mod": mod}
        exec(case["build"], ns)
        named = {k: v for k, v in ns.items() if isinstance(v, torch.Tensor)}
        del asked[:]
        with rt.record_launches(compile=True) as records:
            result = eval(case["call"], ns)
        outs = result if isinstance(result, (tuple, list)) else (result,)
        named.update({f"result{i}": t for i, t in enumerate(outs) if isinstance(t, torch.Tensor)})
        report.append({
            "name": case["name"], "asked": list(asked),
            "launches": [{"entry": r.entry, "params": r.params, "annotations": r.annotations,
                          "problems": r.problems, "args": [describe(a, named) for a in r.call]}
                         for r in records]})
    sys.stdout.write("RECORD " + json.dumps(report) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
