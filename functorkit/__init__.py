"""functorkit: treat any nested structure of arrays as a value.

Map over it, zip several, flatten it to one vector and rebuild it, do
arithmetic on whole models, load one into another — on NumPy, PyTorch,
JAX, CuPy, Dask and array-api-strict arrays, with no silent conversion.
"""

from ._arith import add as add
from ._arith import copy as copy
from ._arith import lerp as lerp
from ._arith import lincomb as lincomb
from ._arith import mean as mean
from ._arith import scale as scale
from ._arith import sub as sub
from ._broadcast import broadcast_prefix as broadcast_prefix
from ._checkpoint import load as load
from ._checkpoint import open as open
from ._checkpoint import save as save
from ._compare import all_finite as all_finite
from ._compare import allclose as allclose
from ._compare import assert_allclose as assert_allclose
from ._destructure import destructure as destructure
from ._errors import PolicyError as PolicyError
from ._errors import StructureError as StructureError
from ._flat import Restructure as Restructure
from ._keypath import KeyPath as KeyPath
from ._load import load_into as load_into
from ._merge import dare as dare
from ._merge import model_stock as model_stock
from ._merge import slerp as slerp
from ._merge import task_arithmetic as task_arithmetic
from ._merge import ties as ties
from ._pertensor import tensor_dots as tensor_dots
from ._pertensor import tensor_norms as tensor_norms
from ._pertensor import tensor_thresholds as tensor_thresholds
from ._record import flatten as flatten
from ._record import unflatten as unflatten
from ._reduce import dot as dot
from ._reduce import filter_normalize as filter_normalize
from ._reduce import norm as norm
from ._reduce import normalize as normalize
from ._registry import register as register
from ._registry import register_dataclass as register_dataclass
from ._registry import register_leaf as register_leaf
from ._replace import replace as replace
from ._stack import stack as stack
from ._stack import unstack as unstack
from ._state import IncompatibleKeys as IncompatibleKeys
from ._state import load_state_dict as load_state_dict
from ._state import state_dict as state_dict
from ._structured import Diagonal as Diagonal
from ._structured import Transpose as Transpose
from ._summary import Summary as Summary
from ._summary import summary as summary
from ._tools import combine as combine
from ._tools import partition as partition
from ._treedef import TreeDef as TreeDef
from ._typing import Policy as Policy
from ._walk import fmap as fmap
from ._walk import fmap_with_path as fmap_with_path
from ._walk import fmapstructure as fmapstructure
from ._walk import leaves as leaves
from ._walk import leaves_with_path as leaves_with_path

__version__ = "0.1.0"

__all__ = [
    "Diagonal",
    "IncompatibleKeys",
    "KeyPath",
    "Policy",
    "PolicyError",
    "Restructure",
    "StructureError",
    "Summary",
    "Transpose",
    "TreeDef",
    "add",
    "all_finite",
    "allclose",
    "assert_allclose",
    "broadcast_prefix",
    "combine",
    "copy",
    "dare",
    "destructure",
    "dot",
    "filter_normalize",
    "flatten",
    "fmap",
    "fmap_with_path",
    "fmapstructure",
    "leaves",
    "leaves_with_path",
    "lerp",
    "lincomb",
    "load",
    "load_into",
    "load_state_dict",
    "mean",
    "model_stock",
    "norm",
    "normalize",
    "open",
    "partition",
    "register",
    "register_dataclass",
    "register_leaf",
    "replace",
    "save",
    "scale",
    "slerp",
    "stack",
    "state_dict",
    "sub",
    "summary",
    "task_arithmetic",
    "tensor_dots",
    "tensor_norms",
    "tensor_thresholds",
    "ties",
    "unflatten",
    "unstack",
]


def _publish() -> None:
    """Give the public classes, errors and the `Policy` alias their public home, ``functorkit``:
    tracebacks and reprs show ``functorkit.PolicyError``, and ``pickle`` stores (and finds) a class
    as ``functorkit.X``; pickles that name the defining module still load (it still has the class).
    Functions keep their defining module (a function's repr and a traceback do not show it, and
    the docstring examples are found by it). A class's own docstring examples are then collected
    with this module's; its methods' examples stay with the defining module, listed in its
    ``__test__`` (doctest looks for a class's methods only in the module the class names).
    """
    import inspect
    import sys
    import typing

    for name in __all__:
        obj = globals()[name]
        if not (isinstance(obj, type) or name == "Policy"):
            continue
        if isinstance(obj, type):
            own = inspect.get_annotations(obj)
            if own:  # resolved now, in the defining module: typing.get_type_hints(obj) would look
                # the (postponed, string) annotations up in ``functorkit``'s namespace once moved
                hints = typing.get_type_hints(obj)
                obj.__annotations__ = {k: hints[k] for k in own}
            tests = sys.modules[obj.__module__].__dict__.setdefault("__test__", {})
            for member, value in vars(obj).items():
                fn = getattr(value, "__func__", value)  # properties are collected with the class
                if inspect.isfunction(fn) and ">>>" in (fn.__doc__ or ""):
                    tests[f"{name}.{member}"] = fn
        obj.__module__ = __name__


_publish()
