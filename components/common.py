"""What every KFP component shares: the project image, and no per-step `pip install kfp`.

Components are thin lightweight `@dsl.component`s: imports inside the function, then one call into the
stage's plain-Python `run` code. The image is the project image (it has harnessrl + kfp installed), so
`install_kfp_package=False` everywhere — locally that also cuts a component's start to ~0.1 s.
"""

from __future__ import annotations

import functools
import os

from kfp import dsl

IMAGE = os.environ.get("HARNESSRL_IMAGE", "ghcr.io/harnessrl/harnessrl:0.1.0")

component = functools.partial(dsl.component, base_image=IMAGE, install_kfp_package=False)
