"""tilewright: compiler-centric kernel generation for PyTorch.

``torch.compile(model, backend="tilewright")`` lowers the captured graph, fuses epilogues into its
GEMMs, and runs each GEMM on the kernel the autotuner picks (generated Triton or ATen).
Settings live in :data:`tilewright.config`.
"""

from tilewright._config import Config, config
from tilewright.errors import TilewrightError

__version__ = "0.1.0"

__all__ = ["Config", "TilewrightError", "__version__", "config"]
