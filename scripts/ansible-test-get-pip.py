"""Offline stand-in for the get-pip.py that ansible-test downloads to bootstrap pip into each sanity venv.

ansible-test creates its sanity venvs without pip and runs the script it caches at
~/.ansible/test/cache/get_pip_<version>.py, fetched from ci-files.testing.ansible.com, a host CI cannot reach.
Its maintainers' workaround is to put the script at that path before the run (ansible/ansible#77304; the
download error names the path, #78146). scripts/sanity puts this file there instead: it installs the pip wheel
that Python bundles (ensurepip, no network), then runs that pip with ansible-test's arguments, which pin pip's
version (from the package index pip is configured with, as every other sanity requirement is installed).
"""

import subprocess
import sys

# get-pip.py's own options; pip install does not know them (setuptools and wheel are not installed anyway).
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
sys.exit(subprocess.run([sys.executable, "-m", "pip", "install", *args], check=False).returncode)
