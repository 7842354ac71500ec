"""A cluster on this host: LocalCluster (``pybk standalone``, ``make demo``) and the processes it runs."""
