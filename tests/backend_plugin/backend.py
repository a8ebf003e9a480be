"""The toy backend: ONNX Runtime's CPU engines under its own name, label and library declaration
(its engines are keyed by the NumPy version, the library it declares)."""

from __future__ import annotations

from enginecache.core.backends.loadtypes import LoadSpec, PhaseTimer
from enginecache.core.backends.ort.backend import OnnxRuntimeBackend
from enginecache.core.distributions import first_version
from tests.backend_plugin import TOY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from enginecache.core.backends.base import EngineSession


class ToyBackend(OnnxRuntimeBackend):
    name = "toy"
    label = "Toy"
    declaration = TOY
    module = TOY.library

    def version(self) -> str:
        return first_version(TOY.distributions) or "unknown"

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        session = super().load(engine, spec, timer)
        session.backend = self.name
        return session

    def load_file(self, path: str, spec: LoadSpec, timer: PhaseTimer | None = None) -> EngineSession:
        session = super().load_file(path, spec, timer)
        session.backend = self.name
        return session


TOY_BACKEND = ToyBackend()
