"""``hostcheck baseline``: record what a known-good node has as the [baseline] section of the configuration
(docs/baseline.md). ``cli`` is the command (its parser and run), ``record`` turns the node's inventory
(hostcheck.gather.inventory) into the section, ``toml`` writes it as TOML text and puts it into a configuration
file. The checks that compare a node with the section are hostcheck.checks.baseline.
"""
