"""torchlab's training code: flat modules that import each other as siblings (`import data`).

`python train.py` (or the symlink to it) puts this folder on sys.path by itself. `python -m train.train`
from the repository root imports this package first: putting the folder on sys.path here makes the
sibling imports work in that case too.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
