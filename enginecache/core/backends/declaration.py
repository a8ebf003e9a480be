"""What a backend declares before anything of it is imported: where its Backend object is, and the
names of its library that modules outside its package need.

A backend's package defines one `BackendDeclaration` per backend in its `__init__` (which imports
nothing else of the backend), and `core.backends.registry` lists where each declaration is: the one
line a backend adds. The host fingerprint (which library versions it reports), `import_backend`'s
install hint, the accuracy check's "the library refused this", a worker's zygote preload and
its capabilities all ask the registry for these, so none of them names a backend's library.
"""

from __future__ import annotations

from enginecache.core.valuetype import Frozen


class BackendDeclaration(Frozen):
    """A backend's declaration (a `core.valuetype` value: the serving hit's fingerprint reads it).

    - `backend`: "module:attribute" of its Backend object, imported on first `get_backend`.
    - `library`: the import name of its library ("tensorrt_rtx"); the key of its version in
      `HostFingerprint.packages` and `Backend.module`.
    - `distributions`: the distribution names that install the library, the first installed one
      giving its version ("tensorrt-rtx", "tensorrt_rtx_cu13", ...).
    - `install_hint`: what `import_backend` says where the library is missing.
    - `error_modules`: further top-level modules whose exceptions mean "the library refused this"
      (its bindings, the CUDA Python packages its sessions use), beside `library`.
    - `warm`: whether a worker's zygote imports the library before its first job.
    """

    backend: str
    library: str
    distributions: tuple[str, ...]
    install_hint: str
    error_modules: tuple[str, ...] = ()
    warm: bool = False
