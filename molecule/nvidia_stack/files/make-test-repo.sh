#!/bin/bash
# Builds a flat apt repo laid out like NVIDIA's (<base>/debian12/x86_64/{Packages,Release,InRelease,3bf863cc.pub})
# with two dummy cuda-toolkit-12-8 versions and DCGM 4 (core, cuda12), signed by a throwaway key, and plants a
# "retired" key in apt's legacy keyrings (a throwaway key stands in for 7fa2af80: nobody can mint a key with a chosen id).
# Prints the retired test key's id. Serves the repo on 127.0.0.1:8765 through a transient systemd unit.
set -euo pipefail
base=/srv/cuda-repo
repo=$base/debian12/x86_64
work=$(mktemp -d)
export GNUPGHOME=$work/gnupg
mkdir -p -m 0700 "$GNUPGHOME" "$repo"

gpg --batch --quiet --passphrase '' --quick-gen-key 'gpunode test repo <repo@gpunode.test>' ed25519 sign never
gpg --batch --quiet --passphrase '' --quick-gen-key 'gpunode retired key <retired@gpunode.test>' ed25519 sign never
signer=$(gpg --with-colons --list-keys repo@gpunode.test | awk -F: '/^fpr/ && !n++ {print $10}')
retired=$(gpg --with-colons --list-keys retired@gpunode.test | awk -F: '/^fpr/ && !n++ {print $10}')

gpg --armor --export "$signer" > "$repo/3bf863cc.pub"
# The retired key, as old installs left it: its own file in trusted.gpg.d and inside /etc/apt/trusted.gpg.
gpg --export "$retired" > /etc/apt/trusted.gpg.d/cuda-retired-test.gpg
# apt-key's legacy keyring is a plain binary OpenPGP keyring: the retired key beside one that must survive.
gpg --export "$retired" "$signer" > /etc/apt/trusted.gpg

for v in 12.8.0 12.8.1; do
  pkg=$work/cuda-toolkit-12-8_$v
  mkdir -p "$pkg/DEBIAN" "$pkg/usr/local/cuda-12.8/bin" "$pkg/usr/local/cuda-12.8/lib64"
  cat > "$pkg/DEBIAN/control" <<CONTROL
Package: cuda-toolkit-12-8
Version: $v-1
Architecture: amd64
Maintainer: gpunode tests <tests@gpunode.test>
Description: dummy CUDA toolkit $v for gpunode's molecule tests
CONTROL
  printf '#!/bin/sh\necho "Cuda compilation tools, release 12.8, V%s"\n' "$v" > "$pkg/usr/local/cuda-12.8/bin/nvcc"
  chmod 0755 "$pkg/usr/local/cuda-12.8/bin/nvcc"
  dpkg-deb --root-owner-group --build "$pkg" "$repo/cuda-toolkit-12-8_${v}-1_amd64.deb" >/dev/null
done

# DCGM 4 as NVIDIA's packaging names it (NVIDIA/DCGM cmake/packaging.cmake at 72fa3feaa67d716a75323a8f47c34ff3ee73f824):
# -core (dcgmi, nv-hostengine, nvidia-dcgm.service; Depends libc6 (>= 2.27), lshw) and -cuda12 (Depends -core of the
# same epoch:version; Provides datacenter-gpu-manager-4; Recommends libnuma1); epoch 1. Stub payloads.
dcgm=1:4.6.0-1
pkg=$work/dcgm-core
mkdir -p "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/lib/systemd/system"
cat > "$pkg/DEBIAN/control" <<CONTROL
Package: datacenter-gpu-manager-4-core
Version: $dcgm
Architecture: amd64
Depends: libc6 (>= 2.27), lshw
Conflicts: datacenter-gpu-manager
Maintainer: gpunode tests <tests@gpunode.test>
Description: dummy DCGM 4 core for gpunode's molecule tests
CONTROL
for b in dcgmi nv-hostengine; do
  printf '#!/bin/sh\necho "%s (gpunode test stub of DCGM): no GPU here" >&2\nexit 1\n' "$b" > "$pkg/usr/bin/$b"
  chmod 0755 "$pkg/usr/bin/$b"
done
cat > "$pkg/usr/lib/systemd/system/nvidia-dcgm.service" <<'UNIT'
[Unit]
Description=NVIDIA DCGM service
After=nvidia-gpu-reset.target
Wants=nvidia-gpu-reset.target

[Service]
User=root
PrivateTmp=false
Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
Alias=dcgm.service
WantedBy=multi-user.target
UNIT
dpkg-deb --root-owner-group --build "$pkg" "$repo/datacenter-gpu-manager-4-core_4.6.0-1_amd64.deb" >/dev/null
pkg=$work/dcgm-cuda12
mkdir -p "$pkg/DEBIAN"
cat > "$pkg/DEBIAN/control" <<CONTROL
Package: datacenter-gpu-manager-4-cuda12
Version: $dcgm
Architecture: amd64
Depends: datacenter-gpu-manager-4-core (= $dcgm)
Provides: datacenter-gpu-manager-4 (= $dcgm)
Recommends: libnuma1
Maintainer: gpunode tests <tests@gpunode.test>
Description: dummy DCGM 4 for CUDA 12 for gpunode's molecule tests
CONTROL
dpkg-deb --root-owner-group --build "$pkg" "$repo/datacenter-gpu-manager-4-cuda12_4.6.0-1_amd64.deb" >/dev/null

python3 - "$repo" <<'PY'
import hashlib, os, subprocess, sys, email.utils
repo = sys.argv[1]
stanzas = []
for deb in sorted(f for f in os.listdir(repo) if f.endswith(".deb")):
    path = os.path.join(repo, deb)
    data = open(path, "rb").read()
    control = subprocess.run(["dpkg-deb", "-f", path], check=True, capture_output=True, text=True).stdout.strip()
    stanzas.append(control + f"\nFilename: ./{deb}\nSize: {len(data)}\nMD5sum: {hashlib.md5(data).hexdigest()}"
                   f"\nSHA256: {hashlib.sha256(data).hexdigest()}\n")
packages = "\n".join(stanzas).encode()
open(os.path.join(repo, "Packages"), "wb").write(packages)
release = (f"Origin: gpunode-test\nLabel: gpunode-test\nArchitectures: amd64\n"
           f"Date: {email.utils.formatdate(usegmt=True)}\nSHA256:\n"
           f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n")
open(os.path.join(repo, "Release"), "w").write(release)
PY
gpg --batch --yes --local-user "$signer" --clearsign -o "$repo/InRelease" "$repo/Release"

systemd-run --unit=gpunode-test-repo --quiet python3 -m http.server 8765 --bind 127.0.0.1 --directory "$base"
for _ in $(seq 1 50); do
  python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8765/debian12/x86_64/InRelease")' 2>/dev/null && break
  sleep 0.2
done
rm -rf "$work"
echo "$retired"
