"""Local facts the roles leave in /etc/ansible/facts.d/<role>.fact (JSON; docs/design.md)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from hostcheck.gather.base import ERROR, Unavailable, read_text

DEFAULT_FACTS_DIR = "/etc/ansible/facts.d"
ROLES = ("gpunode_tuning", "gpunode_driver", "gpunode_pytorch", "gpunode_cuda")


@dataclass(frozen=True)
class Facts:
    directory: str = DEFAULT_FACTS_DIR
    #: role -> parsed JSON object; a role without a fact file is absent.
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: role -> why its fact file could not be used.
    errors: dict[str, Unavailable] = field(default_factory=dict)

    def get(self, role: str, key: str, default: Any = None) -> Any:
        return self.roles.get(role, {}).get(key, default)

    def has(self, role: str, key: str) -> bool:
        return key in self.roles.get(role, {})


def gather_facts(directory: str = DEFAULT_FACTS_DIR) -> Facts:
    roles: dict[str, dict[str, Any]] = {}
    errors: dict[str, Unavailable] = {}
    for role in ROLES:
        path = os.path.join(directory, f"{role}.fact")
        if not os.path.exists(path):
            continue
        text = read_text(path)
        if isinstance(text, Unavailable):
            errors[role] = text
            continue
        try:
            data = json.loads(text)
        except ValueError as exc:
            errors[role] = Unavailable(ERROR, f"{path} is not JSON: {exc}")
            continue
        if not isinstance(data, dict):
            errors[role] = Unavailable(ERROR, f"{path} is not a JSON object")
            continue
        roles[role] = data
    return Facts(directory=directory, roles=roles, errors=errors)
