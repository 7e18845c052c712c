"""``hostcheck sweep``: every node of a job measured against its peers, and the bad node or link named."""
