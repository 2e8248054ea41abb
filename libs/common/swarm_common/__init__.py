"""Code shared by every Swarm service: the public contract and the plumbing around it."""
