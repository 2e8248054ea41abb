"""Providers on the admin's side: NATS identities in the nats-server config, join files out.

nats-server cannot ``include`` a file inside the ``users`` array, so the providers live in a
marked section of that array in the config itself (``deploy/nats/nats-auth.conf``), which
``add`` and ``remove`` rewrite whole: one comment line per provider (name, public key, date)
and its user entry, with the permissions of ``swarm_contracts.providers.provider_permissions``
as they are now. Everything outside the markers is left byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from swarm_contracts.names import check_name
from swarm_contracts.providers import Permissions, ProviderCredentials, provider_permissions
from swarm_contracts.subjects import Subjects

BEGIN = "# BEGIN swarm providers"
END = "# END swarm providers"
_ENTRY = re.compile(r"^\s*# provider (\S+) (U[A-Z2-7]{55}) added (\S+)\s*$")
_INDENT = "    "


class ProviderError(Exception):
    """Something an admin must fix (unknown provider, config without the section, ...)."""


@dataclass(frozen=True)
class Provider:
    name: str
    public_key: str
    added: str


def _section(text: str, conf: Path) -> tuple[int, int]:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ProviderError(
            f"{conf} has no providers section: add the lines '{BEGIN}' and '{END}' inside "
            "authorization { users = [ ... ] } (see deploy/nats/nats-auth.conf)"
        )
    return text.index("\n", start) + 1, text.rindex("\n", 0, end) + 1


def list_providers(conf: Path) -> list[Provider]:
    text = conf.read_text()
    start, end = _section(text, conf)
    found = (_ENTRY.match(line) for line in text[start:end].splitlines())
    return [Provider(m[1], m[2], m[3]) for m in found if m]


def _user_entry(p: Provider, perms: Permissions) -> str:
    def strings(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return (
        f"{_INDENT}# provider {p.name} {p.public_key} added {p.added}\n"
        f'{_INDENT}{{ nkey: "{p.public_key}", permissions: {{\n'
        f"{_INDENT}    publish: {{ allow: {strings(perms.publish_allow)},\n"
        f"{_INDENT}               deny: {strings(perms.publish_deny)} }}\n"
        f"{_INDENT}    subscribe: {{ allow: {strings(perms.subscribe_allow)},\n"
        f"{_INDENT}                 deny: {strings(perms.subscribe_deny)} }}\n"
        + (f"{_INDENT}    allow_responses: true\n" if perms.allow_responses else "")
        + f"{_INDENT}}} }}\n"
    )


def write_providers(conf: Path, providers: list[Provider], subjects: Subjects) -> None:
    """Rewrite the config's providers section (atomically: nats-server may reload any time)."""
    text = conf.read_text()
    start, end = _section(text, conf)
    body = "".join(_user_entry(p, provider_permissions(p.name, subjects)) for p in providers)
    tmp = conf.with_name(conf.name + ".tmp")
    tmp.write_text(text[:start] + body + text[end:])
    os.chmod(tmp, conf.stat().st_mode & 0o777)
    tmp.replace(conf)


def _write_secret(path: Path, data: str) -> None:
    """Create ``path`` readable by its owner only; never overwrite (an old identity would be
    lost while the config still names it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)


def add_provider(
    conf: Path, creds_dir: Path, name: str, nats_url: str | None, subjects: Subjects
) -> tuple[Path, ProviderCredentials]:
    """A new nkey user for ``name`` in ``conf`` and its join file in ``creds_dir``."""
    check_name(name, "provider name")
    providers = list_providers(conf)
    if any(p.name == name for p in providers):
        raise ProviderError(f"provider {name!r} exists; `swarm providers remove {name}` first")
    creds_path = creds_dir / f"{name}.creds.json"
    if creds_path.exists():
        raise ProviderError(f"{creds_path} exists; move it away first")
    try:
        import nkeys  # the `providers` extra: only this admin command needs it
    except ImportError as exc:
        hint = "swarm providers add needs: pip install 'swarm-sdk[providers]'"
        raise ProviderError(hint) from exc
    user = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    credentials = ProviderCredentials(
        provider=name,
        nkey_seed=user.seed.decode(),
        public_key=user.public_key.decode(),
        nats_url=nats_url,
    )
    _write_secret(creds_path, credentials.model_dump_json(indent=2) + "\n")
    added = added_at(credentials.created_at)
    try:
        write_providers(conf, [*providers, Provider(name, credentials.public_key, added)], subjects)
    except BaseException:
        creds_path.unlink()  # no join file for an identity the server does not know
        raise
    return creds_path, credentials


def remove_provider(conf: Path, creds_dir: Path, name: str, subjects: Subjects) -> bool:
    """Take ``name`` out of ``conf`` (its join file too, if it is in ``creds_dir``); whether
    there was a join file to delete."""
    providers = list_providers(conf)
    if not any(p.name == name for p in providers):
        raise ProviderError(f"no provider {name!r} in {conf}")
    write_providers(conf, [p for p in providers if p.name != name], subjects)
    creds_path = creds_dir / f"{name}.creds.json"
    if creds_path.exists():
        creds_path.unlink()
        return True
    return False


def reload_nats(pid_file: Path | None) -> str:
    """Tell nats-server to read its config again (SIGHUP, as ``nats-server --signal reload``
    sends); a removed provider's connections are closed by the reload. Says what happened, or
    what to run when no pid file is known."""
    if pid_file is None:
        return (
            "now reload nats-server: `nats-server --signal reload` on its host (or "
            "`kill -HUP <pid>`; `docker compose kill -s HUP nats` in the compose stack)"
        )
    pid = int(pid_file.read_text().strip())
    os.kill(pid, signal.SIGHUP)
    return f"nats-server (pid {pid}) reloads its config"


def added_at(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
