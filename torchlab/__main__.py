"""`python -m torchlab COMMAND [FLAGS]`: the `torchlab` command (torchlab/cli.py)."""

from torchlab import cli

if __name__ == "__main__":
    cli.main()
