"""Code that runs inside the training Python, started by path or with hostcheck on PYTHONPATH.

Standard library, torch and PIL only; nothing on the orchestrator side imports it.
"""
