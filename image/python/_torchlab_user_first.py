"""The user's own packages before the image's, in the PyPI path's venv: add_site_dirs() runs at every interpreter
start, from _torchlab_user_first.pth in the venv's site-packages.

The image's packages live in image-packages, beside the venv's site-packages rather than in it: pip refuses a
--user install over a package in a venv's site-packages ("will lack sys.path precedence"), and installs one over
a package elsewhere into the user site. So that the user's copy is the one imported, the user site
(PYTHONUSERBASE, /workspace/.local in the user's sessions) goes on sys.path before image-packages; `pip
uninstall` of it brings the image's version back. Where site.py would add no user site (python -s or -I, a
setuid process, PYTHONNOUSERSITE), none is added here either.
"""

import os
import site
import sys

IMAGE_PACKAGES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "image-packages")


def add_site_dirs():
    user_site = site.getusersitepackages()
    if site.check_enableusersite() and os.path.isdir(user_site) and user_site not in sys.path:
        site.addsitedir(user_site)
    # Moved to the end at each call rather than left where it is: pip's isolated builds tell the system's site
    # dirs from the build's by what processing site-packages' .pth files appends, and must see it to leave it out.
    while IMAGE_PACKAGES in sys.path:
        sys.path.remove(IMAGE_PACKAGES)
    site.addsitedir(IMAGE_PACKAGES, set())
