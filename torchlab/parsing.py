"""Argument types that check a flag's text, and the parser whose errors are one line: the bottom layer, which
every command's flags use (train.py's in config.py, the tools' own)."""

import argparse
import math

from torchlab import io


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage block), like every other input error here."""

    def error(self, message):
        io.exit_with_error(self.prog, f"{message} (see --help)")


def number(kind, minimum, *, above=False, below=None, at_most=None):
    """An argparse type: a finite `kind` (int or float) >= minimum (> when `above`), < `below` and
    <= `at_most` when given."""
    bounds = [f"{'>' if above else '>='} {minimum}"] + ([f"< {below}"] if below is not None else [])
    bounds += [f"<= {at_most}"] if at_most is not None else []
    expected = f"{'an integer' if kind is int else 'a number'} {' and '.join(bounds)}"

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if (
            not (math.isfinite(value) and (value > minimum if above else value >= minimum))
            or (below is not None and value >= below)
            or (at_most is not None and value > at_most)
        ):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.expected = expected  # what a --config null is told to give instead
    return parse


def one_of(choices):
    """An argparse type: one of `choices`, refused in the same words on every Python (argparse's own "invalid
    choice" message changed its quoting in 3.12)."""
    expected = f"one of {', '.join(choices)}"

    def parse(text):
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return text

    parse.expected = expected
    return parse


positive_int = number(int, 0, above=True)
non_negative_int = number(int, 0)
positive_float = number(float, 0, above=True)
non_negative_float = number(float, 0)
fraction = number(float, 0, below=1)
# Bounds where larger values only overflow: float32 steps, and the seeds of every RNG (numpy's are 32-bit).
step_size = number(float, 0, above=True, at_most=1000)
decay = number(float, 0, at_most=1000)
seed = number(int, 0, below=2**32)
image_size = number(int, 0, above=True, at_most=4096)
