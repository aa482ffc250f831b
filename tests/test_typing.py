"""The public API's types as a `mypy --strict` user sees them (tests/typing/user_code.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_mypy_strict_sees_the_users_model_type(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    src = HERE / "typing" / "user_code.py"
    config = tmp_path / "mypy.ini"
    # functorkit's own annotations are what is checked: its dependencies' stubs are skipped (fast)
    config.write_text("[mypy]\nstrict = True\n[mypy-numpy.*,array_api_compat.*]\nfollow_imports = skip\n")
    out, err, status = api.run(
        ["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(src)]
    )
    lines = [re.sub(r"^.*user_code\.py:(\d+): ", r"\1: ", ln) for ln in out.splitlines() if ln.strip()]
    assert lines == [
        '27: note: Revealed type is "user_code.Model"',
        '28: note: Revealed type is "functorkit._flat.Restructure[user_code.Model]"',
        "29: error: Argument \"policy\" to \"destructure\" has incompatible type \"Literal['lenient']\"; "
        "expected \"Literal['strict', 'model', 'flat']\"  [arg-type]",
        '30: error: Incompatible types in assignment (expression has type "Model", variable has type "int")  '
        "[assignment]",
    ], out + err
    assert status == 1
