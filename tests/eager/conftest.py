import pytest
import torch

from tests.eager.parity import DEV


@pytest.fixture
def dev() -> torch.device:
    return DEV
