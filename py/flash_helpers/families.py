"""Every kernel family's configuration type, by the family's name: how the generator and the Python
API find the class of a family named by the compiled module. A new family adds its class here."""

from __future__ import annotations

from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

__all__ = ["FAMILIES"]

FAMILIES = {cls.family: cls for cls in (FlashForwardKernelConfig, HopperForwardKernelConfig)}
