"""functorkit: treat any nested structure of arrays as a value.

Map over it, zip several, flatten it to one vector and rebuild it, do
arithmetic on whole models, load one into another — on NumPy, PyTorch,
JAX, CuPy, Dask and array-api-strict arrays, with no silent conversion.
"""

from ._errors import PolicyError as PolicyError
from ._errors import StructureError as StructureError
from ._flat import Restructure as Restructure
from ._flat import destructure as destructure
from ._keypath import KeyPath as KeyPath
from ._registry import register as register
from ._registry import register_dataclass as register_dataclass
from ._registry import register_leaf as register_leaf
from ._walk import fmap as fmap
from ._walk import fmap_with_path as fmap_with_path
from ._walk import fmapstructure as fmapstructure
from ._walk import leaves as leaves
from ._walk import leaves_with_path as leaves_with_path

__version__ = "0.1.0"

__all__ = [
    "KeyPath",
    "PolicyError",
    "Restructure",
    "StructureError",
    "destructure",
    "fmap",
    "fmap_with_path",
    "fmapstructure",
    "leaves",
    "leaves_with_path",
    "register",
    "register_dataclass",
    "register_leaf",
]
