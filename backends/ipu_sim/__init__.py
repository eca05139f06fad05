"""The simulated Graphcore-IPU-style backend: replicas, pipelining, 900 MB per chip, projected time-to-train."""
