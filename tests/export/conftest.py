"""Export tests run real CPU steps: one intra-op thread each, so that the two cores of CI (and
a shared machine) are not oversubscribed; the setting is restored after each test."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
