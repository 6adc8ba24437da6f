"""What every KFP component shares: the project image, and no per-step `pip install kfp`.

Components are thin lightweight `@dsl.component`s: imports inside the function, then one call into the
stage's plain-Python `run` code. The image is the project image (it has harnessrl + kfp installed), so
`install_kfp_package=False` everywhere — locally that also cuts a component's start to ~0.1 s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kfp import dsl
from kfp.dsl.python_component import PythonComponent

from harnessrl.cluster import IMAGE  # env HARNESSRL_IMAGE; defined without kfp for library code

__all__ = ["IMAGE", "component"]


def component(func: Callable[..., Any]) -> PythonComponent:
    """`@dsl.component` on the project image, without a per-step `pip install kfp`."""
    built = dsl.component(func, base_image=IMAGE, install_kfp_package=False)
    assert isinstance(built, PythonComponent)  # given a function (not None), dsl.component builds it
    return built
