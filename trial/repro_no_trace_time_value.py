"""A graph recompiled with dynamic sizes whose input is strided (a slice with step 2) could not
compile: "no trace-time value for size sNN" and the whole graph ran on ATen.
Run: TILEWRIGHT_STRICT=1 .venv/bin/python trial/repro_no_trace_time_value.py"""
import torch
torch.set_num_threads(1)


def f(x):
    return x.sum(-1, keepdim=True) + 1


c = torch.compile(f, backend="tilewright")
for n in (8, 10, 13, 5):                     # the second size makes Dynamo recompile with dynamic sizes
    base = torch.randn(6, 2 * n)
    x = base[:, ::2]                    # stride (2n, 2): its row stride is a symbol of its own
    torch.testing.assert_close(c(x), f(x))
print("ok")
