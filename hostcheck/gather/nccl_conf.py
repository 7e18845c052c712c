"""NCCL's own configuration, read where NCCL reads it, under the one host root.

NCCL takes a variable from the process environment first; only variables the environment leaves unset are taken
from its configuration files: the file ``NCCL_CONF_FILE`` names (since 2.23), else ``~/.nccl.conf`` of the user
running the job, then ``/etc/nccl.conf``. The first file that sets a variable wins, because NCCL sets each one
with ``setenv(name, value, 0)``, which never overwrites (src/misc/param.cc ``initEnvFunc`` and ``setEnvFile``;
src/os/linux.cc ``ncclOsSetEnv``). A file line is ``NAME=value``: a line starting with ``#`` is skipped, a line
without ``=`` is skipped, the name is everything before the first ``=`` and the value everything after it, spaces
and quotes included (the file is no shell), each cut at 1023 characters.

The training jobs' environment here is the training environment file (``--env-file``, else the
``gpunode_tuning`` fact's ``env_file``, else /etc/gpunode/training.env) and, on the node itself (host root
``/``), the environment hostcheck runs in (a Slurm prolog sets ``SLURM_JOB_USER``: that user's ``~/.nccl.conf``
is read too). Under another host root nothing is taken from the machine hostcheck runs on: paths and homes are
looked up under that root. Every file goes through the one bounded reader (hostcheck.infile): a FIFO, a device, a
link loop, a huge or binary file is reported as not read, never waited on. Reading only: nothing here judges.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hostcheck import infile
from hostcheck.gather.base import HOST_ROOT, under
from hostcheck.gather.tuning import env_file_entries

#: NCCL's configuration files are a few lines; past this a file is not read (NCCL itself would read it all).
MAX_BYTES = 1 << 16
#: NCCL copies names and values into 1024-byte buffers (setEnvFile): what is longer is cut there.
MAX_VALUE = 1023
#: NCCL_* settings kept per source at most.
MAX_SETTINGS = 256
#: Users whose ~/.nccl.conf is read at most.
MAX_USERS = 16
ENV_FILE, ENVIRONMENT, CONF_FILE, USER_CONF, SYSTEM_CONF = (
    "training environment file",
    "environment",
    "NCCL_CONF_FILE",
    "~/.nccl.conf",
    "/etc/nccl.conf",
)
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    #: The line it is on (1-based); 0 for the process environment.
    line: int = 0


@dataclass(frozen=True)
class Source:
    """One place NCCL takes variables from, in NCCL's order, and what it sets."""

    kind: str  # ENV_FILE, ENVIRONMENT, CONF_FILE, USER_CONF, SYSTEM_CONF
    #: The file as the node names it ("/etc/nccl.conf", "/home/alice/.nccl.conf"); "" for the environment.
    path: str = ""
    settings: tuple[Setting, ...] = ()
    #: Why the file was not read ("" when it was read, or when there is none).
    error: str = ""
    present: bool = False

    @property
    def shown(self) -> str:
        return self.path or "the environment hostcheck runs in"

    def where(self, s: Setting) -> str:
        return f"{self.path}:{s.line}" if self.path and s.line else self.shown


@dataclass(frozen=True)
class NcclConfig:
    sources: tuple[Source, ...] = ()
    #: What was not looked at, and why (a user without a home, ~/.nccl.conf while NCCL_CONF_FILE is set).
    notes: tuple[str, ...] = ()

    def settings(self, name: str) -> list[tuple[Setting, Source, bool]]:
        """Every place ``name`` is set, in NCCL's order, with whether NCCL uses it: the first source that sets it,
        where each user's ~/.nccl.conf is a path of its own (a job reads one of them, then /etc/nccl.conf)."""
        found = [(s, src) for src in self.sources for s in src.settings if s.name == name]
        ahead = [src for s, src in found if src.kind in (ENV_FILE, ENVIRONMENT, CONF_FILE)]
        users = [src for src in self.sources if src.kind == USER_CONF]
        setting_users = {id(src) for s, src in found if src.kind == USER_CONF}
        out = []
        for s, src in found:
            if src.kind in (ENV_FILE, ENVIRONMENT, CONF_FILE):
                used = src is ahead[0]
            elif src.kind == USER_CONF:
                used = not ahead
            else:  # /etc/nccl.conf: used unless something ahead sets it on every path
                used = not ahead and (not users or len(setting_users) < len(users))
            out.append((s, src, used))
        return out

    def effective(self) -> dict[str, str]:
        """name -> the value NCCL uses (the first path's, where users' files differ)."""
        out: dict[str, str] = {}
        for src in self.sources:
            for s in src.settings:
                out.setdefault(s.name, s.value)
        return out


# --- pure parsing ---------------------------------------------------------------------------------------


def parse_conf(text: str) -> tuple[Setting, ...]:
    """The NCCL_* lines of an NCCL configuration file as NCCL's setEnvFile reads them (see the module doc)."""
    out: dict[str, Setting] = {}
    for n, line in enumerate(text.split("\n"), 1):
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _eq, value = line.partition("=")
        name = name[:MAX_VALUE]
        if name.startswith("NCCL_") and (name in out or len(out) < MAX_SETTINGS):
            # The first line wins: setenv(..., 0) keeps the value the file set first.
            out.setdefault(name, Setting(name, value[:MAX_VALUE], n))
    return tuple(out.values())


def parse_env_lines(text: str) -> tuple[Setting, ...]:
    """The NCCL_* entries of an environment file (systemd's syntax, hostcheck.gather.tuning's reader) with the
    line each comes from (the last assignment wins, as systemd applies them)."""
    out: dict[str, Setting] = {}
    for n, line in enumerate(text.splitlines(), 1):
        entries, _problems = env_file_entries(line)
        for name, value in entries.items():
            if name.startswith("NCCL_") and (name in out or len(out) < MAX_SETTINGS):
                out[name] = Setting(name, value[:MAX_VALUE], n)
    return tuple(out.values())


def parse_passwd(text: str) -> dict[str, str]:
    """user -> home directory from an /etc/passwd text (``name:x:uid:gid:gecos:home:shell``)."""
    out: dict[str, str] = {}
    for line in text.splitlines()[:100000]:
        f = line.split(":")
        if len(f) >= 7 and _USER.fullmatch(f[0]) and f[5].startswith("/"):
            out.setdefault(f[0], f[5])
    return out


# --- reading --------------------------------------------------------------------------------------------


def _read(root: str, path: str, kind: str, parse: Any) -> Source:
    """``path`` (as the node names it) under ``root``, through the one bounded reader."""
    try:
        text = infile.read_text(under(root, path), MAX_BYTES)
    except infile.ReadError as exc:
        if exc.kind == infile.MISSING:
            return Source(kind, path)
        return Source(kind, path, error=exc.why, present=True)
    return Source(kind, path, parse(text), present=True)


def _homes(root: str, users: tuple[str, ...]) -> tuple[dict[str, str], str]:
    """Each user's home as the node's passwd database has it, and why none could be looked up."""
    if root == HOST_ROOT:
        import pwd  # the node's own database (NSS: LDAP and SSSD users too)

        out = {}
        for u in users:
            try:
                out[u] = pwd.getpwnam(u).pw_dir
            except (KeyError, OSError):
                continue
        return out, ""
    try:
        text = infile.read_text(under(root, "etc/passwd"), 1 << 24)
    except infile.ReadError as exc:
        return {}, f"/etc/passwd {exc.why}"
    known = parse_passwd(text)
    return {u: known[u] for u in users if u in known}, ""


def _own_user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError, ImportError):
        return ""


def read_nccl_config(
    root: str = HOST_ROOT,
    env_file: str = "",
    environ: Mapping[str, str] | None = None,
    users: tuple[str, ...] = (),
) -> NcclConfig:
    """Every source of NCCL's variables in NCCL's order. ``env_file``: the training environment file as the node
    names it ("" for none; a path given on the command line is read as given); ``environ``: the process
    environment (None under another host root: not read); ``users``: whose ~/.nccl.conf to read (the site's
    [fabric] nccl_users; on the node itself also the user hostcheck runs as and a Slurm prolog's job user)."""
    sources: list[Source] = []
    notes: list[str] = []
    if env_file:
        sources.append(_read(HOST_ROOT, env_file, ENV_FILE, parse_env_lines))
    if environ is not None:
        own = tuple(
            Setting(k, str(v)[:MAX_VALUE]) for k, v in sorted(environ.items()) if k.startswith("NCCL_")
        )
        sources.append(Source(ENVIRONMENT, "", own[:MAX_SETTINGS], present=True))
        users = (*users, *(u for u in (environ.get("SLURM_JOB_USER", ""), _own_user()) if u))
    conf_file = ""
    for src in sources:
        for s in src.settings:
            if s.name == "NCCL_CONF_FILE" and s.value:
                conf_file = conf_file or s.value
    if conf_file:
        if conf_file.startswith("/"):
            sources.append(_read(root, conf_file, CONF_FILE, parse_conf))
        else:
            notes.append(f"NCCL_CONF_FILE={conf_file[:80]} is not an absolute path: not read")
        notes.append("~/.nccl.conf not read: NCCL reads it only when NCCL_CONF_FILE is not set")
    else:
        wanted = tuple(dict.fromkeys(u for u in users if _USER.fullmatch(u)))[:MAX_USERS]
        homes, why = _homes(root, wanted)
        if why:
            notes.append(f"~/.nccl.conf not read: {why}")
        for u in wanted:
            if u not in homes:
                notes.append(f"~{u}/.nccl.conf not read: no such user in /etc/passwd")
        for home in dict.fromkeys(homes.values()):
            sources.append(_read(root, os.path.join(home, ".nccl.conf"), USER_CONF, parse_conf))
    sources.append(_read(root, "/etc/nccl.conf", SYSTEM_CONF, parse_conf))
    return NcclConfig(tuple(sources), tuple(notes))
