"""Where the SDK and CLI find the gateway: arguments, then environment, then a config file.

``~/.config/swarm/config.toml`` (or ``$XDG_CONFIG_HOME/swarm/config.toml``) may hold
``gateway_url`` and ``api_key``; ``SWARM_GATEWAY_URL`` / ``SWARM_API_KEY`` win over it, and an
explicit argument wins over both.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "swarm" / "config.toml"


@dataclass(frozen=True)
class Connection:
    gateway_url: str
    api_key: str | None


def load_file(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    return {k: str(v) for k, v in data.items() if k in ("gateway_url", "api_key")}


def resolve(gateway_url: str | None = None, api_key: str | None = None) -> Connection:
    file = load_file()
    url = gateway_url or os.environ.get("SWARM_GATEWAY_URL") or file.get("gateway_url")
    key = api_key if api_key is not None else os.environ.get("SWARM_API_KEY") or file.get("api_key")
    return Connection((url or DEFAULT_GATEWAY_URL).rstrip("/"), key or None)
