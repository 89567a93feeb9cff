from __future__ import annotations

import pytest
import torch

from kelp.errors import UserError
from kelp.trainer.device import resolve_device


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("setting", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_a_user_error(setting: str) -> None:
    with pytest.raises(UserError, match="CUDA is not available"):
        resolve_device(setting)


def test_garbage_is_a_user_error() -> None:
    with pytest.raises(UserError, match="expected auto"):
        resolve_device("tpu")
