"""The folder ``hostcheck job`` puts first on the job's PYTHONPATH: its sitecustomize.py loads the hook."""
