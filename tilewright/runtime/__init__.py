"""Targets, device detection, kernel module loading and launch helpers.

Imports nothing from compiler/, autotune/ or templates/.
"""

from tilewright.runtime.targets import TARGETS, Target, detect_target, get_target

__all__ = ["TARGETS", "Target", "detect_target", "get_target"]
