"""How the `enginecache` console script ends: what the command made and imported is left out of the
interpreter's last garbage collection.

At exit the interpreter walks every object still alive, more than once as it clears the modules:
SQLAlchemy's, pydantic's and onnx's classes and caches, a share of a one-shot `build` or
`model add` after its work is done (bench/bench_cli.py times it). `gc.freeze` moves them all to the permanent
generation, which those collections skip. Everything else about exiting still happens, in its order:
atexit handlers (temporary directories' finalizers among them), flushing, deallocating what reference
counts free; only a reference cycle's `__del__` does not run, and the operating system closes what it
held. Not where a nanobind extension is loaded (LIEF, with ModelOpt): nanobind reports every object of
its own still alive at its teardown as a leak, on stderr.

Only the console script (`cli.entry.main`) does this, not `cli.app.main`, which tests run in-process.
"""

from __future__ import annotations

import gc
import sys


def leave_objects_out_of_the_exit_collection() -> None:
    """`gc.freeze()`, unless a nanobind extension is loaded (`nanobind_loaded`)."""
    if not nanobind_loaded():
        gc.freeze()


def nanobind_loaded() -> bool:
    """Whether an extension module built with nanobind is loaded: its classes' metaclass and its
    functions' type are nanobind's own (`nb_meta`, `nb_func`, of module "nanobind")."""
    for module in list(sys.modules.values()):
        if not str(getattr(module, "__file__", None) or "").endswith((".so", ".pyd")):
            continue
        if any(type(value).__module__ == "nanobind" for value in list(vars(module).values())):
            return True
    return False
