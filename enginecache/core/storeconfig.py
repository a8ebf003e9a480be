"""Which blob store a process uses, from its environment (docs/store.md).

`ENGINECACHE_STORE` unset, empty or `local`: the local folder only (the home's `objects/`, as
always). `ENGINECACHE_STORE=s3://bucket/prefix`: the local folder is the verified cache, and every
blob published also goes to that bucket under `<prefix>/objects/sha256/<2 hex>/<sha256>` before the
publish returns; a blob missing locally is fetched from it (`ArtifactStore.fetch_blob`).

The connection comes from the usual AWS variables, read from the same environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), AWS_REGION (AWS_DEFAULT_REGION), AWS_ENDPOINT_URL for an
S3-compatible server (an `http://` endpoint is allowed: it is what a local server speaks); without
keys, obstore's own chain (web identity, then the instance's role from the cloud's metadata address).
`ENGINECACHE_STORE_CREDENTIALS=env` keeps a host off that chain: the keys must be in the environment,
and without them the store is refused before any request (a host outside a cloud never probes the
metadata address). The transfer settings are ours:

    ENGINECACHE_STORE_MULTIPART_MB   blobs larger than this go up as a multipart upload (default 64)
    ENGINECACHE_STORE_CHUNK_MB       the part size of a multipart upload (default 16, at least 5)
    ENGINECACHE_STORE_CONCURRENCY    parts in flight at once (default 8)
    ENGINECACHE_STORE_RETRY_SECONDS  how long one request is retried before StoreError (default:
                                     obstore's own, 180 s)

Parsing is string work only: nothing here imports obstore (`core.store` opens the S3 backend when,
and only when, one is configured). A value this version cannot use is StoreError: the store is
unusable on this host (a queued job's attempt is retried, perhaps on a worker configured right).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from enginecache.core.storeenv import LOCAL_VALUES, STORE_ENV
from enginecache.errors import StoreError

if TYPE_CHECKING:
    from collections.abc import Mapping

MULTIPART_ENV = "ENGINECACHE_STORE_MULTIPART_MB"
CHUNK_ENV = "ENGINECACHE_STORE_CHUNK_MB"
CONCURRENCY_ENV = "ENGINECACHE_STORE_CONCURRENCY"
RETRY_ENV = "ENGINECACHE_STORE_RETRY_SECONDS"
CREDENTIALS_ENV = "ENGINECACHE_STORE_CREDENTIALS"  # "env": the environment's keys only; unset: the chain
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")  # obstore's order of precedence

MIB = 1024 * 1024
MIN_PART_BYTES = 5 * MIB  # S3's smallest part (all but the last)


class S3Settings(NamedTuple):
    """An S3-compatible remote: the bucket, the prefix keys go under, and how blobs travel."""

    bucket: str
    prefix: str = ""
    multipart_threshold: int = 64 * MIB
    chunk_bytes: int = 16 * MIB
    max_concurrency: int = 8
    retry_seconds: float | None = None  # None: obstore's default
    endpoint: str | None = None  # None: AWS itself (from the region)
    region: str | None = None  # None: obstore's default (us-east-1)
    # The keys, where the environment names them (else obstore's own chain: web identity, IMDS).
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def __repr__(self) -> str:  # never the keys
        return f"S3Settings({self.url!r}, endpoint={self.endpoint!r}, region={self.region!r})"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def allow_http(self) -> bool:
        return self.endpoint is not None and self.endpoint.lower().startswith("http://")


def s3_settings(env: Mapping[str, str] | None = None) -> S3Settings | None:
    """The configured S3 remote, None for the local folder only; StoreError for a value this
    version cannot use."""
    env = os.environ if env is None else env
    value = env.get(STORE_ENV, "").strip()
    if value in LOCAL_VALUES:
        return None
    if not value.startswith("s3://"):
        raise StoreError(f"{STORE_ENV}={value!r} names no store this version knows: use `local` or s3://bucket/prefix")
    bucket, _, prefix = value[len("s3://") :].partition("/")
    if not bucket:
        raise StoreError(f"{STORE_ENV}={value!r} names no bucket: use s3://bucket/prefix")
    chunk = _mib(env, CHUNK_ENV, 16)
    if chunk < MIN_PART_BYTES:
        raise StoreError(f"{CHUNK_ENV} must be at least 5 (S3's smallest part), got {env[CHUNK_ENV]!r}")
    concurrency = _number(env, CONCURRENCY_ENV)
    credentials = env.get(CREDENTIALS_ENV, "").strip().lower()
    if credentials not in ("", "chain", "env"):
        raise StoreError(f"{CREDENTIALS_ENV}={credentials!r}: use `env` (the environment's keys only) or `chain`")
    if credentials == "env" and not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
        raise StoreError(
            f"{CREDENTIALS_ENV}=env but AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not both set: "
            f"no request was made to {value} (the instance metadata address is not asked)"
        )
    return S3Settings(
        bucket=bucket,
        prefix=prefix.strip("/"),
        multipart_threshold=_mib(env, MULTIPART_ENV, 64),
        chunk_bytes=chunk,
        max_concurrency=8 if concurrency is None else max(1, int(concurrency)),
        retry_seconds=_number(env, RETRY_ENV),
        endpoint=next((env[name] for name in ENDPOINT_ENVS if env.get(name)), None),
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        session_token=env.get("AWS_SESSION_TOKEN") or None,
    )


def _mib(env: Mapping[str, str], name: str, default: int) -> int:
    number = _number(env, name)
    return int((default if number is None else number) * MIB)


def _number(env: Mapping[str, str], name: str) -> float | None:
    """The number a variable holds, None where it is unset or empty."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        number = float(raw)
    except ValueError as err:
        raise StoreError(f"{name}={raw!r} is not a number") from err
    if not number >= 0:  # negative, or NaN
        raise StoreError(f"{name}={raw!r} must be a number >= 0")
    return number
