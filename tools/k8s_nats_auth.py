"""Copy deploy/nats/nats-auth.conf's `authorization` block (the per-service NATS users) into
deploy/k8s/nats/authorization.conf, which the Kubernetes NATS cluster includes: kustomize
cannot read files outside deploy/k8s. tests/deploy/test_k8s.py fails while the two differ.

    python tools/k8s_nats_auth.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "deploy" / "nats" / "nats-auth.conf"
TARGET = ROOT / "deploy" / "k8s" / "nats" / "authorization.conf"
HEADER = """\
# The per-service NATS users of deploy/nats/nats-auth.conf (its `authorization` block, copied
# by tools/k8s_nats_auth.py: tests/deploy/test_k8s.py fails when the two differ), included by
# nats.conf. The passwords are the nats-server container's environment
# (<SERVICE>_NATS_PASSWORD, from the swarm-nats-passwords Secret).
"""


def authorization_block(conf: str) -> str:
    start = conf.index("authorization {")
    depth = 0
    for i in range(start, len(conf)):
        depth += {"{": 1, "}": -1}.get(conf[i], 0)
        if depth == 0 and conf[i] == "}":
            return conf[start : i + 1]
    raise ValueError("unbalanced authorization block")


def main() -> None:
    TARGET.write_text(HEADER + authorization_block(SOURCE.read_text()) + "\n")
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
