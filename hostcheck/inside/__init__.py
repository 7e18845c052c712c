"""Code that runs inside the training Python, started the one way: ``python -m hostcheck.inside.<module>`` with
hostcheck on PYTHONPATH (hostcheck.child.launch.inside_argv and inside_env); the job hook is loaded by the
sitecustomize of jobsite/ in every Python of the user's job instead.

Standard library, torch and PIL only, and nothing of hostcheck outside hostcheck.inside (tests/unit/test_structure.py
checks the imports). The orchestrator imports none of it but proof, the pure checks of what a bench worker reports.
"""
