"""DeepSpeed trains the torch modules unchanged: the canonical models, their mapping from the
canonical parameters and the loss wrapper are sextant.backends.torch_backend.model's.

DeepSpeed is a layer over PyTorch that needs no model code of its own (the engine wraps the
module; ZeRO-3 partitions its parameters in place), so this module only re-exports them.
"""

from sextant.backends.torch_backend.model import (
    WithLoss,
    add_adapters,
    build,
    canonical_names,
    load_canonical,
)

__all__ = ["WithLoss", "add_adapters", "build", "canonical_names", "load_canonical"]
