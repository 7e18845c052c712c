"""The reaper: every child hostcheck started ends with hostcheck, even when hostcheck is SIGKILLed.

SIGKILL (the OOM killer, a scheduler's time limit, ``kill -9``) cannot be caught, so hostcheck cannot clean up
after it. The kernel's parent-death signal (PR_SET_PDEATHSIG) is no answer alone: it fires when the *thread*
that forked ends (hostcheck starts children from worker threads that end long before the child should), and it
reaches only the direct child, not what that child started in a session of its own (torchrun's workers) or
double-forked. So one small process per hostcheck run watches instead: hostcheck starts it, in a session of its
own so that a signal to hostcheck's group does not reach it, at its first child, and tells it over a pipe (its
standard input) which children run under which token. When that pipe reaches end of file, hostcheck is gone,
however it went: the reaper SIGKILLs the process group of every child still registered and every process that
carries a registered token (what left the groups), then exits. A clean run ends each launch first (``-``), so
at its exit there is nothing left to kill.

Lines on standard input: ``t TOKEN TICKS`` (a launch about to fork its first child: what carries TOKEN and
started at or after TICKS is the launch's, so a SIGKILL between the fork and the ``+`` line loses nothing),
``+ TOKEN PID TICKS`` (a child started: PID leads its own process group, TICKS is its
start time in clock ticks since boot), ``- TOKEN`` (that launch ended: its children are reaped and swept), and
``d HEX`` / ``u HEX`` (a private temporary folder, its path hex-encoded, to remove if hostcheck dies before it
does so itself / removed: forget it). ``hostcheck job``'s records folder is one.

Standard library only, and importing nothing of hostcheck: it runs as a script (``python -I -S reaper.py``),
which starts in milliseconds. hostcheck.child.launch imports the sweep from here: one way to find and kill
what carries a token.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

#: Set in every child's environment, one value per launch: what outlives the child's group is found by it.
TOKEN_VAR = "HOSTCHECK_RUN_TOKEN"


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """When a process started (clock ticks since boot, /proc/PID/stat field 22), or None if it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def kill_by_token(token: str, since: int, proc_root: str = "/proc") -> list[int]:
    """SIGKILL every process of ours started at or after ``since`` (clock ticks since boot) whose environment
    carries ``TOKEN_VAR=token``; their pids.

    Only those are read: reading a process's environment takes its memory lock, and one stuck in the kernel
    (D state: a hung mount, a wedged driver) holds that lock for good, so an unfiltered sweep can hang on any
    process of the node. /proc/PID/stat and the owner of /proc/PID need no such lock."""
    needle = f"{TOKEN_VAR}={token}".encode()
    uid = os.geteuid()
    killed = []
    try:
        pids = [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return killed
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            if os.stat(f"{proc_root}/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        started = start_ticks(pid, proc_root)
        if started is None or started < since:
            continue
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or another user's
            continue
        if needle in env.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def kill_group(pid: int, ticks: int) -> None:
    """SIGKILL the process group PID leads, unless PID now names another process (a reused id). While any
    member of a group lives, its id is not given to a new process, so a group without its leader is still ours."""
    now = start_ticks(pid)
    if now is not None and now != ticks:
        return
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def reap(live: dict[str, dict], folders: set[str]) -> None:
    """Kill what every registered launch left: its children's groups, then what carries its token (twice: a
    process forking as the first sweep ran is caught by the second); remove the registered folders before (so
    that they are gone by the time the children are) and after each round (what a dying child still wrote)."""
    if not live and not folders:  # a clean run ended every launch
        return
    remove(folders)
    for rounds in range(2):
        for token, launch in live.items():
            for pid, ticks in launch["children"]:
                kill_group(pid, ticks)
            kill_by_token(token, launch["since"])
        remove(folders)
        if rounds == 0:
            time.sleep(0.2)


def remove(folders: set[str]) -> None:
    """Remove the folders hostcheck left (after the kill: nothing writes into them any more). shutil's rmtree
    does not follow symbolic links out of the folder."""
    if not folders:
        return
    import shutil  # only here: a clean run never needs it, and the reaper starts faster without

    for folder in folders:
        if os.path.isabs(folder):
            shutil.rmtree(folder, ignore_errors=True)


def main(stream=None) -> int:
    """Read the launches from ``stream`` (standard input) until it ends, then kill what they left."""
    stream = sys.stdin.buffer if stream is None else stream
    live: dict[str, dict] = {}
    folders: set[str] = set()
    for raw in stream:
        words = raw.decode("ascii", "replace").split()
        if len(words) == 2 and words[0] in ("d", "u"):
            try:
                folder = bytes.fromhex(words[1]).decode("utf-8", "surrogateescape")
            except ValueError:
                continue
            (folders.add if words[0] == "d" else folders.discard)(folder)
        elif len(words) == 3 and words[0] == "t" and words[2].isascii() and words[2].isdigit():
            launch = live.setdefault(words[1], {"since": int(words[2]), "children": []})
            launch["since"] = min(launch["since"], int(words[2]))
        elif len(words) == 4 and words[0] == "+" and words[2].isdigit() and words[3].isdigit():
            pid, ticks = int(words[2]), int(words[3])
            launch = live.setdefault(words[1], {"since": ticks, "children": []})
            launch["since"] = min(launch["since"], ticks)
            launch["children"].append((pid, ticks))
        elif len(words) == 2 and words[0] == "-":
            live.pop(words[1], None)
    reap(live, folders)
    return 0


if __name__ == "__main__":
    # In a session of its own no terminal signals it; ignored all the same, as is a pipe that breaks.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_IGN)
    sys.exit(main())
