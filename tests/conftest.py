"""Shared test setup.

Tests that need a CUDA GPU carry the ``gpu`` marker; where they cannot run they are skipped with
the reason (shown by ``pytest -ra``), so the same command works on CI machines without a GPU.
"""

import zlib

import pytest


def _gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run on this machine, or None if they can."""
    try:
        import torch
    except ModuleNotFoundError:
        return "torch is not installed: GPU tests need it"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible: GPU tests need one"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def seed(request) -> int:
    """A random seed fixed per test (derived from the test's id), so a failure reproduces exactly."""
    return zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def rng(seed):
    """A CUDA random generator seeded with ``seed``: fresh inputs in every test, the same on every run."""
    import torch

    return torch.Generator(device="cuda").manual_seed(seed)
