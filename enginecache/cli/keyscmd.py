"""`enginecache keys generate | list`: the Ed25519 keys a build pool signs engines with and the keys
a host trusts (docs/security.md, "Signed engines")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, add_group, emit


def keys_generate(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="Where to write NAME.key and NAME.pub.")],
    name: Annotated[str | None, typer.Option(help="The files' name (default: pool).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a new Ed25519 key pair: DIR/NAME.key (private, mode 600) and DIR/NAME.pub; nothing is overwritten."""
    from enginecache.service.engines.signatures import generate_keys
    from enginecache.service.readmodels.display import printable

    data = generate_keys(folder, name or "pool")
    text = "\n".join(
        printable(line)
        for line in (
            f"key {data['key_id']}",
            f"private key: {data['private_key']} (the build pool's: keep it on its workers only)",
            f"public key:  {data['public_key']} (give it to every host that loads engines)",
            f"workers:     {data['signing_setting']}",
            f"hosts:       {data['trust_setting']}",
        )
    )
    emit(data, as_json, text)


def _key_lines(data: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    signing = data["signing_key"]
    lines = [f"signs with: {signing['key_id']} ({signing['file']})" if signing else "signs with: nothing"]
    if data["trusted_keys"]:
        lines += [f"trusts:     {k['key_id']} ({k['file']})" for k in data["trusted_keys"]]
    else:
        lines.append("trusts:     no key set: engines' signatures are not checked here")
    return "\n".join(printable(line) for line in lines)


def keys_list(as_json: JsonOption = False) -> None:
    """The key this process signs with (ENGINECACHE_SIGNING_KEY) and the keys it trusts (ENGINECACHE_TRUSTED_KEYS)."""
    from enginecache.service.engines.signatures import key_status

    data = key_status()
    emit(data, as_json, _key_lines(data))


def register(app: typer.Typer) -> None:
    """Add the `keys` group to the CLI."""
    add_group(
        app,
        "keys",
        "Ed25519 keys that sign engines (a build pool's) and that hosts trust.",
        {"generate": keys_generate, "list": keys_list},
    )
