"""Argument types shared by the benchmarks' command lines."""
import argparse

__all__ = ["integers"]


def integers(text):
    """argparse type: "4,64,1024" as [4, 64, 1024]; anything else is an error naming the value."""
    try:
        return [int(value) for value in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give comma-separated integers") from None
