"""Run a tiny compiled function under one bad TILEWRIGHT_* value (set by the caller) and print
what the user sees: `TILEWRIGHT_GRAPH_RACE=bogus .venv/bin/python trial/bad_env.py`."""
import torch
torch.set_num_threads(1)
c = torch.compile(lambda x: torch.relu(x @ x.t()) + 1, backend="tilewright")
x = torch.randn(4, 4)
try:
    for _ in range(12):
        out = c(x)
    print("RAN", torch.allclose(out, torch.relu(x @ x.t()) + 1))
except Exception as e:
    print("RAISED", type(e).__module__ + "." + type(e).__name__, "|", str(e).strip().splitlines()[:3])
