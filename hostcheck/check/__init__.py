"""``hostcheck check`` (also plain ``hostcheck``): check this node and print a readiness score (docs/hostcheck.md).

cli (the options and the run) -> hostcheck.gather (the snapshot) -> hostcheck.checks (the results) ->
hostcheck.score (the verdict) -> render (text, JSON, Prometheus, JUnit, the one-line summary).
"""
