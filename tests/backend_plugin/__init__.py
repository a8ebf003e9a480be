"""A backend package from outside enginecache, as a third party would write one: this declaration
and `backend.py`. Registered with its one line, `register_backend("toy", "tests.backend_plugin:TOY")`
(tests/test_backend_plugin.py); nothing else in enginecache learns its name.

Its library is NumPy (installed wherever enginecache is), so the host fingerprint, a worker's
capabilities and the compatibility rule have a version of it to report and match.
"""

from enginecache.core.backends.declaration import BackendDeclaration

TOY = BackendDeclaration(
    backend="tests.backend_plugin.backend:TOY_BACKEND",
    library="numpy",
    distributions=("numpy",),
    install_hint="the toy backend needs NumPy: pip install numpy",
)
