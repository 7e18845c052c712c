"""sitecustomize for ``hostcheck job``: every Python the job starts loads the hook (../job_hook.py) from here.

``hostcheck job`` puts this folder first on PYTHONPATH, so this module shadows any other sitecustomize; that
one (a venv's, the distribution's) is then found on the rest of sys.path and run, as site.py would have run it,
its errors reported by site.py in the same words. The hook is loaded by path under its own name, so the job's
environment needs no hostcheck. A failure to load the hook leaves the job as it was.
"""

import contextlib
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))


def _load_hook():
    import importlib.util

    path = os.path.join(os.path.dirname(_HERE), "job_hook.py")
    spec = importlib.util.spec_from_file_location("hostcheck_job_hook", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostcheck_job_hook"] = module
    spec.loader.exec_module(module)
    module.install()


def _chain():
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _load_hook()
except Exception as _exc:
    sys.modules.pop("hostcheck_job_hook", None)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"hostcheck job: the hook did not load ({_exc!r}); the job runs unobserved\n")
_chain()
