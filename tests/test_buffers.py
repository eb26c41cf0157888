"""What a buffer that ringlet cannot take is told (pure), and the names of dtype codes."""

from __future__ import annotations

import numpy as np
import pytest

import ringlet
from ringlet.buffers import as_buffer
from ringlet.ops import _PAIR_BASE, DTYPES, dtype_of_code


def test_a_read_only_out_is_not_told_to_give_out() -> None:
    ro = np.ones(4)
    ro.flags.writeable = False
    with pytest.raises(ringlet.ArgumentError) as exc:
        as_buffer(ro, "out", writable=True)
    assert str(exc.value) == "out is read-only but this call writes into it; pass a " \
                             "writable array"
    with pytest.raises(ringlet.ArgumentError, match="writable array or give out="):
        as_buffer(ro, "x", writable=True)


def test_a_sparse_tensor_is_told_to_be_made_dense() -> None:
    torch = pytest.importorskip("torch")
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(ringlet.ArgumentError, match=r"x is a sparse_coo tensor; ringlet "
                                                    r"moves dense ones only: pass x.to_dense"):
        as_buffer(sparse, "x", writable=False)


def test_a_pair_types_code_is_named_before_this_process_met_the_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A receive of (value, index) pairs that does not fit said 'holds 16 x 244': the
    pair's code, and bytes for elements (the receiving process had never made the type)."""
    monkeypatch.setattr("ringlet.ops._PAIRS", {})
    code = _PAIR_BASE + 16 * DTYPES["float64"].code + DTYPES["int64"].code
    d = dtype_of_code(code)
    assert d is not None and d.name == "pair(float64,int64)" and d.itemsize == 16
    assert d.code == code
    assert dtype_of_code(DTYPES["float32"].code) is DTYPES["float32"]
    assert dtype_of_code(_PAIR_BASE + 16 * 15) is None       # no such value type
    assert dtype_of_code(60) is None
    # the type it names is the one ringlet.pairs makes
    assert ringlet.pairs([1.0], [2]).dtype == d.np_dtype
