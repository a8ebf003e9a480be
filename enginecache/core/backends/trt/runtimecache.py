"""A TensorRT-RTX runtime cache handed to the runtime, and written back out.

Written against TensorRT-RTX's documented Python API (tensorrt_rtx 1.7: `ICudaEngine.create_runtime_config`,
`IRuntimeConfig.create_runtime_cache` / `set_runtime_cache` / `get_runtime_cache`,
`IRuntimeCache.deserialize` / `serialize`, `ICudaEngine.create_execution_context(runtime_config)`).
It needs an RTX GPU and a current CUDA context: `IRuntimeCache.deserialize` compares the blob with the
environment it runs in, and refuses (returns False, leaving the cache empty) a blob written elsewhere
or corrupt. A refused cache is not an error: the engine compiles its kernels as if it had none.

Which cache file to hand over is decided before this module, by `core.runtimecache.select`; this
module never chooses, it only hands over the file it is given.
"""

from __future__ import annotations

from typing import Any

from enginecache.errors import LoadFailedError


class RuntimeCacheHandOver:
    """The outcome of handing a cache file to TensorRT-RTX: the runtime config the execution context
    was created with, and whether the runtime accepted the cache's contents (`loaded`)."""

    __slots__ = ("config", "loaded", "path")

    def __init__(self, config: Any, loaded: bool, path: str | None) -> None:
        self.config = config
        self.loaded = loaded
        self.path = path


def supports_runtime_cache(engine: Any) -> bool:
    """Whether `engine` is a TensorRT-RTX engine with runtime configs (plain TensorRT has none)."""
    return callable(getattr(engine, "create_runtime_config", None))


def create_context(engine: Any, cache_path: str | None) -> tuple[Any, RuntimeCacheHandOver]:
    """An execution context of `engine` whose runtime config carries a runtime cache: the bytes of
    `cache_path` when given (deserialized; `loaded` False when the runtime refuses them), else an
    empty cache the first inference fills. LoadFailedError: the cache file cannot be read, or the
    runtime gives no config or cache."""
    config = engine.create_runtime_config()
    if config is None:
        raise LoadFailedError("TensorRT-RTX gave no runtime config for the engine")
    cache = config.create_runtime_cache()
    if cache is None:
        raise LoadFailedError("TensorRT-RTX gave no runtime cache for the engine")
    loaded = False
    if cache_path is not None:
        try:
            with open(cache_path, "rb") as file:
                blob = file.read()
        except OSError as err:
            raise LoadFailedError(f"runtime cache {cache_path} could not be read: {err}") from err
        loaded = bool(cache.deserialize(blob))
    if not config.set_runtime_cache(cache):
        raise LoadFailedError("TensorRT-RTX refused to attach a runtime cache to the runtime config")
    context = engine.create_execution_context(runtime_config=config)
    return context, RuntimeCacheHandOver(config, loaded, cache_path)


def serialized_cache(hand_over: RuntimeCacheHandOver) -> bytes:
    """The runtime cache's bytes as they stand now (after inferences), to write to a file and publish."""
    cache = hand_over.config.get_runtime_cache()
    if cache is None:
        raise LoadFailedError("the runtime config holds no runtime cache")
    memory = cache.serialize()
    if memory is None:
        raise LoadFailedError("TensorRT-RTX could not serialize the runtime cache")
    return bytes(memoryview(memory))
