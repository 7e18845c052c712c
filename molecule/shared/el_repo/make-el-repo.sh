#!/bin/bash
# Builds the repos a synthetic Rocky node (scripts/harness el8/el9) installs from, and serves them on
# 127.0.0.1:8765 through a transient systemd unit, as molecule/nvidia_stack/files/make-test-repo.sh does for apt:
#   nvidia/rhel<N>/x86_64/                NVIDIA's CUDA repo layout: driver branches as dnf module streams
#                                         (modules.yaml), CUDA, cuDNN, NCCL; signed, key D42D0685.pub beside it
#   epel/<N>/Everything/x86_64/           EPEL: dkms
#   rocky/<N>/{BaseOS,AppStream,extras,<CRB|PowerTools>}/x86_64/os/   what the roles install from the OS
# Every package is a dummy generated from packages.json (packages.yml, converted by the caller), built with
# rpmbuild, signed with rpmsign by one of three throwaway keys (Rocky, EPEL, NVIDIA) and indexed with createrepo_c.
# Rocky's key is written where rocky.repo expects it (a real node has it from rocky-gpg-keys); EPEL's ships in the
# epel-release dummy; NVIDIA's is only on the server, for the role to import. The rows marked installed (a minimal
# install's packages) are installed at the end.
#   make-el-repo.sh PACKAGES_JSON
set -euo pipefail
data=$1
root=/srv/el-repo
major=$(rpm --eval '%{rhel}')
[[ "$major" =~ ^[89]$ ]] || { echo "not a synthetic EL node (rpm %{rhel} is '$major')" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The keys outlive a rebuild (a second run must not orphan the EPEL key that epel-release already installed).
export GNUPGHOME=/var/lib/gpunode-el-repo/gnupg
mkdir -p -m 0700 "$GNUPGHOME"
rm -rf "$root"
mkdir -p "$root"

for k in rocky epel nvidia; do
  gpg --batch --quiet --list-keys "$k@gpunode.test" >/dev/null 2>&1 ||
    gpg --batch --quiet --passphrase '' --quick-gen-key "gpunode test $k <$k@gpunode.test>" rsa2048 sign never
  gpg --armor --export "$k@gpunode.test" >"$work/$k.pub"
done

kernel=$(uname -r)
python3 - "$data" "$work" "$major" "$kernel" <<'PY'
"""Write one spec per dummy package (nvidia rows once per driver version) and modules.yaml for NVIDIA's repo."""
import json
import os
import re
import sys

data_path, work, major, kernel = sys.argv[1:]
data = json.load(open(data_path))
specs = os.path.join(work, "specs")
os.makedirs(specs)
crb = "CRB" if major == "9" else "PowerTools"
repo_dirs = {
    "nvidia": f"nvidia/rhel{major}/x86_64",
    "epel": f"epel/{major}/Everything/x86_64",
    "baseos": f"rocky/{major}/BaseOS/x86_64/os",
    "appstream": f"rocky/{major}/AppStream/x86_64/os",
    "extras": f"rocky/{major}/extras/x86_64/os",
    "crb": f"rocky/{major}/{crb}/x86_64/os",
}
key_of = {"nvidia": "nvidia", "epel": "epel"}
dist = f".el{major}"
kver, _, krest = kernel.partition("-")
macros = {
    "el_major": major,
    "kernel_uname": kernel,
    "kernel_version": kver,
    # An RPM release has no '-': the rest of `uname -r`, with '-' made '_'.
    "kernel_release": (krest or "0").replace("-", "_") + dist,
}


def expand(text):
    """Expand only the script's own macros and %{dist} (rpmbuild expands the rest); used for names and NEVRAs."""
    for key, value in {**macros, "dist": dist}.items():
        text = text.replace("%{" + key + "}", value)
    return text


def spec(row, version, n):
    name, arch = row["name"], row.get("arch", "x86_64")
    release = row.get("release", "1%{dist}")
    lines = [f"# source: {data['sources'].get(row.get('source', ''), row.get('source', ''))}",
             f"Name: {name}", f"Version: {version}", f"Release: {release}",
             f"Summary: gpunode test dummy of {name}", "License: MIT"]
    if row.get("epoch") is not None:
        lines.append(f"Epoch: {row['epoch']}")
    if arch == "noarch":
        lines.append("BuildArch: noarch")
    for tag in ("requires", "provides", "conflicts", "obsoletes"):
        lines += [f"{tag.capitalize()}: {v}" for v in row.get(tag, [])]
    lines += ["%description", f"Dummy of {name} for gpunode's molecule tests: stub payload only."]
    if row.get("pre"):
        lines += ["%pre", row["pre"].rstrip()]
    lines.append("%install")
    files = row.get("files", [])
    for i, f in enumerate(files):
        path = f["path"]
        if f.get("dir"):
            lines.append(f"mkdir -p '%{{buildroot}}{path}'")
            continue
        lines.append(f"mkdir -p %{{buildroot}}$(dirname '{path}')")
        if "copy" in f:
            lines.append(f"cp '{os.path.join(work, f['copy'])}' '%{{buildroot}}{path}'")
        else:
            # The content goes through rpmbuild's macro expansion (%{version} in stubs); a quoted here-doc keeps
            # the shell away from it.
            lines += [f"cat > '%{{buildroot}}{path}' <<'GPUNODE_EOF_{i}'", f["content"].rstrip("\n"), f"GPUNODE_EOF_{i}"]
        lines.append(f"chmod {f.get('mode', '0644')} '%{{buildroot}}{path}'")
    lines.append("%files")
    lines += [("%dir " if f.get("dir") else "") + f["path"] for f in files]
    with open(os.path.join(specs, f"{n:03d}-{name}.spec"), "w") as out:
        out.write("\n".join(lines) + "\n")
    with open(os.path.join(specs, f"{n:03d}-{name}.repo"), "w") as out:
        out.write(row.get("repo", "nvidia") + "\n")


n = 0
streams = {}  # stream -> (branch version, artifacts, kmod package)
for branch, versions in data["driver_branches"].items():
    for version in versions:
        for row in data["nvidia"]:
            n += 1
            spec({**row, "repo": "nvidia"}, version, n)
    newest = versions[-1]
    nevra = {}
    for row in data["nvidia"]:
        release = expand(row.get("release", "1%{dist}"))
        epoch = f"{row['epoch']}:" if row.get("epoch") is not None else ""
        nevra[row["name"]] = [f"{row['name']}-{epoch}{v}-{release}.{row.get('arch', 'x86_64')}" for v in versions]
    for flavour, kmod in (("dkms", "kmod-nvidia-latest-dkms"), ("open", "kmod-nvidia-open-dkms")):
        rows = [r for r in data["nvidia"] if r.get("module") in ("branch", flavour)]
        streams[f"{branch}-{flavour}"] = (newest, rows, nevra, kmod, branch)
# genmodules.py: latest-dkms and open-dkms follow the highest branch.
top = max(data["driver_branches"], key=int)
streams["latest-dkms"] = streams[f"{top}-dkms"]
streams["open-dkms"] = streams[f"{top}-open"]

for row in data["packages"]:
    n += 1
    spec(row, row["version"], n)

docs = []
for stream, (newest, rows, nevra, kmod, branch) in streams.items():
    branch_pkgs = sorted(r["name"] for r in rows if r["module"] == "branch")
    artifacts = sorted(a for r in rows for a in nevra[r["name"]])
    docs.append({
        "document": "modulemd", "version": 2,
        "data": {
            "name": "nvidia-driver", "stream": stream, "version": 20250101000000 + int(branch),
            "context": f"{int(branch):08x}", "arch": "x86_64",
            "summary": f"Nvidia driver for {stream} branch",
            "description": f"gpunode test module: driver {newest}.",
            "license": {"module": ["MIT"]},
            "artifacts": {"rpms": artifacts},
            "profiles": {
                "default": {"description": "Default installation", "rpms": branch_pkgs + [kmod]},
                "fm": {"description": "FabricManager installation",
                       "rpms": branch_pkgs + [kmod, "nvidia-fabric-manager", f"libnvidia-nscq-{branch}"]},
                "ks": {"description": "Installation via kickstart", "rpms": branch_pkgs + [kmod]},
                **({"src": {"description": "Source files for compiling open kernel modules",
                            "rpms": ["nvidia-kmod-source"]}} if stream.endswith("open") else {}),
            },
        },
    })
docs.append({"document": "modulemd-defaults", "version": 1,
             "data": {"module": "nvidia-driver", "stream": "latest-dkms",
                      "profiles": {s: ["default"] for s in streams}}})
# JSON is YAML: one document per '---'.
with open(os.path.join(work, "modules.yaml"), "w") as out:
    for d in docs:
        out.write("---\n" + json.dumps(d, indent=1) + "\n...\n")
with open(os.path.join(work, "repo_dirs"), "w") as out:
    for repo, path in repo_dirs.items():
        out.write(f"{repo} {path} {key_of.get(repo, 'rocky')}\n")
with open(os.path.join(work, "base"), "w") as out:
    out.write(" ".join(sorted({r["name"] for r in data["packages"] if r.get("installed")})) + "\n")
with open(os.path.join(work, "macros"), "w") as out:
    for k, v in macros.items():
        out.write(f"{k} {v}\n")
PY

defines=()
while read -r k v; do defines+=(--define "$k $v"); done <"$work/macros"
for s in "$work"/specs/*.spec; do
  rpmbuild -bb --quiet --define "_topdir $work/rpmbuild" "${defines[@]}" "$s" >"$s.log" 2>&1 ||
    { cat "$s" "$s.log" >&2; exit 1; }
  # The repo of the package: move what this spec built there.
  repo=$(cat "${s%.spec}.repo")
  dir=$(awk -v r="$repo" '$1 == r {print $2}' "$work/repo_dirs")
  mkdir -p "$root/$dir"
  mv "$work"/rpmbuild/RPMS/*/*.rpm "$root/$dir/"
done

while read -r repo dir key; do
  mkdir -p "$root/$dir"
  shopt -s nullglob
  rpms=("$root/$dir"/*.rpm)
  shopt -u nullglob
  if [ ${#rpms[@]} -gt 0 ]; then
    rpmsign --addsign --define "_gpg_name $key@gpunode.test" --define "_gpg_path $GNUPGHOME" --define "__gpg $(command -v gpg)" "${rpms[@]}" >/dev/null 2>&1
  fi
  createrepo_c --quiet "$root/$dir"
  if [ "$repo" = nvidia ]; then
    modifyrepo_c --mdtype=modules "$work/modules.yaml" "$root/$dir/repodata" >/dev/null
    cp "$work/nvidia.pub" "$root/$dir/D42D0685.pub"
  fi
done <"$work/repo_dirs"

mkdir -p /etc/pki/rpm-gpg
cp "$work/rocky.pub" "/etc/pki/rpm-gpg/RPM-GPG-KEY-Rocky-$major"

systemctl stop gpunode-el-repo.service 2>/dev/null || true
systemd-run --unit=gpunode-el-repo --quiet python3 -m http.server 8765 --bind 127.0.0.1 --directory "$root"
for _ in $(seq 1 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/nvidia/rhel$major/x86_64/repodata/repomd.xml')" 2>/dev/null && break
  sleep 0.2
done
# What a minimal install already has (bash, coreutils, dracut, kmod...): the roles find a base OS, not an empty rpmdb.
read -r -a base <"$work/base"
dnf -y -q install "${base[@]}" >"$work/base.log" 2>&1 || { cat "$work/base.log" >&2; exit 1; }
echo "served $(find "$root" -name '*.rpm' | wc -l) packages from $root on 127.0.0.1:8765; installed ${#base[@]} base packages"
